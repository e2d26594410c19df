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
        "cli_evaluator",
        "register_in_globals",
        "overwrite_function_params",
        "queue_listener",
        "plugin_handlers",
        "Resource.evaluate",
        "args_to_api",
        "workdir_init",
        "executor_plugin",
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
    from snakemake.common import overwrite_function_params  # noqa: F401
    from snakemake.logging import LoggerManager

    assert "logger_manager" in inspect.getsource(Workflow)
    manager = inspect.getsource(LoggerManager.__init__)
    assert "self.queue_listener" in manager and "self.plugin_handlers" in manager
    assert "QueueHandler(self._queue)" in inspect.getsource(LoggerManager)
    # the statistics are logged once the plan is built, in a dry run too
    execute = inspect.getsource(Workflow.execute)
    assert "event=LogEvent.RUN_INFO" in execute and "# the dryrun case" in execute
    # the command line parses the Snakefile inside args_to_api(args, parser) (its
    # DAG API), whose args.executor names the intended executor (a dry run is a
    # pseudo_executor) when it does
    from snakemake.cli import args_to_api

    to_api = inspect.getsource(args_to_api)
    assert "args.executor" in to_api
    assert to_api.index(".dag(") < to_api.index("execute_workflow(")
    assert isinstance(Workflow.executor_plugin, property)
    assert isinstance(Workflow.workdir_init, property)


def test_the_executor_in_use_is_read_from_the_call_that_parses_the_workflow():
    """executor_in_use finds args_to_api's args.executor up the stack (Snakemake's
    command line parses the Snakefile inside it), None outside it."""
    assert hooks.executor_in_use() is None

    def parse():
        return hooks.executor_in_use()

    namespace = {"__name__": "snakemake.cli", "parse": parse}
    exec("def args_to_api(args, parser):\n    return parse()\n", namespace)
    args = SimpleNamespace(executor="slurm")
    assert namespace["args_to_api"](args, None) == "slurm"


def test_constant_set_resources_are_evaluated_once_to_snakemake_s_value():
    """A profile's set-resources that read nothing of the job become plain values,
    equal to Snakemake's own evaluation; those that read the job stay expressions."""
    import tempfile

    import snakemake.api  # noqa: F401  (first, as the CLI does)
    from snakemake.iocontainers import Wildcards
    from snakemake.resources import Resource, Resources

    given = {
        "mem_mb": "16000",
        "slurm_partition": "SET-your-gpu-partition",
        "slurm_account": "'lab'",
        "mpi": '""',
        "cpus_per_gpu": "2 * 2",
        "runtime": "60 * attempt",
        "tmpdir": "system_tmpdir",
        "slurm_extra": "wildcards.encoder",
        "bad": "1 / 0",
    }
    rule = SimpleNamespace(
        resources=Resources(
            {k: Resource.from_cli_expression(k, v) for k, v in given.items()}
        )
    )
    wildcards = Wildcards(fromdict={"encoder": "inception"})

    def snakemake_value(res, attempt=1):  # as Snakemake evaluates a job's resource
        return res.evaluate(
            wildcards=wildcards,
            input=(),
            attempt=attempt,
            threads=1,
            rulename="estimate_image",
            async_run=None,
        ).value

    before = {k: snakemake_value(r) for k, r in rule.resources.items() if k != "bad"}
    hooks.settle_constant_resources(rule)
    settled = {k for k, r in rule.resources.items() if not r.is_evaluable()}
    assert settled == {
        "mem_mb",
        "slurm_partition",
        "slurm_account",
        "mpi",
        "cpus_per_gpu",
        "tmpdir",
    }
    after = {k: snakemake_value(r) for k, r in rule.resources.items() if k != "bad"}
    assert after == before
    assert after["mem_mb"] == 16000 and after["mpi"] == ""
    assert after["slurm_partition"] == "SET-your-gpu-partition"
    assert after["tmpdir"] == tempfile.gettempdir()
    assert snakemake_value(rule.resources["runtime"], attempt=2) == 120
    assert rule.resources["bad"].is_evaluable()  # its error stays Snakemake's


