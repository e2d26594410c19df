"""
What the workflow does to Snakemake, in one place.

The rule files only describe the workflow (rules/common.smk: validation, wildcard
constraints, ``get_*`` functions); everything that acts on the running Snakemake is
here and takes its ``workflow`` object as an argument: handing the run's settings to
the per-image jobs, the shard groups, the per-image jobs' resources, the estimate a dry
run prints, the checks before the first job. Every use of a Snakemake internal
(attributes not in its documented API) is in this module, named in `INTERNALS`, and
tests/test_snakemake_hooks.py fails when an upgrade of Snakemake changes one of them.

What is left is what Snakemake will run: the dry run's estimate, the Modal budget
check, the SLURM lines, the live view and ``multigeom-workflow progress`` count the
per-image jobs of Snakemake's own plan (its jobs to run, after its rerun triggers and
metadata: `planned_per_image`), read once the plan is built: when Snakemake logs its
job statistics (`DryRunEstimate`: the dry run's estimate, the live view's files, the
plan file of ``progress``) and, for the Modal budget, at ``onstart``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .compute.gpus import allocation_lock_dir
from .compute.kept import KEEP_ENV, choose_keep_method
from .compute.request import RunSettings
from .compute.workers import clean_after_killed_runs
from .on_modal.preflight import before_modal_run
from .on_snakemake.adapter import INTERNALS as VIEW_INTERNALS
from .on_snakemake.adapter import show_snakemake
from .planning.before_planning import before_planning, content_inputs, record_contents
from .planning.cost import budget_problem
from .planning.live_view import set_plan
from .planning.plan import estimate_lines, pending_images, progress, run_estimates
from .planning.shards import SHARD_GROUP, num_shards, shard_groups
from .planning.slurm import (
    CAP_RESOURCE,
    SHARD_RESOURCES,
    SlurmPlan,
    modal_plan,
    plan_for_run,
    status_query_problem,
    submission_problem,
)
from .scenario import ConfigError, Scenario, validated_scenario
from .settings.files import resolve_settings_file
from .settings.names import CEILING_ROW, CEILING_RULE, ESTIMATE_RULE, PER_IMAGE_RULES

__all__ = [
    "INTERNALS",
    "PER_IMAGE_RULES",
    "PLACEHOLDER_PREFIX",
    "PLAN_FILE_ENV",
    "DryRunEstimate",
    "Run",
    "content_inputs",
    "planned_per_image",
    "start",
]

#: How a profile marks a value its user must set (profiles/slurm): a run refuses it.
PLACEHOLDER_PREFIX = "SET-"
#: Where `multigeom-workflow progress` asks a dry run to write its plan (JSON).
PLAN_FILE_ENV = "MULTIGEOM_PLAN_FILE"
#: The Snakemake internals used here (Snakemake 9.19 to 9.x), each with its use;
#: tests/test_snakemake_hooks.py checks that each still exists.
INTERNALS = {
    "workflow.parent_groupids": "shard groups counted as one name (register_groups)",
    "workflow.resource_settings.overwrite_resources": "a profile's set-resources",
    "workflow.scheduler.global_resources": "the gpu limit of a local run",
    "workflow.scheduler.resources": "the same limit, as the scheduler counts it",
    "workflow.resource_settings.default_resources": "a profile's default-resources",
    "workflow.executor_settings.status_command": "the SLURM plugin's status query",
    "workflow.dag.needrun_jobs": "the per-image jobs Snakemake will run",
    "rule.resources": "the ceiling's rule shares estimate_image's set-resources",
    "Resource.cli_evaluator": "set-resources that read nothing of the job, once",
    "snakemake.common.overwrite_function_params": "input functions' signatures, once",
    "Resource.evaluate": "its signature recorded once (settle_resource_evaluation)",
    "Resource.raw": "a set-resources value as written",
    "snakemake.ioutils.register_in_globals": "names a resource expression may read",
    "snakemake.logging.logger RUN_INFO record": "the moment the plan is built",
    "snakemake.cli.args_to_api(args): args.executor": (
        "the executor in use, at parse time (executor_in_use)"
    ),
    "workflow.executor_plugin": "the executor in use, at onstart",
    "workflow.workdir_init": "the working directory the SLURM plugin submits from",
    "workflow.logger_manager.queue_listener": "the queue to the logger plugins",
    "workflow.logger_manager.plugin_handlers": "the logger plugins (idle ones)",
    **VIEW_INTERNALS,  # the planning view of a dry run (on_snakemake/adapter.py)
}


@dataclass
class Run:
    """
    The parsed run as the rules see it.

    Attributes
    ----------
    scenario : Scenario
        The validated configuration.
    shards : dict
        ((encoder, area), index) -> group name, for remote executors (empty locally).
    sharded : bool
        The per-image jobs are grouped into shards (a remote executor).
    n_shards : int
        The number of shards (`num_shards`); 0 when not sharded.
    slurm : SlurmPlan or None
        The shards and time limits of a run for SLURM
        (`multigeom_workflow.planning.slurm`), None for any other run.
    runtimes : dict
        ((encoder, area), index) -> the `runtime` of its jobs on SLURM or Modal
        (`SlurmPlan.runtimes`, computed once); empty elsewhere.
    shards_setting : int or str
        The config key ``shards``.
    executor : str or None
        The executor in use (`executor_in_use`: ``slurm``, ``modal``, ``local``, ...).
    modal : SlurmPlan or None
        The shards and time limits of a sharded run on Modal
        (`multigeom_workflow.planning.slurm.modal_plan`), None for any other run.
    """

    scenario: Scenario
    shards: dict = field(default_factory=dict)
    sharded: bool = False
    n_shards: int = 0
    slurm: SlurmPlan | None = None
    runtimes: dict = field(default_factory=dict)
    shards_setting: int | str = "auto"
    executor: str | None = None
    modal: SlurmPlan | None = None

    @property
    def on_slurm(self) -> bool:
        """A run for SLURM: planned on the login node, or a shard in its allocation
        (whose Snakemake runs the jobs with the executor `SLURM_JOBSTEP`).
        """
        return self.slurm is not None or self.executor == SLURM_JOBSTEP

    def runtime_of(self, wildcards) -> int:
        """
        A per-image job's `runtime` (minutes) on SLURM or Modal: its share of its
        shard's time limit (`SlurmPlan.runtimes`: Snakemake sums a group's runtimes
        into the allocation's --time, or the container's timeout); a job outside the
        planned shards, one image's limit.
        """
        key = ((wildcards.encoder, wildcards.area), int(wildcards.index))
        return self.runtimes.get(key, (self.slurm or self.modal).single_minutes())

    def shard_of(self, encoder: str, area: str, index: int) -> str:
        """
        The group (shard) of a per-image job. A job planned that was not missing when
        the run was parsed (recomputed after a change of settings) goes to shard
        ``index mod n_shards``, so that such jobs spread over the shards too.
        """
        key = ((encoder, area), int(index))
        if key in self.shards:
            return self.shards[key]
        if not self.n_shards:
            return SHARD_GROUP
        width = max(2, len(str(self.n_shards - 1)))
        return f"{SHARD_GROUP}-{int(index) % self.n_shards:0{width}d}"


def _say(line: str) -> None:
    print(line, file=sys.stderr)


#: The executor a SLURM allocation's own Snakemake runs its jobs with.
SLURM_JOBSTEP = "slurm-jobstep"


def executor_in_use() -> str | None:
    """
    The executor this Snakemake process runs the workflow with (``--executor``, a
    profile's ``executor:``), known while Snakemake parses the Snakefile: its command
    line parses it inside ``snakemake.cli.args_to_api(args, parser)`` (when it builds
    the DAG API), whose ``args.executor`` is read from the call's frame. Snakemake
    9.27 keeps the intended executor there in a dry run (its dry run is a
    ``pseudo_executor``); 9.19 sets it to ``"dryrun"``. None outside Snakemake's
    command line (its Python API).
    """
    frame = sys._getframe(1)
    while frame is not None:
        if (
            frame.f_code.co_name == "args_to_api"
            and frame.f_globals.get("__name__") == "snakemake.cli"
        ):
            value = getattr(frame.f_locals.get("args"), "executor", None)
            return value if isinstance(value, str) else None
        frame = frame.f_back
    return None


def check_installed_package(workflow) -> None:
    """
    A warning line when the `multigeom_workflow` package Python imports is not this
    workflow's own (``src/`` beside the Snakefile): another checkout installed in the
    environment would run its code with this workflow's rules.
    """
    here = os.path.realpath(os.path.join(workflow.basedir, "src"))
    imported = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))
    if workflow.is_main_process and imported != here:
        _say(
            f"warning: the multigeom_workflow package imported is "
            f"{imported}/multigeom_workflow, not this workflow's "
            f"({here}/multigeom_workflow): run `pip install -e .` in "
            f"{workflow.basedir} to use this checkout"
        )


def on_end(workflow, run: Run) -> None:
    """
    At the end of a real run (``onsuccess``, ``onerror``): the inputs it made
    (checkpoints, the demo's data, test images) recorded with their content, so that
    a later date change (``touch``, ``cp -r``) recomputes nothing; and one line per
    GPU this run stopped (its CUDA context failed in two workers in a row:
    `multigeom_workflow.compute.gpus.stop_gpu`), which only its job's log said.
    """
    if workflow.is_main_process:
        record_contents(run.scenario, restore=False)
        from .compute.gpus import stopped_gpus

        for _, line in sorted(stopped_gpus(RunSettings.from_env().run_id).items()):
            _say(f"warning: {line}")


def _before_planning(scenario: Scenario, dryrun: bool) -> None:
    """
    Before Snakemake plans (`multigeom_workflow.planning.before_planning`): in a real
    run, files kept by SLURM allocations that ended early put back, unchanged inputs'
    dates kept, changed per-image files checked and bad ones set aside; a dry run
    changes nothing and says what would be done. Either way Snakemake is shown the
    files as the real run leaves them (`show_snakemake`), so that its plan is the
    real run's.
    """
    done = before_planning(scenario, dry=dryrun)
    for line in done.lines:
        _say(line)
    show_snakemake(done.view)


def job_seeds(scenario: Scenario) -> dict[str, int]:
    """
    ``"<rule>/<encoder>/<area>"`` -> the seed of the per-image rule's jobs of that
    configuration: the configuration's (`Scenario.estimator_of`, config key
    ``monte_carlo_seeds``) for estimate_image, the noise ceiling's
    (`multigeom_workflow.settings.seeds.ceiling_estimator`) for
    estimate_image_ceiling: the seeds of the rules' ``params.estimator``.
    """
    from .settings.seeds import ceiling_estimator

    ceiling = int(ceiling_estimator(scenario.estimator)["seed"])
    out = {}
    for c in scenario.configurations:
        out[f"{ESTIMATE_RULE}/{c.encoder}/{c.area}"] = int(
            scenario.estimator_of(c.encoder, c.area)["seed"]
        )
        out[f"{CEILING_RULE}/{c.encoder}/{c.area}"] = ceiling
    return out


def _export_run_settings(workflow, config: dict, scenario: Scenario) -> None:
    """
    What every per-image job of this run shares, resolved once and handed to them in
    the environment (they inherit it; `RunSettings.to_env`). In a SLURM allocation (a
    shard, profiles/slurm) every per-image job is a Snakemake process of its own: they
    keep the allocation's first Snakemake as their run, so that one warm worker serves
    the whole shard, with slot locks of the allocation's own (SLURM numbers every
    allocation's GPUs from 0, and allocations may share a node).
    """
    slurm_job = os.environ.get("SLURM_JOB_ID", "")
    if slurm_job and os.environ.get("MULTIGEOM_SLURM_JOB_ID") == slurm_job:
        return  # a later Snakemake process of the same allocation
    os.environ.update(
        RunSettings(
            run_id=str(os.getpid()),
            device=scenario.device,
            gpu_ids=list(scenario.gpu_ids),
            # in an allocation: one share, one warm worker (compute/gpus.py)
            cpu_slots=1 if slurm_job else int(workflow.resource_settings.cores or 1),
            warm=scenario.warm_workers,
            settings_files={
                key: str(resolve_settings_file(str(config[key]), key, workflow.basedir))
                for key in ("estimator", "diffusion")
            },
            engine=scenario.engine,
            precision=scenario.precision,
            # what the per-image rules' params hold (rules/estimate.smk, science.smk)
            estimator=scenario.estimator,
            seeds=job_seeds(scenario),
            diffusion=scenario.diffusion,
        ).to_env(),
        MULTIGEOM_SLURM_JOB_ID=slurm_job,
        # a shard submitted by this workflow (not a local run inside an allocation):
        # its finished files are kept if it ends early (compute/kept.py)
        MULTIGEOM_SLURM_SHARD=slurm_job if workflow.remote_exec else "",
    )
    if slurm_job:
        os.environ.update(MULTIGEOM_GPU_LOCK_DIR=str(allocation_lock_dir(slurm_job)))


#: The garbage collector's thresholds in a Snakemake process of the workflow
#: (`gc.set_threshold`; CPython 3.11's default is (700, 10, 10)): see
#: `fewer_collections`.
GC_THRESHOLDS = (50_000, 20, 20)


def fewer_collections() -> None:
    """
    Let Python's cyclic garbage collector run less often in this Snakemake process
    (`GC_THRESHOLDS`, or the thresholds already set where higher). Snakemake builds
    tens of objects per job and keeps them for the whole run: at CPython's default a
    collection starts every 700 new objects and scans the young ones again and again,
    and the older generations' collections scan every job. Measured with
    `gc.callbacks` on a dry run of 4 x 10,000 images with the slurm profile (2-core
    machine, 2026-12-01): 6.6 s of 47 CPU-seconds in 10,938 collections at the
    default, 1.6 s in 145 at these thresholds, the peak memory the same (955 MB);
    docs/estimates.md has the benchmark's figures. Objects freed by their reference
    count (nearly all) are freed at once either way; only garbage in reference cycles
    waits longer.
    """
    import gc

    current = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(current, GC_THRESHOLDS, strict=True)))


def start(workflow, config: dict) -> Run:
    """
    Everything the workflow does when Snakemake parses it, in order: the package
    check, the configuration (one ``config error:`` line and exit status 1 on a bad
    value), its notices, the inputs' dates and the changed per-image files
    (`_before_planning`, not inside a remote job; a dry run changes nothing), the
    run settings handed to the jobs, the shard groups of a remote executor, a SLURM
    run's time limit, and the dry run's estimate (`DryRunEstimate`).

    Returns
    -------
    Run

    Raises
    ------
    SystemExit
        With one ``config error: ...`` line, on a bad configuration.
    """
    check_installed_package(workflow)
    fewer_collections()
    remote = bool(workflow.remote_exec)
    try:
        scenario = validated_scenario(config, workflow.basedir, remote)
    except ConfigError as err:
        # Snakemake would wrap a raised error in a traceback of the rule files.
        sys.exit(f"config error: {err}")
    dryrun = workflow.output_settings.dryrun
    if dryrun:
        for problem in scenario.blockers:
            _say(f"warning: {problem}")
    # (the notes include the one for test images not 64 x 64: the scenario's check
    # of the images, one pass)
    for line in (scenario.gpu_fallback, *scenario.notes, scenario.stage5_skipped):
        if line:
            _say(line)
    main = workflow.is_main_process  # not a job's own Snakemake (remote, subprocess)
    if main:
        _before_planning(scenario, dryrun)
    _export_run_settings(workflow, config, scenario)

    run = Run(
        scenario=scenario, shards_setting=config["shards"], executor=executor_in_use()
    )
    # Groups matter only where Snakemake submits them: remote executors, which
    # require --jobs (and the jobs they run remotely). Local runs ignore groups, and
    # a dry run submits nothing (its estimate makes the shards of the plan itself):
    # grouping 40,000 jobs costs Snakemake minutes.
    run.sharded = not main or (
        workflow.resource_settings.nodes is not None and not dryrun
    )
    # A run for SLURM (profiles/slurm asks SLURM resources of the per-image jobs):
    # shards whose time limits fit the cluster's cap, more of them where needed
    # (docs/slurm.md); planned on the login node only.
    try:
        run.slurm = plan_for_run(
            scenario,
            workflow.resource_settings,
            config["shards"],
            not main,
            executor=run.executor,
        )
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    if run.slurm:
        run.runtimes = run.slurm.runtimes()
    if run.slurm and not dryrun:  # hard links, or copies where they are refused
        _say(keep_method_line(scenario))
    if run.slurm and not dryrun:
        for line in run.slurm.over_cap():  # a dry run lists them with its plan
            _say(f"warning: {line}")
    if run.sharded:
        run.n_shards = num_shards(config["shards"], workflow.resource_settings.nodes)
        from snakemake_executor_plugin_modal.preflight import requested_settings

        if run.slurm is None and requested_settings() is not None:
            # on Modal: each shard's timeout (and the budget guard's worst case)
            # from its work, not the profile's 6 h
            run.modal = modal_plan(scenario, run.n_shards)
            run.runtimes = run.modal.runtimes()
        if run.slurm or run.modal:
            plan = run.slurm or run.modal
            run.shards = plan.groups()
            run.n_shards = max(len(plan.shards), 1)
        else:
            run.shards = shard_groups(pending_images(scenario), run.n_shards)
        register_groups(workflow, run)
    if dryrun:
        for line in profile_placeholders(workflow):
            _say(f"warning: {line}")
    # A run on Modal: what it would refuse, before the plugin builds its image (a
    # dry run says it as warnings), the budget from the files missing now; at
    # onstart the budget is checked again on Snakemake's plan.
    before_modal_run(
        scenario,
        lambda: _modal_estimate_at_parse(workflow, run),
        remote=not main,
        dryrun=dryrun,
    )
    if main:
        DryRunEstimate(workflow, run).install()
    if dryrun:
        idle_logger_plugin_off(workflow)
    return run


def idle_logger_plugin_off(workflow) -> bool:
    """
    In a dry run, take Snakemake's queue to its logger plugins off its logger when the
    only plugin is the workflow's own (``--logger multigeom``, in every profile): it
    has no view to draw in a dry run and writes nothing (Snakemake's own handler
    writes the messages), yet each record handed to its thread costs tens of
    microseconds, and a dry run logs two per job (3 s of 48 at 40,000 jobs). Returns
    whether it did; other plugins keep their queue.
    """
    from logging.handlers import QueueHandler

    from snakemake_logger_plugin_multigeom import LogHandler

    manager = getattr(workflow, "logger_manager", None)
    listener = getattr(manager, "queue_listener", None)
    plugins = list(getattr(manager, "plugin_handlers", None) or [])
    if listener is None or not plugins:
        return False
    if not all(isinstance(h, LogHandler) and h.idle for h in plugins):
        return False
    for handler in list(manager.logger.handlers):
        if isinstance(handler, QueueHandler) and handler.queue is listener.queue:
            manager.logger.removeHandler(handler)
            return True
    return False


def _modal_estimate_at_parse(workflow, run: Run):
    """The Modal estimate of the per-image files missing now (before the plan)."""
    settings = workflow.resource_settings
    return run_estimates(
        run.scenario,
        progress(run.scenario, with_ceiling=True),
        settings.cores,
        settings.nodes,
        _resources_given(workflow),
    )[1]


def say_encoder_warnings(run: Run, min_val_corr: float, figures: str) -> None:
    """
    One line per demo configuration whose encoder, already fitted, is too poor to
    inform the estimator (its fit report beside the checkpoint;
    `multigeom_workflow.inputs.demo.encoder_warnings`), naming `figures`.
    """
    from .inputs.demo import encoder_warnings

    for c in run.scenario.configurations:
        report = Path(c.encoder_ckpt).with_name("fit_report.json")
        if c.is_demo and report.is_file():
            for line in encoder_warnings(
                f"{c.encoder}/{c.area}",
                json.loads(report.read_text()),
                min_val_corr,
                figures,
            ):
                _say(line)


def register_groups(workflow, run: Run) -> None:
    """
    Make every shard's group (``shard-00``, ``shard-01``, ...) count as the one group
    name "shard", so that a profile's `group-components: [shard=N]` makes one
    submission of up to N images of a shard: Snakemake keys --group-components by that
    parent name, as for groups written with wildcards. This writes Snakemake's internal
    `workflow.parent_groupids` (the mapping it fills for such groups).
    """
    width = max(2, len(str(max(run.n_shards, 1) - 1)))
    for i in range(run.n_shards):
        workflow.parent_groupids[f"{SHARD_GROUP}-{i:0{width}d}"] = SHARD_GROUP
    for shard in set(run.shards.values()):
        workflow.parent_groupids[shard] = SHARD_GROUP


def estimate_resources(run: Run) -> dict:
    """
    The resources of a per-image job (rules estimate_image, estimate_image_ceiling),
    in one place: `gpu`, 1 when it computes on this machine's GPU (remote profiles set
    their own count); `runtime`, its time limit in minutes on SLURM and Modal (a
    function of the job's wildcards, its share of its shard's limit); and for a run
    with the Modal executor plugin, one GPU (``gpu=1``: the Modal profile's limit of
    local scope runs a shard's jobs one per layer, so that Snakemake sums their
    runtimes into the shard's timeout), the GPU type and the budget of the config's
    `modal` section
    (`modal_gpu`, `modal_max_cost_usd`: the plugin reads a job's own values before its
    --modal-gpu and --modal-max-cost-usd), so that the dry run's estimate and the run
    on Modal use one GPU type and one budget (the budget as a string: Snakemake rounds
    a float resource to an integer). Another executor reads neither: a job carries
    none of what its executor does not read (Snakemake formats every resource of each
    of 40,000 jobs in a dry run). On SLURM (on the login node and in a shard's
    allocation) also what a shard needs (`SHARD_RESOURCES`: one GPU, its memory and
    CPU cores, ``mpi=""``), declared here so that a value a profile or the command
    line gives replaces that value only (``--set-resources`` on the command line
    replaces a profile's whole list).
    """
    from snakemake_executor_plugin_modal.preflight import requested_settings

    s = run.scenario
    out = {"gpu": 1 if s.uses_gpu else 0, "runtime": None}
    if run.on_slurm:  # what a shard needs, whatever set-resources replaces
        out.update(SHARD_RESOURCES)
    if (run.slurm or run.modal) and (run.slurm or run.modal).shards:

        def runtime(wildcards) -> int:
            return run.runtime_of(wildcards)

        record_signature(runtime)  # Snakemake reads it at each job otherwise
        out["runtime"] = runtime
    if requested_settings() is not None:  # --executor modal (a profile's too)
        out["gpu"] = 1  # its container's one GPU (the profile's gpu=1, local scope)
        out["modal_gpu"] = s.modal["gpu"]
        out["modal_max_cost_usd"] = str(float(s.modal["max_cost_usd"]))
    return out


def settle_per_image_rules(workflow, name: str = CEILING_RULE) -> None:
    """
    Once both per-image rules are defined: give the rule `name` (the noise ceiling's,
    estimate_image_ceiling) the resources that a profile or the command line sets for
    estimate_image (`set-resources`), except those set for `name` itself: a profile
    names the per-image rule once. Then, for both, what Snakemake would otherwise
    work out again for each of their 40,000 jobs: the resources that read nothing of
    the job (`settle_constant_resources`) and their input functions' signatures
    (`settle_input_functions`).
    """
    from snakemake.resources import Resources

    target = workflow.get_rule(name)
    given = workflow.resource_settings.overwrite_resources
    own = Resources(dict(given.get(target.name, {})))
    shared = Resources(dict(given.get(ESTIMATE_RULE, {})))
    target.resources.update(
        Resources({name: r for name, r in shared.items() if name not in own})
    )
    for rule in map(workflow.get_rule, PER_IMAGE_RULES):
        # the planner's own setting (planning/slurm.py reads the profile's), not a
        # resource a job asks its executor for
        rule.resources = Resources(
            {k: r for k, r in rule.resources.items() if k != CAP_RESOURCE}
        )
        settle_constant_resources(rule)
        settle_input_functions(rule)
    settle_resource_evaluation()


def settle_resource_evaluation() -> None:
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


def record_signature(func, of=None) -> None:
    """
    Record on `func` the parameters Snakemake reads of `of` (default: `func` itself;
    `snakemake.common.get_function_params`), as Snakemake's own ioutils do
    (`snakemake.common.overwrite_function_params`): Snakemake then reads them from
    there instead of calling `inspect.signature` at each call.
    """
    from snakemake.common import get_function_params, overwrite_function_params

    overwrite_function_params(func, get_function_params(func if of is None else of))


def settle_input_functions(rule) -> None:
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
#: (`snakemake.resources.Resource.cli_evaluator`'s namespace, Snakemake 9).
JOB_NAMES = {"wildcards", "input", "attempt", "threads", "async_run"}


def settle_constant_resources(rule) -> None:
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
    job or an ioutils function stay as they are.
    """
    import ast

    import snakemake.ioutils
    from snakemake.resources import Resource

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
            value = Resource.cli_evaluator(
                name, raw, wildcards=None, input=(), attempt=1, async_run=None
            )
            settled = Resource(name, value, raw=raw)
        except Exception:  # Snakemake names the error at the job, as it would
            continue
        rule.resources[name] = settled


def keep_method_line(scenario: Scenario) -> str:
    """
    Choose, once per run on the login node, how the shards keep a second name of
    their finished images (`multigeom_workflow.compute.kept.choose_keep_method`, in
    the first per-image folder: the shared file system the allocations write to),
    hand it to them (``MULTIGEOM_KEEP_BY``: sbatch passes this process's environment),
    and return the line saying it.
    """
    c = scenario.configurations[0]
    folder = os.path.dirname(scenario.per_image_file(c.encoder, c.area, 0))
    try:
        how, why = choose_keep_method(folder)
    except OSError as err:  # the folder cannot be written: the shards will say why
        how, why = "copy", f"{type(err).__name__}: {err}"
    os.environ[KEEP_ENV] = how
    if how == "link":
        return (
            "SLURM shards keep a second name of each finished image by hard link "
            "(in .kept-slurm-<jobid>/ beside the per-image files), taken back if "
            "their allocation ends early"
        )
    return (
        "SLURM shards keep a copy of each finished image (in .kept-slurm-<jobid>/ "
        "beside the per-image files), taken back if their allocation ends early: "
        f"the file system of {folder} refuses hard links between folders ({why})"
    )


#: What the dry run's SLURM line and sbatch --test-only read of a per-image job's
#: resources (plugin's names).
SHARD_ASKS = (
    "gpu",
    "gpu_model",
    "cpus_per_gpu",
    "cpus_per_task",
    "mem_mb",
    "slurm_partition",
    "slurm_account",
    "constraint",
    "qos",
    "slurm_extra",
)


def shard_request(workflow) -> dict[str, str]:
    """
    What each allocation asks SLURM for, from the resources in force of the
    per-image rule (declared in the rule, `SHARD_RESOURCES`, with a profile's or the
    command line's ``set-resources`` applied by Snakemake): name -> value as a
    string, for the names of `SHARD_ASKS` that are set and read nothing of the job.
    """
    from snakemake.resources import Resource

    out = {}
    for name, res in workflow.get_rule(ESTIMATE_RULE).resources.items():
        if name not in SHARD_ASKS:
            continue
        if isinstance(res, Resource):
            if res.is_evaluable():  # reads the job: as written
                value = res.raw
            else:
                value = res.value
        else:
            value = res
        if value is not None and not callable(value):
            out[name] = str(value).strip("'\"")
    return out


def profile_placeholders(workflow) -> list[str]:
    """
    One line per resource value that a profile (or --set-resources) left as the
    profile's placeholder (``SET-...``, e.g. ``slurm_account=SET-your-account``): SLURM
    would refuse such an allocation only once submitted, so the run refuses it first.
    """
    lines = []
    for rule, resources in workflow.resource_settings.overwrite_resources.items():
        for name, value in dict(resources).items():
            value = str(getattr(value, "raw", value)).strip("'\"")  # as written
            if value.startswith(PLACEHOLDER_PREFIX):
                lines.append(
                    f"profile entry set-resources {rule}:{name}={value} is the "
                    "profile's placeholder: give your cluster's value in a copy of the "
                    "profile or with --set-resources, or remove the entry "
                    "(docs/slurm.md)"
                )
    return lines


def planned_per_image(workflow) -> list[tuple[str, tuple[str, str], int]]:
    """
    The per-image jobs Snakemake will run, once its plan is built: (rule, (encoder,
    area), index) for every job of `PER_IMAGE_RULES` among its jobs to run
    (``workflow.dag.needrun_jobs()``), in (rule, configuration, index) order.
    """
    dag = getattr(workflow, "dag", None)
    if dag is None:
        return []
    out = [
        (
            job.rule.name,
            (job.wildcards.encoder, job.wildcards.area),
            int(job.wildcards.index),
        )
        for job in dag.needrun_jobs()
        if job.rule.name in PER_IMAGE_RULES
    ]
    return sorted(out, key=lambda j: (PER_IMAGE_RULES.index(j[0]), j[1], j[2]))


def plan_counts(scenario: Scenario, planned) -> tuple[dict, dict, list]:
    """
    The plan as the estimate reads it: per configuration (first estimates not to be
    computed, n_images) and (second estimates not to be computed, ceiling_images),
    and the images to compute, ((encoder, area), index) in shard order.
    """
    left = {(c.encoder, c.area): [0, 0] for c in scenario.configurations}
    images = {}
    for rule, config, index in planned:
        if config not in left:
            continue
        left[config][rule == CEILING_RULE] += 1
        images[(config, index)] = None
    done = {k: (scenario.n_images - n, scenario.n_images) for k, (n, _) in left.items()}
    ceiling = {
        k: (scenario.ceiling_images - m, scenario.ceiling_images)
        for k, (_, m) in left.items()
    }
    order = {(c.encoder, c.area): i for i, c in enumerate(scenario.configurations)}
    pending = sorted(images, key=lambda ci: (order[ci[0]], ci[1]))
    return done, ceiling, pending


def _resources_given(workflow) -> dict:
    settings = workflow.resource_settings
    return {
        name: getattr(value, "value", value)
        for name, value in dict(settings.resources).items()
        if not name.startswith("_")
    }


def estimates_of_plan(workflow, run: Run, planned):
    """The local and Modal estimates (`run_estimates`) of the planned jobs."""
    done, ceiling, pending = plan_counts(run.scenario, planned)
    settings = workflow.resource_settings
    from .planning.plan import add_progress

    local, modal, why = run_estimates(
        run.scenario,
        add_progress(done, ceiling),
        settings.cores,
        settings.nodes,
        _resources_given(workflow),
        pending=pending,
    )
    return done, ceiling, pending, local, modal, why


def estimate_text(workflow, run: Run, planned) -> list[str]:
    """The lines a dry run prints: the estimate of the plan, and SLURM's."""
    done, ceiling, pending, local, modal, why = estimates_of_plan(
        workflow, run, planned
    )
    lines = estimate_lines(run.scenario, done, ceiling, local, modal, why)
    if run.slurm:  # the shards of Snakemake's plan
        jobs = {}
        for _, config, index in planned:
            jobs[(config, index)] = jobs.get((config, index), 0) + 1
        computations = [(config, i, jobs[(config, i)]) for config, i in pending]
        if run.slurm.shards:  # its timings and MaxTime read once, at parse
            slurm = run.slurm.replanned(computations)
        else:
            slurm = plan_for_run(
                run.scenario,
                workflow.resource_settings,
                run.shards_setting,
                False,
                planned=computations,
                executor=run.executor,
            )
        lines += slurm.lines(shard_request(workflow))
    return lines


def write_plan_file(path: str, run: Run, planned) -> None:
    """The plan as `multigeom-workflow progress` reads it (JSON, `PLAN_FILE_ENV`)."""
    done, ceiling, _ = plan_counts(run.scenario, planned)
    files = _planned_files(run.scenario, planned)
    Path(path).write_text(
        json.dumps(
            {
                "per_image": [[*k, *v] for k, v in done.items()],
                "ceiling": [[*k, *v] for k, v in ceiling.items()],
                "planned": [f for fs in files.values() for f in fs],
            }
        )
    )


class DryRunEstimate(logging.Handler):
    """
    Prints the estimate of Snakemake's plan once it is built: a handler of
    Snakemake's logger that waits for its job statistics (the ``RUN_INFO`` record
    logged after the plan is built, before the job list, in a dry run and in a real
    run) or for its "Nothing to be done" line. In a real run it hands the planned
    per-image files to the live view; the budget check runs at ``onstart``.
    """

    def __init__(self, workflow, run: Run):
        from snakemake.common import NOTHING_TO_BE_DONE_MSG
        from snakemake_interface_logger_plugins.common import LogEvent

        super().__init__(level=logging.INFO)
        self.workflow, self.run, self.done = workflow, run, False
        self._run_info, self._nothing = LogEvent.RUN_INFO, NOTHING_TO_BE_DONE_MSG

    def install(self) -> None:
        """Attach to Snakemake's logger (``snakemake.logging.logger``)."""
        from snakemake.logging import logger

        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        """
        On the plan's statistics (or nothing to do): the estimate, once. Any other
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
        try:
            planned = [] if event is None else planned_per_image(self.workflow)
            if os.environ.get(PLAN_FILE_ENV):
                write_plan_file(os.environ[PLAN_FILE_ENV], self.run, planned)
            if self.workflow.output_settings.dryrun:
                _say("\n".join(estimate_text(self.workflow, self.run, planned)))
            else:
                set_plan(_planned_files(self.run.scenario, planned))
        except Exception as err:  # never let the estimate stop Snakemake
            _say(f"warning: the estimate failed: {type(err).__name__}: {err}")


def _planned_files(scenario: Scenario, planned) -> dict[str, list[str]]:
    """The planned per-image files by configuration ("encoder/area"), and the noise
    ceiling's second estimates in a row of their own (`settings.names.CEILING_ROW`), as
    the dry run's estimate and ``multigeom-workflow progress`` show them.
    """
    out = {f"{c.encoder}/{c.area}": [] for c in scenario.configurations}
    if scenario.ceiling_images:
        out[CEILING_ROW] = []
    for rule, (encoder, area), index in planned:
        if rule == ESTIMATE_RULE:
            row, path = f"{encoder}/{area}", scenario.per_image_file
        else:
            row, path = CEILING_ROW, scenario.ceiling_file
        out.setdefault(row, []).append(path(encoder, area, index))
    return out


def on_start(workflow, run: Run) -> None:
    """
    At the start of a real run (``onstart``), once Snakemake holds the working
    directory and its plan: remove what killed runs left (ended runs' sockets and
    CPU shares, temporary folders beside per-image files); on this machine's GPUs,
    start no more per-image jobs than there are GPUs (the `gpu` resource, unless
    --resources gpu=N gave it); then `check_before_first_job`.
    """
    s = run.scenario
    clean_after_killed_runs(
        folder
        for c in s.configurations
        for folder in (
            os.path.dirname(s.per_image_file(c.encoder, c.area, 0)),
            os.path.dirname(s.ceiling_file(c.encoder, c.area, 0)),
        )
    )
    given = dict(workflow.resource_settings.resources)
    scheduler = getattr(workflow, "scheduler", None)
    if workflow.local_exec and s.uses_gpu and "gpu" not in given and scheduler:
        workflow.scheduler.global_resources["gpu"] = s.gpu_slots
        workflow.scheduler.resources["gpu"] = s.gpu_slots
    check_before_first_job(workflow, run)
    if getattr(workflow.executor_plugin, "name", None) == "slurm":
        before_slurm_submissions(workflow, run)


def before_slurm_submissions(workflow, run: Run) -> None:
    """
    At the start of a real run with ``--executor slurm``, before any submission:
    every way an allocation ends seen as an end (`multigeom_workflow.on_slurm.status`,
    over the plugin's status query), and the allocations an earlier run of this
    working directory left running cancelled (`multigeom_workflow.on_slurm
    .allocations`: its Snakemake ended abruptly), so that no image computes twice
    at once.
    """
    from .compute.kept import kept_files, put_back
    from .on_slurm import allocations, status
    from .planning.slurm import per_image_folders

    folders = per_image_folders(run.scenario)

    def kept(ids: list[str]) -> int:
        return len(kept_files(folders, ids))

    def put_back_removed(ids: list[str]) -> None:
        # what their Snakemake removed as it was cancelled, after this run planned
        # with it there: back from their kept folders (kept for later shards)
        put_back(folders, ids)

    status.install()
    line = allocations.cancel_earlier_allocations(
        str(workflow.workdir_init), kept=kept, ended=put_back_removed
    )
    if line:
        _say(line)


def check_before_first_job(workflow, run: Run) -> None:
    """
    At the start of a real run, where the executor is known: local runs need
    torchvision's weights (`Scenario.blockers`); on Modal the container image holds
    them, and the per-image jobs of Snakemake's plan must fit the budget
    (``modal.max_cost_usd``) at the config's ``modal.gpu`` (what else a run on Modal
    would refuse was said before the image was built:
    `multigeom_workflow.on_modal.preflight`); a local run with ``device: cuda``
    (or ``cuda:N``) asked for on a machine without GPU is refused (``auto`` falls
    back to the CPU with a notice). A profile's placeholder (`profile_placeholders`)
    stops any run.

    Raises
    ------
    SystemExit
        With one ``config error:`` line (or the budget's line).
    """
    s = run.scenario
    for line in profile_placeholders(workflow):
        sys.exit(f"config error: {line}")
    name = getattr(workflow.executor_plugin, "name", None)
    if name == "slurm":  # sacct without job accounting: the run would never end
        status = getattr(workflow.executor_settings, "status_command", None)
        problem = status_query_problem(status)
        if problem:
            sys.exit(f"config error: {problem}")
        if run.slurm and run.slurm.limits:  # sbatch's own words if it refuses
            problem = submission_problem(shard_request(workflow), max(run.slurm.limits))
            if problem:
                sys.exit(f"config error: {problem}")
    if name != "modal":
        for problem in s.blockers:
            sys.exit(f"config error: {problem}")
    if name == "local" and s.gpu_fallback and s.device_asked != "auto":
        sys.exit(
            f"config error: config key 'device' = {s.device_asked!r}: this "
            "machine shows no GPU and a local run computes here; allowed for a local "
            "run: auto or cpu (with the Modal or SLURM profile the jobs run on their "
            "GPUs)"
        )
    if name == "modal":  # the rest was refused before the image was built
        modal = estimates_of_plan(workflow, run, planned_per_image(workflow))[4]
        problem = budget_problem(modal, s.modal["max_cost_usd"])
        if problem:
            sys.exit(problem)
