"""
The shard groups of a remote executor: every shard's group (``shard-00``,
``shard-01``, ...) counted as the one group name ``shard`` (`register_groups`).
"""

from __future__ import annotations

from .. import snakemake_adapter as adapter
from ..planning.shards import SHARD_GROUP, shard_name
from .run import Run

__all__ = ["register_groups"]


def register_groups(workflow, run: Run) -> None:
    """
    Make every shard's group (``shard-00``, ``shard-01``, ...) count as the one group
    name "shard", so that a profile's `group-components: [shard=N]` makes one
    submission of up to N images of a shard (`adapter.share_group_name`: Snakemake
    keys --group-components by that parent name, as for groups written with
    wildcards).
    """
    names = {shard_name(i, run.n_shards) for i in range(run.n_shards)}
    adapter.share_group_name(
        workflow, sorted(names | set(run.shards.values())), SHARD_GROUP
    )
