"""
The one module that touches Snakemake's internals.

It sits in the package's lowest layer (it imports nothing of the workflow), so that
every part may call it: `multigeom_workflow.on_snakemake` (what the workflow does to
the running Snakemake), `multigeom_workflow.settings.load` (a config read as
Snakemake reads it).

Everything the workflow reads of or writes to the running Snakemake that is not in
its documented API (the Snakefile's ``workflow`` object beyond ``basedir``, its DAG,
scheduler, logger, resource classes and file class) goes through a function here, and
each attribute or private name used is listed in `INTERNALS` with its use;
tests/test_snakemake_hooks.py checks each against the installed Snakemake, and CI runs
that file with the oldest and the newest Snakemake the package accepts. The other
modules call these functions with the ``workflow`` object and never read it
themselves (a scan in tests/test_snakemake_hooks.py fails when one does).

Three kinds of use:

- reading the run: `facts`, `given_resources`, `executor_from_command_line`,
  `inspection_only`, `read_config_file`, `read_config_values`,
  `executor_name`, `slurm_status_command`, `submit_dir`, `resources_in_force`,
  `planned_jobs`, `when_plan_built`;
- acting on it: `share_group_name` (shard groups), `limit_local_gpus`,
  `read_recorded_params_as` (older runs' params records read in canonical form),
  `share_resources` (the ceiling's rule takes the per-image rule's set-resources),
  `show_snakemake` (a dry run's view of the files a real run would change);
- speed patches, each saving seconds at 40,000 jobs and none changing what Snakemake
  computes, all behind one switch (`SPEED_ENV`; `speed_patches_on`):
  `fewer_collections`, `settle_rules`, `record_signature`, `idle_logger_plugin_off`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "GC_THRESHOLDS",
    "INTERNALS",
    "SPEED_ENV",
    "Facts",
    "GivenResources",
    "executor_from_command_line",
    "executor_name",
    "facts",
    "fewer_collections",
    "given_resources",
    "idle_logger_plugin_off",
    "limit_local_gpus",
    "planned_jobs",
    "read_recorded_params_as",
    "record_signature",
    "resources_in_force",
    "settle_rules",
    "share_group_name",
    "share_resources",
    "show_snakemake",
    "slurm_status_command",
    "speed_patches_on",
    "submit_dir",
    "when_plan_built",
]

#: The Snakemake internals used here (Snakemake 9.19 to 9.27, the versions CI
#: tests), each with its use; tests/test_snakemake_hooks.py checks that each still
#: exists as used.
INTERNALS = {
    "workflow.output_settings.dryrun": "a dry run (facts)",
    "workflow.is_main_process": "not a job's own Snakemake (facts)",
    "workflow.remote_exec": "a job's Snakemake in a remote allocation (facts)",
    "workflow.local_exec": "jobs run on this machine (facts)",
    "workflow.resource_settings.cores": "--cores (facts)",
    "workflow.resource_settings.nodes": "--jobs of a remote executor (facts)",
    "workflow.resource_settings.resources": "--resources (given_resources)",
    "workflow.resource_settings.overwrite_resources": "a profile's set-resources",
    "workflow.resource_settings.default_resources": "a profile's default-resources",
    "Resource.raw": "a set-resources value as written",
    "Resource.value": "a resource's value once evaluated",
    "Resource.is_evaluable": "a resource that reads its job",
    "Resource.cli_evaluator": "set-resources that read nothing of the job, once",
    "Resource.evaluate": "its signature recorded once (settle_rules)",
    "snakemake.resources.Resources": "a rule's resources (share_resources)",
    "workflow.get_rule": "a rule by name",
    "rule.resources": "the ceiling's rule shares estimate_image's set-resources",
    "rule.input": "a rule's input functions (settle_rules)",
    "snakemake.common.overwrite_function_params": "input functions' signatures, once",
    "snakemake.common.get_function_params": "the signature Snakemake reads",
    "snakemake.ioutils.register_in_globals": "names a resource expression may read",
    "workflow.parent_groupids": "shard groups counted as one name (share_group_name)",
    "workflow.scheduler.global_resources": "the gpu limit of a local run",
    "workflow.scheduler.resources": "the same limit, as the scheduler counts it",
    "workflow.executor_settings.status_command": "the SLURM plugin's status query",
    "workflow.executor_plugin": "the executor in use, at onstart",
    "workflow.workdir_init": "the working directory the SLURM plugin submits from",
    "workflow.dag.needrun_jobs": "the per-image jobs Snakemake will run",
    "job.rule.name, job.wildcards": "a planned job's rule and wildcards",
    "snakemake.logging.logger RUN_INFO record": "the moment the plan is built",
    "snakemake.common.NOTHING_TO_BE_DONE_MSG": "the plan is empty",
    "snakemake.cli.args_to_api(args): args.executor": (
        "the executor in use, at parse time (executor_from_command_line)"
    ),
    "workflow.logger_manager.queue_listener": "the queue to the logger plugins",
    "workflow.logger_manager.plugin_handlers": "the logger plugins (idle ones)",
    "workflow.logger_manager.logger": "the logger the queue hangs on",
    "snakemake.io._IOFile.exists_local": "a file as a real run leaves it (exists)",
    "snakemake.io._IOFile.mtime_uncached": "a file as a real run leaves it (date)",
    "snakemake.io._IOFile.size_local": "a file as a real run leaves it (size)",
    "snakemake.io._IOFile.file": "the path a rule's file names",
    "snakemake.io._IOFile.is_fifo": "a file put back by a real run (its kind)",
    "snakemake.io._IOFile.checksum": "a file put back by a real run (its content)",
    "snakemake.io._IOFile(file, rule=)": "the file a put-back one is read from",
    "snakemake.cli.args_to_api(args): args.<command>": (
        "a command that only inspects (inspection_only)"
    ),
    "snakemake.common.configfile.load_configfile": "a config file as Snakemake reads",
    "snakemake.persistence.PersistenceBase.params": (
        "older runs' recorded params read in canonical form (read_recorded_params_as)"
    ),
    "snakemake.cli.parse_config": "--config values as Snakemake parses them",
}

#: The switch of every speed patch: ``MULTIGEOM_SPEED_PATCHES=off`` (or ``0``,
#: ``no``, ``false``) runs Snakemake exactly as it comes, for a new Snakemake release
#: or to rule the patches out of a problem. The dry run's output is the same either
#: way (tests/test_snakemake_hooks.py); only its time differs (docs/estimates.md).
SPEED_ENV = "MULTIGEOM_SPEED_PATCHES"


def speed_patches_on() -> bool:
    """Whether the speed patches are on (`SPEED_ENV`; on unless turned off)."""
    return os.environ.get(SPEED_ENV, "on").strip().lower() not in (
        "off",
        "0",
        "no",
        "false",
    )


# --- reading the run -------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """
    What the workflow needs to know of the running Snakemake, read once at parse time.

    Attributes
    ----------
    dryrun : bool
        ``-n``.
    main : bool
        The Snakemake the user started (not a job's own Snakemake: in a remote
        allocation or container, or a local subprocess).
    remote : bool
        A job's Snakemake in a remote allocation or container.
    local : bool
        Jobs run on this machine (Snakemake's ``local_exec``).
    cores : int or None
        ``--cores``.
    nodes : int or None
        ``--jobs`` of a remote executor (None for a local run).
    basedir : str
        The folder of the Snakefile.
    """

    dryrun: bool
    main: bool
    remote: bool
    local: bool
    cores: int | None
    nodes: int | None
    basedir: str


def facts(workflow) -> Facts:
    """The `Facts` of the running Snakemake."""
    settings = workflow.resource_settings
    return Facts(
        dryrun=bool(workflow.output_settings.dryrun),
        main=bool(workflow.is_main_process),
        remote=bool(workflow.remote_exec),
        local=bool(workflow.local_exec),
        cores=settings.cores,
        nodes=settings.nodes,
        basedir=str(workflow.basedir),
    )


def _as_written(value) -> str:
    """A resource value as a profile or the command line wrote it (quotes off)."""
    from snakemake.resources import Resource

    if isinstance(value, Resource):
        value = value.raw  # `.value` would evaluate it
    return str(value).strip("'\"")


@dataclass(frozen=True)
class GivenResources:
    """
    The resources a profile or the command line gave, as written.

    Attributes
    ----------
    per_rule : dict of str to dict of str to str
        ``set-resources``: rule -> name -> value as written.
    default : dict of str to str
        ``default-resources``: name -> value as written.
    limits : dict of str to int or float
        ``--resources``: name -> the run's limit.
    """

    per_rule: dict[str, dict[str, str]] = field(default_factory=dict)
    default: dict[str, str] = field(default_factory=dict)
    limits: dict[str, int | float] = field(default_factory=dict)

    def of_rule(self, rule: str, name: str) -> str | None:
        """A resource of `rule` as given: its own set-resources, else (unset or
        empty) the default-resources; None when neither gives it.
        """
        return self.per_rule.get(rule, {}).get(name) or self.default.get(name)


def given_resources(workflow) -> GivenResources:
    """The `GivenResources` of the running Snakemake."""
    from snakemake.resources import Resource

    settings = workflow.resource_settings
    return GivenResources(
        per_rule={
            rule: {name: _as_written(v) for name, v in dict(resources).items()}
            for rule, resources in dict(settings.overwrite_resources).items()
        },
        default={
            name: _as_written(v)
            for name, v in dict(settings.default_resources or {}).items()
        },
        limits={
            name: value.value if isinstance(value, Resource) else value
            for name, value in dict(settings.resources).items()
            if not name.startswith("_")
        },
    )


def executor_from_command_line() -> str | None:
    """
    The executor this Snakemake process runs the workflow with (``--executor``, a
    profile's ``executor:``), known while Snakemake parses the Snakefile: its command
    line parses it inside ``snakemake.cli.args_to_api(args, parser)`` (when it builds
    the DAG API), whose ``args.executor`` is read from the call's frame. Snakemake
    9.27 keeps the intended executor there in a dry run (its dry run is a
    ``pseudo_executor``); 9.19 to 9.26 set it to ``"dryrun"``. None outside
    Snakemake's command line (its Python API).
    """
    value = getattr(_command_line_args(), "executor", None)
    return value if isinstance(value, str) else None


def _command_line_args():
    """The ``args`` of Snakemake's command line while it parses the Snakefile
    (``snakemake.cli.args_to_api(args, parser)`` up the stack), or None.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if (
            frame.f_code.co_name == "args_to_api"
            and frame.f_globals.get("__name__") == "snakemake.cli"
        ):
            return frame.f_locals.get("args")
        frame = frame.f_back
    return None


#: Snakemake's commands that read the workflow and its files but run no job
#: (snakemake/cli.py, `args_to_api`: each its own branch before `execute_workflow`).
INSPECTING_COMMANDS = (
    "lint",
    "list_target_rules",
    "list_rules",
    "print_compilation",
    "dag",
    "d3dag",
    "rulegraph",
    "filegraph",
    "generate_unit_tests",
    "unlock",
    "cleanup_metadata",
    "cleanup_shadow",
    "conda_cleanup_envs",
    "conda_create_envs_only",
    "list_conda_envs",
    "container_cleanup_images",
    "containerize",
    "list_changes",
    "list_input_changes",
    "list_params_changes",
    "list_untracked",
    "summary",
    "detailed_summary",
    "archive",
    "delete_all_output",
    "delete_temp_output",
)


def inspection_only() -> bool:
    """
    Whether this Snakemake runs a command that runs no job (`INSPECTING_COMMANDS`:
    ``--summary``, ``--list-changes``, ``--dag``, ``--unlock``, ``--lint``, ...;
    ``--report`` without ``--report-after-run``): like a dry run, it must change no
    file of the user's. False outside Snakemake's command line.
    """
    args = _command_line_args()
    if args is None:
        return False
    if getattr(args, "report", None) and not getattr(args, "report_after_run", False):
        return True
    return any(getattr(args, name, None) for name in INSPECTING_COMMANDS)


def read_config_file(path: str) -> dict:
    """A config file read as Snakemake reads ``--configfile`` (YAML or JSON;
    ``snakemake.common.configfile.load_configfile``); raises Snakemake's
    ``WorkflowError`` on a file it cannot read.
    """
    from snakemake.common.configfile import load_configfile as load

    return load(path)


def read_config_values(entries: list[str]) -> dict:
    """``--config key=value`` entries parsed as Snakemake parses them
    (``snakemake.cli.parse_config``: int, float, bool, then YAML's base loader).
    """
    from snakemake.cli import parse_config as parse

    return parse(entries)


def executor_name(workflow) -> str | None:
    """The executor plugin's name (``local``, ``slurm``, ``modal``, ...), once
    Snakemake has chosen it (at ``onstart``); None before.
    """
    return getattr(getattr(workflow, "executor_plugin", None), "name", None)


def slurm_status_command(workflow) -> str | None:
    """The SLURM plugin's ``--slurm-status-command`` (None: its default, sacct)."""
    return getattr(workflow.executor_settings, "status_command", None)


def submit_dir(workflow) -> str:
    """The working directory the SLURM plugin submits from (``--directory``)."""
    return str(workflow.workdir_init)


def resources_in_force(workflow, rule: str) -> dict[str, object]:
    """
    The resources of `rule` as Snakemake will apply them (the rule's own, with a
    profile's or the command line's ``set-resources`` applied): name -> the value for
    a resource that reads nothing of the job, or the text as written for one that
    does (callables left out).
    """
    from snakemake.resources import Resource

    out = {}
    for name, res in workflow.get_rule(rule).resources.items():
        if isinstance(res, Resource):
            value = res.raw if res.is_evaluable() else res.value
        else:
            value = res
        if value is not None and not callable(value):
            out[name] = value
    return out


def planned_jobs(workflow, rules: Iterable[str]) -> list[tuple[str, dict[str, str]]]:
    """
    The jobs of `rules` that Snakemake will run, once its plan is built: (rule name,
    wildcards as a dict) for each of its jobs to run (``workflow.dag.needrun_jobs()``);
    empty before the plan.
    """
    dag = getattr(workflow, "dag", None)
    if dag is None:
        return []
    rules = set(rules)
    return [
        (job.rule.name, dict(job.wildcards.items()))
        for job in dag.needrun_jobs()
        if job.rule.name in rules
    ]


class _PlanBuilt(logging.Handler):
    """A handler of Snakemake's logger that calls back once the plan is built."""

    def __init__(self, callback: Callable[[bool], None]):
        from snakemake.common import NOTHING_TO_BE_DONE_MSG
        from snakemake_interface_logger_plugins.common import LogEvent

        super().__init__(level=logging.INFO)
        self.callback, self.done = callback, False
        self._run_info, self._nothing = LogEvent.RUN_INFO, NOTHING_TO_BE_DONE_MSG

    def emit(self, record: logging.LogRecord) -> None:
        """On the plan's statistics (or nothing to do): the callback, once. Any other
        record returns at once (a dry run logs two per job).
        """
        event = getattr(record, "event", None)
        if event != self._run_info and (
            event is not None or record.getMessage() != self._nothing
        ):
            return
        if self.done:
            return
        self.done = True
        self.callback(event is not None)


def when_plan_built(callback: Callable[[bool], None]) -> logging.Handler:
    """
    Call ``callback(planned)`` once Snakemake's plan is built: when its logger records
    the job statistics (the ``RUN_INFO`` record, logged after the plan is built and
    before the job list, in a dry run and in a real run; ``planned`` True), or its
    "Nothing to be done" line (``planned`` False). Returns the handler attached to
    ``snakemake.logging.logger``.
    """
    from snakemake.logging import logger

    handler = _PlanBuilt(callback)
    logger.addHandler(handler)
    return handler


# --- acting on the run -----------------------------------------------------------


def share_group_name(workflow, groups: Iterable[str], parent: str) -> None:
    """
    Make every group of `groups` count as the one group name `parent`, so that a
    profile's ``group-components: [parent=N]`` applies to each: Snakemake keys
    --group-components by that parent name, as for groups written with wildcards
    (the mapping ``workflow.parent_groupids`` it fills for those).
    """
    for group in groups:
        workflow.parent_groupids[group] = parent


def limit_local_gpus(workflow, n: int) -> bool:
    """On this machine, start no more jobs asking ``gpu`` than `n` at once (the
    scheduler's limit, as ``--resources gpu=n`` would set it). Returns whether it
    could (the scheduler exists once the run starts).
    """
    scheduler = getattr(workflow, "scheduler", None)
    if scheduler is None:
        return False
    scheduler.global_resources["gpu"] = n
    scheduler.resources["gpu"] = n
    return True


def share_resources(
    workflow, target: str, source: str, drop: Iterable[str] = ()
) -> None:
    """
    Give rule `target` the resources a profile or the command line set for rule
    `source` (``set-resources``), except those set for `target` itself; then drop the
    resources named in `drop` from both rules (settings of the workflow's own, not
    resources a job asks its executor for).
    """
    from snakemake.resources import Resources

    rule = workflow.get_rule(target)
    given = workflow.resource_settings.overwrite_resources
    own = Resources(dict(given.get(target, {})))
    shared = Resources(dict(given.get(source, {})))
    rule.resources.update(
        Resources({name: r for name, r in shared.items() if name not in own})
    )
    drop = set(drop)
    for name in (source, target):
        r = workflow.get_rule(name)
        r.resources = Resources({k: v for k, v in r.resources.items() if k not in drop})


#: The file class's methods `show_snakemake` wraps, each with its original.
_ORIGINAL_FILE_METHODS: dict[str, Callable] = {}


def show_snakemake(view) -> bool:
    """
    Make this process's Snakemake see the files of `view` as given, from now on;
    nothing when the view is empty. Returns whether it wrapped Snakemake's methods.

    `view` is a `multigeom_workflow.planning.before_planning.PlanningView`: absolute
    paths seen missing (``missing``), seen with another date (``dates``, ns) and seen
    present in place of another file (``present``).

    A dry run changes no file (Snakemake's promise for ``-n``), yet its plan must be
    the one a real run builds after what it changes before planning
    (`multigeom_workflow.planning.before_planning`). Snakemake's planning reads a
    local file through methods of its file class (snakemake/dag.py and snakemake/io:
    ``_IOFile.exists_local``, ``mtime_uncached`` and ``size_local``, and for a file
    of 1 MB or less newer than an output ``is_fifo`` and ``checksum``; its IO cache
    stores what they return): they are wrapped so that the files of `view` read as
    the real run leaves them (a file put back is read from where it comes from),
    every other file as before. Call it before Snakemake builds its plan (at parse
    time).
    """
    if not view:
        return False
    from snakemake.io import _IOFile
    from snakemake_interface_storage_plugins.io import Mtime

    names = ("exists_local", "mtime_uncached", "size_local", "is_fifo", "checksum")
    for name in names:
        _ORIGINAL_FILE_METHODS.setdefault(name, getattr(_IOFile, name))
    exists_local = _ORIGINAL_FILE_METHODS["exists_local"]
    mtime_uncached = _ORIGINAL_FILE_METHODS["mtime_uncached"]
    size_local = _ORIGINAL_FILE_METHODS["size_local"]
    is_fifo = _ORIGINAL_FILE_METHODS["is_fifo"]
    checksum = _ORIGINAL_FILE_METHODS["checksum"]
    missing, dates, present = view.missing, view.dates, view.present

    async def seen_exists_local(self):
        path = os.path.abspath(self.file)
        if path in missing:
            return False
        if path in present:
            return True
        return await exists_local(self)

    async def seen_mtime_uncached(self, skip_storage: bool = False):
        path = os.path.abspath(self.file)
        if path in present:
            return Mtime(local=os.stat(present[path]).st_mtime)
        if path in dates:
            return Mtime(local=dates[path] / 1e9)
        return await mtime_uncached(self, skip_storage=skip_storage)

    async def seen_size_local(self):
        path = os.path.abspath(self.file)
        if path in present:
            return os.path.getsize(present[path])
        return await size_local(self)

    def seen_is_fifo(self):
        path = os.path.abspath(self.file)
        if path in present:
            return is_fifo(_IOFile(present[path], rule=self.rule))
        return is_fifo(self)

    async def seen_checksum(self, *args, **kwargs):
        path = os.path.abspath(self.file)
        if path in present:  # the bytes a real run puts back
            return await checksum(
                _IOFile(present[path], rule=self.rule), *args, **kwargs
            )
        return await checksum(self, *args, **kwargs)

    _IOFile.exists_local = seen_exists_local
    _IOFile.mtime_uncached = seen_mtime_uncached
    _IOFile.size_local = seen_size_local
    _IOFile.is_fifo = seen_is_fifo
    _IOFile.checksum = seen_checksum
    return True


# --- speed patches (SPEED_ENV) ---------------------------------------------------

#: The garbage collector's thresholds in a Snakemake process of the workflow
#: (`gc.set_threshold`; CPython 3.11's default is (700, 10, 10)): see
#: `fewer_collections`.
GC_THRESHOLDS = (50_000, 20, 20)


#: The Snakemake releases the patches of recorded params were read against.
PARAMS_PATCH_TESTED = "9.19.0 to 9.27.1"


def read_recorded_params_as(translate: Callable) -> str | None:
    """
    Have Snakemake read what it recorded as an output's params through `translate`:
    `snakemake.persistence.PersistenceBase.params` (``params(self, path) -> list of
    reprs or None``, read by ``params_changed`` when it compares a job's params with
    its outputs' records; Snakemake 9.19.0 and 9.27.1, ``persistence/__init__.py``)
    returns ``translate(recorded)``. What Snakemake records, and how it compares, is
    unchanged. Installed once per process; safe to call again.

    Returns
    -------
    str or None
        None when in place; else one line naming the internal that is not what this
        was written for, the Snakemake version and the releases tested, Snakemake's
        own reading of records applying (nothing is patched).
    """
    import inspect

    try:
        from snakemake.persistence import PersistenceBase

        original = PersistenceBase.params
    except (ImportError, AttributeError) as err:
        return _internal_changed("snakemake.persistence.PersistenceBase.params", err)
    if getattr(original, "_translate", None) is translate:
        return None
    problem = None
    if not callable(original) or inspect.iscoroutinefunction(original):
        problem = "is not a plain method"
    else:
        names = list(inspect.signature(original).parameters)
        if names != ["self", "path"]:
            problem = f"takes ({', '.join(names)}), not (self, path)"
    if problem:
        return _internal_changed("snakemake.persistence.PersistenceBase.params", problem)
    original = getattr(original, "_original", original)

    def params(self, path):
        return translate(original(self, path))

    params._translate, params._original = translate, original
    PersistenceBase.params = params
    return None


def _internal_changed(name: str, problem) -> str:
    """One line: Snakemake's internal `name` is not what the workflow was written for."""
    from importlib.metadata import version

    return (
        f"Snakemake {version('snakemake')}: {name} {problem} (the workflow was tested "
        f"with {PARAMS_PATCH_TESTED})"
    )


def fewer_collections() -> bool:
    """
    Let Python's cyclic garbage collector run less often in this Snakemake process
    (`GC_THRESHOLDS`, or the thresholds already set where higher); nothing with the
    speed patches off. Returns whether it did.

    Snakemake builds tens of objects per job and keeps them for the whole run: at
    CPython's default a collection starts every 700 new objects and scans the young
    ones again and again, and the older generations' collections scan every job.
    Measured with `gc.callbacks` on a dry run of 4 x 10,000 images with the slurm
    profile (2-core machine, 2026-12-01): 6.6 s of 47 CPU-seconds in 10,938
    collections at the default, 1.6 s in 145 at these thresholds, the peak memory the
    same (955 MB); docs/estimates.md has the benchmark's figures. Objects freed by
    their reference count (nearly all) are freed at once either way; only garbage in
    reference cycles waits longer.
    """
    import gc

    if not speed_patches_on():
        return False
    current = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(current, GC_THRESHOLDS, strict=True)))
    return True


