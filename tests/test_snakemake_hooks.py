"""
multigeom_workflow.snakemake_adapter: the one module that touches Snakemake's
internals. No other module of the package reads one (a scan of their code); each
internal it uses still exists in the installed Snakemake (an upgrade that changes one
fails here: CI runs this file with the oldest and the newest Snakemake accepted), and
its small functions give the right values. The speed patches are off with one switch.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest

from multigeom_workflow import snakemake_adapter as hooks
from multigeom_workflow.on_snakemake.run import Run
from multigeom_workflow.planning.plan import plan_counts
from multigeom_workflow.settings.layout import Computation

#: Attributes of Snakemake's objects that only the adapter may read or write.
INTERNAL_ATTRIBUTES = {
    "parent_groupids",
    "overwrite_resources",
    "default_resources",
    "global_resources",
    "needrun_jobs",
    "RUN_INFO",
    "NOTHING_TO_BE_DONE_MSG",
    "cli_evaluator",
    "register_in_globals",
    "overwrite_function_params",
    "get_function_params",
    "queue_listener",
    "plugin_handlers",
    "logger_manager",
    "args_to_api",
    "workdir_init",
    "executor_plugin",
    "executor_settings",
    "resource_settings",
    "output_settings",
    "is_main_process",
    "remote_exec",
    "local_exec",
    "get_rule",
    "scheduler",
    "dag",
    "_IOFile",
    "mtime_uncached",
    "exists_local",
    "size_local",
    "is_evaluable",
    "is_fifo",
    "checksum",
    "load_configfile",
    "parse_config",
}
#: Snakemake's modules the workflow may import anywhere: its documented API.
PUBLIC_MODULES = {"snakemake.utils", "snakemake.exceptions", "snakemake.api"}


def attributes_read(path) -> set[str]:
    """The names read as attributes (``x.name``) or imported (``from m import name``)
    in the code of a module: strings and comments left out (Python's tokenizer)."""
    import io
    import tokenize

    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    out = set()
    for prev, tok in zip(tokens, tokens[1:], strict=False):
        if tok.type == tokenize.NAME and (
            (prev.type == tokenize.OP and prev.string == ".")
            or (prev.type == tokenize.NAME and prev.string == "import")
        ):
            out.add(tok.string)
    for i, tok in enumerate(tokens):  # from x import (a, b, c)
        if tok.type == tokenize.NAME and tok.string == "import":
            for t in tokens[i + 1 :]:
                if t.type == tokenize.NEWLINE:
                    break
                if t.type == tokenize.NAME:
                    out.add(t.string)
    return out


def snakemake_modules_imported(path) -> set[str]:
    """The ``snakemake.*`` modules a file imports (``import x``, ``from x import``)."""
    import re

    text = path.read_text()
    return set(re.findall(r"^\s*(?:from|import)\s+(snakemake(?:\.\w+)*)", text, re.M))


def test_only_the_adapter_touches_snakemake_internals():
    """No module of the workflow's packages but snakemake_adapter/, and no rule file
    or rule script, reads one of Snakemake's internal attributes or imports one of
    its modules outside the documented API (`PUBLIC_MODULES`); each internal the
    adapter uses is named in its INTERNALS."""
    from pathlib import Path

    import multigeom_workflow

    src = Path(multigeom_workflow.__file__).parent.parent
    repo = src.parent
    adapter_dir = Path(hooks.__file__).parent
    adapter_files = sorted(adapter_dir.glob("*.py"))
    files = [*sorted(src.rglob("*.py")), *sorted((repo / "scripts").glob("*.py"))]
    files += [*sorted((repo / "rules").glob("*.smk")), repo / "Snakefile"]
    offenders = {}
    for path in files:
        if path.parent == adapter_dir:
            continue
        used = attributes_read(path) & INTERNAL_ATTRIBUTES
        used |= snakemake_modules_imported(path) - PUBLIC_MODULES - {"snakemake"}
        if used:
            offenders[str(path.relative_to(repo))] = sorted(used)
    assert not offenders, offenders
    used = set().union(*(attributes_read(f) for f in adapter_files))
    used &= INTERNAL_ATTRIBUTES
    named = " ".join(hooks.INTERNALS)
    missing = sorted(n for n in used if n not in named and n != "dag")
    assert not missing, missing
    assert "workflow.dag.needrun_jobs" in hooks.INTERNALS


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
    assert isinstance(Workflow.workdir_init, property)


def test_the_executor_in_use_is_read_from_the_call_that_parses_the_workflow():
    """executor_from_command_line finds args_to_api's args.executor up the stack
    (Snakemake's command line parses the Snakefile inside it), None outside it."""
    assert hooks.executor_from_command_line() is None

    def parse():
        return hooks.executor_from_command_line()

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
    hooks._settle_constant_resources(rule)
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

    hooks._settle_resource_evaluation()

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
            hooks.idle_logger_plugin_off(SimpleNamespace(logger_manager=m), LogHandler)
            is expected
        )
        queued = [h for h in m.logger.handlers if isinstance(h, QueueHandler)]
        assert len(queued) == (0 if expected else 1)
        assert len(m.logger.handlers) == (1 if expected else 2)  # the rest stays
    assert hooks.idle_logger_plugin_off(SimpleNamespace(), LogHandler) is False