def test_resource_evaluation_reads_its_signature_once(monkeypatch):
    """Once settled, Snakemake's evaluation of a job's resource no longer calls
    inspect.signature on Resource.evaluate, passes it the same parameters as before,
    and a resource function still gets only the parameters it names."""
    import snakemake.api  # noqa: F401  (first, as the CLI does)
    from snakemake.common import (
        FUNC_OVERWRITE_PARAMS_ATTR,
        get_function_params,
        get_input_function_aux_params,
    )
    from snakemake.iocontainers import Wildcards
    from snakemake.resources import Resource

    monkeypatch.delattr(Resource.evaluate, FUNC_OVERWRITE_PARAMS_ATTR, raising=False)
    runtime = Resource("runtime", lambda wildcards, attempt: 60 * attempt)
    # what Rule.apply_input_function offers a resource's evaluate (rules.py)
    offered = {"input": (), "attempt": 2, "threads": 1, "rulename": "estimate_image"}
    before = dict(get_function_params(runtime.evaluate))
    assert set(before) == {"args", "kwargs"}
    assert get_input_function_aux_params(runtime.evaluate, offered) == offered

    hooks.settle_resource_evaluation()

    def no_signature(*args, **kwargs):
        raise AssertionError("inspect.signature called")

    monkeypatch.setattr(inspect, "signature", no_signature)
    fresh = Resource("runtime", lambda wildcards, attempt: 60 * attempt)
    assert dict(get_function_params(fresh.evaluate)) == before
    assert get_input_function_aux_params(fresh.evaluate, offered) == offered
    monkeypatch.undo()  # the resource function's own signature is read as before
    wildcards = Wildcards(fromdict={"encoder": "inception"})
    assert fresh.evaluate(wildcards, **offered).value == 120


def test_the_garbage_collector_runs_less_often_never_more():
    """fewer_collections raises each threshold to GC_THRESHOLDS and keeps a higher
    one already set."""
    import gc

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        hooks.fewer_collections()
        assert gc.get_threshold() == hooks.GC_THRESHOLDS == (50_000, 20, 20)
        gc.set_threshold(100_000, 5, 50)
        hooks.fewer_collections()
        assert gc.get_threshold() == (100_000, 20, 50)
    finally:
        gc.set_threshold(*saved)


def test_an_idle_multigeom_logger_plugin_loses_its_queue_in_a_dry_run():
    """In a dry run the workflow's own logger plugin has nothing to do: Snakemake's
    queue to it leaves the logger; with another plugin beside it, or in a real run,
    the queue stays."""
    import logging
    import queue
    from logging.handlers import QueueHandler, QueueListener

    from snakemake_logger_plugin_multigeom import LogHandler

    def manager(dryrun, other=False):
        q = queue.Queue()
        ours = LogHandler(SimpleNamespace(stdout=False, dryrun=dryrun), None)
        plugins = [ours, logging.NullHandler()] if other else [ours]
        log = logging.getLogger(f"test-idle-{dryrun}-{other}")
        log.handlers[:] = [logging.NullHandler(), QueueHandler(q)]
        listener = QueueListener(q, *plugins)
        return SimpleNamespace(
            logger=log, queue_listener=listener, plugin_handlers=plugins
        )

    for dryrun, other, expected in (
        (True, False, True),
        (True, True, False),
        (False, False, False),
    ):
        m = manager(dryrun, other)
        assert (
            hooks.idle_logger_plugin_off(SimpleNamespace(logger_manager=m)) is expected
        )
        queued = [h for h in m.logger.handlers if isinstance(h, QueueHandler)]
        assert len(queued) == (0 if expected else 1)
        assert len(m.logger.handlers) == (1 if expected else 2)  # the rest stays
    assert hooks.idle_logger_plugin_off(SimpleNamespace()) is False  # no manager


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


def test_the_planning_views_internals_exist_as_used():
    """`on_snakemake.adapter.show_snakemake` wraps three coroutine methods of
    Snakemake's file class, calls them with these parameters, reads `file` and
    builds the interface's `Mtime(local=...)`."""
    import asyncio

    import snakemake.api  # noqa: F401
    from snakemake.io import _IOFile
    from snakemake_interface_storage_plugins.io import Mtime

    from multigeom_workflow.on_snakemake import adapter

    for name, params in (
        ("exists_local", ["self"]),
        ("mtime_uncached", ["self", "skip_storage"]),
        ("size_local", ["self"]),
    ):
        method = getattr(_IOFile, name)
        assert asyncio.iscoroutinefunction(method), name
        assert list(inspect.signature(method).parameters) == params, name
        assert f"snakemake.io._IOFile.{name}" in adapter.INTERNALS
    assert isinstance(_IOFile.file, property)
    assert Mtime(local=12.5).local_or_storage(follow_symlinks=True) == 12.5
    for name in adapter.INTERNALS:
        assert name in hooks.INTERNALS