def idle_logger_plugin_off(workflow, plugin_class: type) -> bool:
    """
    In a dry run, take Snakemake's queue to its logger plugins off its logger when the
    only plugins are idle ones of `plugin_class` (the workflow's own, ``--logger
    multigeom``, in every profile: it has no view to draw in a dry run and writes
    nothing, Snakemake's own handler writing the messages), yet each record handed
    to its thread costs tens of microseconds, and a dry run logs two per job (3 s of
    48 at 40,000 jobs). Returns whether it did; other plugins keep their queue, and
    nothing is done with the speed patches off.
    """
    from logging.handlers import QueueHandler

    if not speed_patches_on():
        return False
    manager = getattr(workflow, "logger_manager", None)
    listener = getattr(manager, "queue_listener", None)
    plugins = list(getattr(manager, "plugin_handlers", None) or [])
    if listener is None or not plugins:
        return False
    if not all(isinstance(h, plugin_class) and h.idle for h in plugins):
        return False
    for handler in list(manager.logger.handlers):
        if isinstance(handler, QueueHandler) and handler.queue is listener.queue:
            manager.logger.removeHandler(handler)
            return True
    return False


def record_signature(func, of=None) -> bool:
    """
    Record on `func` the parameters Snakemake reads of `of` (default: `func` itself;
    `snakemake.common.get_function_params`), as Snakemake's own ioutils do
    (`snakemake.common.overwrite_function_params`): Snakemake then reads them from
    there instead of calling `inspect.signature` at each call. Nothing with the speed
    patches off; returns whether it did.
    """
    from snakemake.common import get_function_params, overwrite_function_params

    if not speed_patches_on():
        return False
    overwrite_function_params(func, get_function_params(func if of is None else of))
    return True