def scenario(n_images=4, ceiling_images=1, configs=(("a", "V1"), ("b", "V1"))):
    return SimpleNamespace(
        n_images=n_images,
        ceiling_images=ceiling_images,
        configurations=[SimpleNamespace(encoder=e, area=a) for e, a in configs],
    )


def test_plan_counts_reads_the_planned_jobs():
    planned = [
        Computation("b", "V1", 3),
        Computation("a", "V1", 2),
        Computation("a", "V1", 0, ceiling=True),
        Computation("a", "V1", 0),
    ]
    done, ceiling, pending = plan_counts(scenario(), planned)
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
    run = Run(scenario=scenario(), shards={(("a", "V1"), 0): "shard-00"})
    run.n_shards = n_shards
    assert run.shard_of("a", "V1", 0) == "shard-00"
    assert run.shard_of("a", "V1", index) == expected


def test_the_planning_views_internals_exist_as_used():
    """`snakemake_adapter.show_snakemake` wraps three coroutine methods of
    Snakemake's file class, calls them with these parameters, reads `file` and
    builds the interface's `Mtime(local=...)`."""
    import asyncio

    import snakemake.api  # noqa: F401
    from snakemake.io import _IOFile
    from snakemake_interface_storage_plugins.io import Mtime

    from multigeom_workflow import snakemake_adapter as adapter

    for name, params in (
        ("exists_local", ["self"]),
        ("mtime_uncached", ["self", "skip_storage"]),
        ("size_local", ["self"]),
        ("checksum", ["self", "threshold", "force"]),
    ):
        method = getattr(_IOFile, name)
        assert asyncio.iscoroutinefunction(method), name
        assert list(inspect.signature(method).parameters)[: len(params)] == params
        assert f"snakemake.io._IOFile.{name}" in adapter.INTERNALS
    assert list(inspect.signature(_IOFile.is_fifo).parameters) == ["self"]
    assert not asyncio.iscoroutinefunction(_IOFile.is_fifo)
    assert list(inspect.signature(_IOFile.__new__).parameters)[:3] == [
        "cls",
        "file",
        "rule",
    ]
    assert isinstance(_IOFile.file, property)
    assert Mtime(local=12.5).local_or_storage(follow_symlinks=True) == 12.5


def test_the_run_s_facts_and_settings_exist_on_snakemake_s_workflow():
    """What `facts`, `given_resources`, `slurm_status_command`,
    `submit_dir`, `limit_local_gpus` and `planned_jobs` read of the workflow object
    and its jobs is there in the installed Snakemake, and a value of set-resources
    is read as written (`Resource.raw`: a placeholder ``SET-...`` is never lost to
    an evaluation)."""
    import snakemake.api  # noqa: F401
    from snakemake.iocontainers import Namedlist
    from snakemake.resources import Resource, Resources
    from snakemake.settings.types import ResourceSettings
    from snakemake.workflow import Workflow

    source = inspect.getsource(Workflow)
    declared = {f.name for f in dataclasses.fields(Workflow)}
    for name in (
        "output_settings",
        "is_main_process",
        "remote_exec",
        "local_exec",
        "resource_settings",
        "executor_settings",
        "workdir_init",
        "basedir",
        "dag",
        "scheduler",
    ):
        assert (
            name in declared or f"def {name}(" in source or f"self.{name} =" in source
        ), name
    fields = {f.name for f in dataclasses.fields(ResourceSettings)}
    assert {"default_resources", "overwrite_resources", "resources"} <= fields
    assert callable(Namedlist.items)
    account = Resource.from_cli_expression("slurm_account", "SET-your-account")
    assert account.raw == "SET-your-account" and account.is_evaluable()
    assert Resource("mem_mb", 16000).value == 16000
    settings = ResourceSettings(
        cores=2,
        nodes=None,
        resources=Resources({"gpu": Resource("gpu", 2)}),
        overwrite_resources={"estimate_image": Resources({"slurm_account": account})},
        default_resources=Resources(
            {"mem_mb": Resource.from_cli_expression("mem_mb", "'8000'")}
        ),
    )
    given = hooks.given_resources(SimpleNamespace(resource_settings=settings))
    assert given.per_rule == {"estimate_image": {"slurm_account": "SET-your-account"}}
    assert given.default == {"mem_mb": "8000"}
    assert given.limits == {"gpu": 2}
    assert given.of_rule("estimate_image", "mem_mb") == "8000"


