"""
multigeom_workflow.snakemake_hooks: the one module that acts on the running Snakemake.
Each Snakemake internal it uses still exists in the installed Snakemake (an upgrade
that changes one fails here), and its small functions give the right values.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest

from multigeom_workflow import snakemake_hooks as hooks


def test_every_internal_in_use_is_named():
    """The module's source uses no Snakemake attribute that INTERNALS does not name."""
    source = inspect.getsource(hooks)
    for needle in (
        "parent_groupids",
        "overwrite_resources",
        "global_resources",
        "needrun_jobs",
        "RUN_INFO",
    ):
        assert needle in source
        assert any(needle in name for name in hooks.INTERNALS), needle


def test_the_internals_exist_in_the_installed_snakemake():
    import snakemake.api  # noqa: F401  (first, as the CLI: it imports the rest in order)
    from snakemake.common import NOTHING_TO_BE_DONE_MSG
    from snakemake.dag import DAG
    from snakemake.logging import logger
    from snakemake.rules import Rule
    from snakemake.scheduling.job_scheduler import JobScheduler
    from snakemake.settings.types import ResourceSettings
    from snakemake.workflow import Workflow
    from snakemake_interface_logger_plugins.common import LogEvent

    assert isinstance(Workflow.parent_groupids, property)
    assert callable(Workflow.get_rule)
    fields = {f.name for f in dataclasses.fields(ResourceSettings)}
    assert {"overwrite_resources", "resources", "cores", "nodes"} <= fields
    init = inspect.getsource(JobScheduler.__init__)
    assert "self.global_resources" in init and "self.resources" in init
    assert callable(DAG.needrun_jobs)
    assert "resources" in inspect.getsource(Rule)
    assert LogEvent.RUN_INFO.value
    assert NOTHING_TO_BE_DONE_MSG.startswith("Nothing to be done")
    assert logger.name == "snakemake.logging"
    # the statistics are logged once the plan is built, in a dry run too
    execute = inspect.getsource(Workflow.execute)
    assert "event=LogEvent.RUN_INFO" in execute and "# the dryrun case" in execute


def scenario(n_images=4, ceiling_images=1, configs=(("a", "V1"), ("b", "V1"))):
    return SimpleNamespace(
        n_images=n_images,
        ceiling_images=ceiling_images,
        configurations=[SimpleNamespace(encoder=e, area=a) for e, a in configs],
    )


def test_plan_counts_reads_the_planned_jobs():
    planned = [
        ("estimate_image", ("b", "V1"), 3),
        ("estimate_image", ("a", "V1"), 2),
        ("estimate_image_ceiling", ("a", "V1"), 0),
        ("estimate_image", ("a", "V1"), 0),
    ]
    done, ceiling, pending = hooks.plan_counts(scenario(), planned)
    assert done == {("a", "V1"): (2, 4), ("b", "V1"): (3, 4)}
    assert ceiling == {("a", "V1"): (0, 1), ("b", "V1"): (1, 1)}
    # both estimates of an image are one image for the shards
    assert pending == [(("a", "V1"), 0), (("a", "V1"), 2), (("b", "V1"), 3)]


@pytest.mark.parametrize(
    ("n_shards", "index", "expected"),
    [(0, 7, "shard"), (3, 7, "shard-01"), (12, 7, "shard-07"), (3, 2, "shard-02")],
)
def test_a_job_planned_that_was_not_missing_spreads_over_the_shards(
    n_shards, index, expected
):
    run = hooks.Run(scenario=scenario(), shards={(("a", "V1"), 0): "shard-00"})
    run.n_shards = n_shards
    assert run.shard_of("a", "V1", 0) == "shard-00"
    assert run.shard_of("a", "V1", index) == expected