def settle_rules(workflow, rules: Iterable[str]) -> bool:
    """
    For each rule of `rules`, what Snakemake would otherwise work out again for each
    of its 40,000 jobs, to the same value: the resources that read nothing of the job
    (`_settle_constant_resources`), its input functions' signatures
    (`_settle_input_functions`), and once the signature of `Resource.evaluate`
    (`_settle_resource_evaluation`). Nothing with the speed patches off; returns
    whether it did.
    """
    if not speed_patches_on():
        return False
    for rule in map(workflow.get_rule, rules):
        _settle_constant_resources(rule)
        _settle_input_functions(rule)
    _settle_resource_evaluation()
    return True


def _settle_resource_evaluation() -> None:
    """
    Record the signature of Snakemake's `Resource.evaluate` on it
    (`snakemake.common.overwrite_function_params`, the value `get_function_params`
    gives a bound ``Resource(...).evaluate``: ``*args, **kwargs``). Snakemake evaluates
    each job's evaluable resources (its threads, a function such as SLURM's runtime)
    through `Rule.apply_input_function(resource.evaluate, ...)`, which reads that
    signature with `inspect.signature` twice per resource and job (a bound method
    reads its function's attributes, so the recorded one serves every resource).
    What is passed on is unchanged: the same parameters, read once.
    """
    from snakemake.resources import Resource

    record_signature(Resource.evaluate, Resource("_cores", 1).evaluate)


