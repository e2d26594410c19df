"""Shards: balanced Snakemake groups of the per-image computations left."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import run_snakemake

from multigeom_workflow.planning.shards import make_shards, num_shards, shard_groups


def check_shard_rules(pending, num, shards):
    """The old helper's make_shards rules, checked independently of the code."""
    assert len(shards) == min(num, len(pending))
    assert all(shards), "empty shard"
    assert [x for s in shards for x in s] == list(pending)  # each once, in order
    sizes = [len(s) for s in shards]
    if sizes:
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("n_configs", "n_images", "num", "done"),
    [
        (4, 200, 10, set()),  # the paper on 10 Modal containers: 80 per shard
        (4, 8, 3, set()),  # 32 images: 11, 11, 10
        (2, 5, 4, {(0, 0), (0, 1), (1, 4)}),  # done images left out
        (1, 3, 8, set()),  # more shards wanted than images: one image each
        (3, 4, 1, {(2, 3)}),  # one shard: everything left
        (2, 2, 5, {(0, 0), (0, 1), (1, 0), (1, 1)}),  # nothing left: no shard
    ],
)
def test_make_shards_follows_the_helper_rules(n_configs, n_images, num, done):
    pending = [
        (c, i) for c in range(n_configs) for i in range(n_images) if (c, i) not in done
    ]
    shards = make_shards(pending, num)
    check_shard_rules(pending, num, shards)
    assert not done & {x for s in shards for x in s}


def test_known_split_of_32_images_in_3_shards():
    pending = [(c, i) for c in "abcd" for i in range(8)]
    shards = make_shards(pending, 3)
    assert [len(s) for s in shards] == [11, 11, 10]
    assert shards[0][-1] == ("b", 2) and shards[1][0] == ("b", 3)


def test_shard_groups_names_sort_in_shard_order():
    groups = shard_groups(list(range(25)), 12)
    names = sorted(set(groups.values()))
    assert names == [f"shard-{i:02d}" for i in range(12)]
    assert [groups[i] for i in range(25)] == sorted(groups[i] for i in range(25))


def test_num_shards_auto_is_jobs_at_once():
    assert num_shards("auto", 10) == 10
    assert num_shards("auto", None) == 1
    assert num_shards("auto", sys.maxsize) == 1
    assert num_shards(4, 10) == 4
    with pytest.raises(ValueError, match="at least 1"):
        make_shards([1, 2], 0)


def planned_groups(text: str) -> dict[str, list[str]]:
    """Per-image outputs of each group job in a dry run's listing."""
    groups, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Group job (\S+)", line)
        if m:
            current = m.group(1)
        m = re.search(r"output: (runs/per_image/\S+\.pt)", line)
        if m and current:
            groups.setdefault(current, []).append(m.group(1))
    return groups


def test_remote_dry_run_plans_the_shards_of_its_plan_without_groups(tiny_copy):
    """
    On a remote executor with the Modal profile's group-components, a dry run forms
    no group jobs (grouping 40,000 jobs costs Snakemake minutes, and a dry run submits
    nothing): its estimate makes the shards of Snakemake's plan itself, balanced,
    images already done left out. (Real runs group: tests/test_modal.py,
    tests/test_slurm.py.)
    """
    done = ["runs/per_image/onoff/complex/img0000.pt"]
    for f in tiny_copy.glob("runs/per_image/*/*/img*.pt"):
        if f.relative_to(tiny_copy).as_posix() not in done:
            f.unlink()
    result = run_snakemake(
        tiny_copy,
        "-n",
        "--executor",
        "modal",
        "--jobs",
        "3",
        "--group-components",
        "shard=100000",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_groups(result.stdout + result.stderr) == {}
    # 7 images in 3 shards of 3, 2, 2 in configuration order: onoff/complex 1 and
    # smallcnn/complex 0, 1; onoff/simple 0, 1; smallcnn/simple 0, 1: 4 start-ups.
    assert (
        "start-up 15 s x 4 (upstream's figure; one per shard and configuration, "
        "3 shard(s))"
    ) in result.stderr


def test_a_shard_s_name_is_made_in_one_place():
    from multigeom_workflow.planning.shards import shard_groups, shard_name

    assert [shard_name(i, 10) for i in (0, 3, 9)] == [
        "shard-00",
        "shard-03",
        "shard-09",
    ]
    assert shard_name(5, 101) == "shard-005" and shard_name(0, 0) == "shard-00"
    groups = shard_groups(list(range(12)), 11)
    assert sorted(set(groups.values())) == [shard_name(i, 11) for i in range(11)]
