"""
Reading the running Snakemake: its facts, resources, command line, executor, config
files and plan (the functions `multigeom_workflow.snakemake_adapter` lists as reading
the run).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .internals import InternalChanged, changed_line


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


def conda_env(workflow, name: str) -> str | None:
    """
    The rules' ``conda`` directive: `name` (a named conda environment) when this
    Snakemake deploys conda environments (``--sdm conda``) or only inspects the
    workflow (`inspection_only`: ``--lint`` checks each rule names one); None
    otherwise. A rule with a ``conda`` directive has its environment recorded in
    Snakemake's metadata for every job (`snakemake.persistence.Persistence._conda_env`
    reads its content), which for a named environment runs ``conda env export``: on a
    machine without conda every job would fail, and a recorded environment that
    changes reruns every job of a finished run (rerun trigger ``software-env``).
    """
    from snakemake_interface_executor_plugins.settings import DeploymentMethod

    methods = workflow.deployment_settings.deployment_method or ()
    return name if DeploymentMethod.CONDA in methods or inspection_only() else None


def configfile_values(workflow) -> dict | None:
    """
    What the command line's ``--configfile`` files and ``--config`` values set,
    deep-merged as Snakemake merges them before laying them over the Snakefile's
    ``configfile:`` (`snakemake.settings.types.ConfigSettings.overwrite_config`); None
    without a ``--configfile``, or with ``--replace-workflow-config`` (then the
    Snakefile's file is not read at all).
    """
    settings = workflow.config_settings
    if not settings.configfiles or settings.replace_workflow_config:
        return None
    return dict(settings.overwrite_config)


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
    ``pseudo_executor``; 9.19 to 9.26 set it to ``"dryrun"``, which is why
    pyproject.toml accepts 9.27 and later). None outside
    Snakemake's command line (its Python API).
    """
    value = getattr(_command_line_args(), "executor", None)
    return value if isinstance(value, str) else None


def _command_line_args():
    """
    The ``args`` of Snakemake's command line while it parses the Snakefile
    (``snakemake.cli.args_to_api(args, parser)`` up the stack), or None outside
    Snakemake's command line (its Python API).

    Raises
    ------
    InternalChanged
        In Snakemake's command line (`_in_snakemake_command_line`) when no such frame,
        or no ``args`` in it, is found: a later Snakemake parses its command line
        otherwise, and answering None would take every command for a real run
        (``--summary`` or ``--dag`` would change files).
    """
    frame = sys._getframe(1)
    while frame is not None:
        if (
            frame.f_code.co_name == "args_to_api"
            and frame.f_globals.get("__name__") == "snakemake.cli"
        ):
            args = frame.f_locals.get("args")
            if args is None:
                break
            return args
        frame = frame.f_back
    if _in_snakemake_command_line():
        raise InternalChanged(
            changed_line(
                "snakemake.cli.args_to_api(args)",
                "holds no command line while the Snakefile is parsed",
            )
        )
    return None


def _in_snakemake_command_line() -> bool:
    """Whether this process is Snakemake's command line: ``snakemake ...`` or
    ``python -m snakemake ...`` (a job's own Snakemake too).
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and (spec.name or "").split(".")[0] == "snakemake":
        return True
    return os.path.basename(sys.argv[0] if sys.argv else "") == "snakemake"


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