def _settle_input_functions(rule) -> None:
    """
    Record the signature of each input function of `rule` on the function
    (`snakemake.common.overwrite_function_params`, as Snakemake's own ioutils do with
    `get_function_params`' value: `record_signature`): Snakemake reads a function's
    parameters at each call to know what to pass it, with `inspect.signature`, twice
    per job.
    """
    for item in rule.input:
        func = getattr(getattr(item, "_file", item), "callable", None)
        if callable(func):
            record_signature(func)


#: What a resource expression of the command line or a profile (`set-resources`,
#: `default-resources`) may read of its job, besides snakemake.ioutils' functions
#: (`snakemake.resources.Resource.cli_evaluator`'s parameters and namespace:
#: Snakemake 9.19 has no ``wildcards``, 9.27 has).
JOB_NAMES = {"wildcards", "input", "attempt", "threads", "async_run"}


def _cli_evaluator_arguments() -> dict | None:
    """
    The job-independent arguments `Resource.cli_evaluator` takes in the installed
    Snakemake (its keyword parameters among `JOB_NAMES`), or None where it takes one
    this module does not know: a new parameter, defaulted or not, could make a value
    depend on the job, and settling it once would freeze a wrong constant.
    """
    import inspect

    from snakemake.resources import Resource

    known = {"wildcards": None, "input": (), "attempt": 1, "async_run": None}
    params = list(inspect.signature(Resource.cli_evaluator).parameters.values())
    out = {}
    for p in params[2:]:  # after (name, val)
        if p.name == "threads" and p.default is None:
            continue  # left out: as Snakemake itself evaluates a job's resources
        if p.name not in known:
            return None
        out[p.name] = known[p.name]
    return out


