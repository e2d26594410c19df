"""
Shards: how the per-image computations left are split into Snakemake groups, so that a
remote executor (Modal) runs one shard per submission and loads the models once per
shard instead of once per image.

The rules are those of the old notebook helper's ``make_shards``
(``multigeom.pipeline.distribute``): at most ``num_shards`` shards, every
(configuration, image) left in exactly one, sizes differing by at most one image,
images already done left out. A shard is a run of consecutive images in the order
(configuration, image index), so it holds one configuration, or two or more where that
keeps the sizes balanced. Local runs ignore groups (Snakemake runs group members as
separate jobs).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

__all__ = ["SHARD_GROUP", "make_shards", "num_shards", "shard_groups", "shard_name"]

T = TypeVar("T")

#: The name every shard's group is known by to ``--group-components``: the profile's
#: ``group-components: [shard=...]`` applies to each shard (``shard-00``, ...).
SHARD_GROUP = "shard"


def shard_name(index: int, n_shards: int) -> str:
    """
    The name of shard `index` of `n_shards`: its group's (``shard-00``, ...),
    zero-padded to at least two digits so that names sort in shard order; the one
    place it is made (groups, SLURM's and Modal's lines, the dry run).
    """
    width = max(2, len(str(max(n_shards, 1) - 1)))
    return f"{SHARD_GROUP}-{int(index):0{width}d}"


def make_shards(pending: Sequence[T], num_shards: int) -> list[list[T]]:
    """
    Split the computations left into balanced runs of consecutive items.

    Parameters
    ----------
    pending : sequence
        The (configuration, image) computations left, in the order (configuration,
        image index).
    num_shards : int
        Most shards wanted (e.g. Modal containers at once); at least 1.

    Returns
    -------
    list of list
        ``min(num_shards, len(pending))`` shards, each non-empty, in order; their
        concatenation is ``pending``; sizes differ by at most one
        (``numpy.array_split``).

    Raises
    ------
    ValueError
        If ``num_shards`` < 1.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    n = min(num_shards, len(pending))
    if n == 0:
        return []
    items = list(pending)
    return [[items[i] for i in part] for part in np.array_split(range(len(items)), n)]


def num_shards(setting: int | str, nodes: int | None) -> int:
    """
    Shards of a run: the config key ``shards``, or for ``auto`` the number of jobs
    Snakemake runs at once on a remote executor (``--jobs``), else 1.
    """
    if setting != "auto":
        return int(setting)
    if nodes is None or nodes == sys.maxsize or nodes < 1:
        return 1
    return int(nodes)


def shard_groups(pending: Sequence[T], num_shards: int) -> dict[T, str]:
    """
    The group name of every computation left: ``shard-00``, ``shard-01``, ...

    Parameters
    ----------
    pending : sequence
        As for :func:`make_shards`; items must be hashable.
    num_shards : int
        As for :func:`make_shards`.

    Returns
    -------
    dict
        Item -> group name; names are zero-padded to sort in shard order.
    """
    shards = make_shards(pending, num_shards)
    return {
        item: shard_name(i, len(shards))
        for i, shard in enumerate(shards)
        for item in shard
    }