def test_planned_jobs_reads_the_dag_s_jobs_to_run():
    jobs = [
        SimpleNamespace(
            rule=SimpleNamespace(name=rule),
            wildcards=SimpleNamespace(items=lambda w=w: iter(w.items())),
        )
        for rule, w in (
            ("estimate_image", {"encoder": "a", "area": "V1", "index": "0003"}),
            ("align_configs", {}),
        )
    ]
    workflow = SimpleNamespace(dag=SimpleNamespace(needrun_jobs=lambda: jobs))
    assert hooks.planned_jobs(workflow, ["estimate_image"]) == [
        ("estimate_image", {"encoder": "a", "area": "V1", "index": "0003"})
    ]
    assert hooks.planned_jobs(SimpleNamespace(), ["estimate_image"]) == []


def test_a_resource_evaluator_with_an_unknown_parameter_settles_nothing(monkeypatch):
    """`Resource.cli_evaluator`'s parameters in this Snakemake are known ones
    (9.19: input, attempt, threads, async_run; 9.27: wildcards too); one more, even
    defaulted (a new minor release), could make a value depend on its job:
    nothing is then settled, and Snakemake evaluates every job's resources itself."""
    import snakemake.api  # noqa: F401
    from snakemake.resources import Resource, Resources

    arguments = hooks._cli_evaluator_arguments()
    assert arguments is not None
    assert {"input", "attempt", "async_run"} <= set(arguments)

    def newer(name, val, *, input, attempt, async_run, wildcards=None, node=None):
        return val

    monkeypatch.setattr(Resource, "cli_evaluator", staticmethod(newer))
    assert hooks._cli_evaluator_arguments() is None
    rule = SimpleNamespace(
        resources=Resources({"mem_mb": Resource.from_cli_expression("mem_mb", "16000")})
    )
    hooks._settle_constant_resources(rule)
    assert rule.resources["mem_mb"].is_evaluable()


def test_the_speed_patches_are_off_with_one_switch(monkeypatch):
    """``MULTIGEOM_SPEED_PATCHES=off``: no garbage-collector threshold, no recorded
    signature, no settled resource, the logger's queue kept."""
    import gc

    import snakemake.api  # noqa: F401
    from snakemake.common import FUNC_OVERWRITE_PARAMS_ATTR
    from snakemake.resources import Resource, Resources

    monkeypatch.setenv(hooks.SPEED_ENV, "off")
    assert not hooks.speed_patches_on()
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        assert hooks.fewer_collections() is False
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*saved)

    def func(wildcards):
        return 1

    assert hooks.record_signature(func) is False
    assert not hasattr(func, FUNC_OVERWRITE_PARAMS_ATTR)
    rule = SimpleNamespace(
        name="estimate_image",
        input=[],
        resources=Resources({"mem_mb": Resource.from_cli_expression("mem_mb", "16")}),
    )
    workflow = SimpleNamespace(get_rule=lambda name: rule)
    assert hooks.settle_rules(workflow, ["estimate_image"]) is False
    assert rule.resources["mem_mb"].is_evaluable()
    assert hooks.idle_logger_plugin_off(SimpleNamespace(), object) is False
    monkeypatch.setenv(hooks.SPEED_ENV, "on")
    assert hooks.settle_rules(workflow, ["estimate_image"]) is True
    assert not rule.resources["mem_mb"].is_evaluable()


def test_a_command_that_runs_no_job_is_an_inspection():
    """`inspection_only` reads the command Snakemake's command line runs (args_to_api's
    args, up the stack): ``--summary`` and kin are, a run and ``--report
    --report-after-run`` are not; outside the command line, False. Each command it
    names is one of Snakemake's own arguments."""
    import snakemake.cli

    assert hooks.inspection_only() is False

    def parse():
        return hooks.inspection_only()

    namespace = {"__name__": "snakemake.cli", "parse": parse}
    exec("def args_to_api(args, parser):\n    return parse()\n", namespace)
    call = namespace["args_to_api"]
    assert call(SimpleNamespace(summary=True), None) is True
    assert call(SimpleNamespace(report="r.html", report_after_run=False), None)
    assert call(SimpleNamespace(report="r.html", report_after_run=True), None) is False
    assert call(SimpleNamespace(summary=False, dryrun=False), None) is False
    source = inspect.getsource(snakemake.cli.args_to_api)
    missing = [n for n in hooks.INSPECTING_COMMANDS if f"args.{n}" not in source]
    assert missing == [], missing


def test_config_files_and_values_are_read_as_snakemake_reads_them(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("n_images: 4\nmodal: {gpu: T4}\n")
    assert hooks.read_config_file(str(f)) == {"n_images": 4, "modal": {"gpu": "T4"}}
    assert hooks.read_config_values(["n_images=4", "modal={gpu: T4}"]) == {
        "n_images": 4,
        "modal": {"gpu": "T4"},
    }