def _settle_constant_resources(rule) -> None:
    """
    Evaluate once, at parse time, each resource of `rule` that a profile or the command
    line gave as an expression reading nothing of its job (``mem_mb=16000``,
    ``slurm_partition=gpu``, ``mpi=""``, Snakemake's default
    ``tmpdir=system_tmpdir``; not ``mem_mb=8000*attempt``): Snakemake would evaluate
    it again for every job (for 40,000 per-image jobs, seconds of a dry run), to the
    same value. The value is the one Snakemake's own evaluation
    (`Resource.cli_evaluator`) gives in this process (every Snakemake process of a
    run, a job's own in an allocation or a container too, parses the workflow and
    evaluates its own: ``system_tmpdir`` is that machine's); expressions that read the
    job or an ioutils function stay as they are, and nothing is settled where the
    evaluator's parameters are not the known ones (`_cli_evaluator_arguments`).
    """
    import ast

    import snakemake.ioutils
    from snakemake.resources import Resource

    arguments = _cli_evaluator_arguments()
    if arguments is None:
        return
    namespace = {}
    snakemake.ioutils.register_in_globals(namespace)
    reads_job = JOB_NAMES | set(namespace) | {"shutil"}
    for name, res in list(rule.resources.items()):
        raw = res.raw
        if name.startswith("_") or not res.is_evaluable() or not isinstance(raw, str):
            continue
        expr = os.path.expanduser(os.path.expandvars(raw))
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            tree = None  # Snakemake takes such a value as the string itself
        if tree is not None and any(
            isinstance(node, ast.Name) and node.id in reads_job
            for node in ast.walk(tree)
        ):
            continue
        try:
            value = Resource.cli_evaluator(name, raw, **arguments)
            settled = Resource(name, value, raw=raw)
        except Exception:  # Snakemake names the error at the job, as it would
            continue
        rule.resources[name] = settled
