"""
What the workflow does when Snakemake parses it and when a run starts and ends.

`start` (called by rules/common.smk) reads the configuration, changes what must change
before Snakemake plans (`multigeom_workflow.planning.before_planning`; a dry run
changes nothing), hands the run's settings to the per-image jobs, plans a SLURM or
Modal run's shards and registers their groups, and installs the estimate of the plan;
`on_start` and `on_end` are the rule files' ``onstart`` and ``onsuccess``/``onerror``.
Every read of or write to Snakemake goes through `multigeom_workflow.on_snakemake
.adapter`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .. import snakemake_adapter as adapter
from ..compute.allocator import keep_freed_memory
from ..compute.gpus import allocation_lock_dir, slot_lock_problem
from ..compute.request import RunSettings
from ..compute.workers import clean_after_killed_runs
from ..on_modal.preflight import before_modal_run
from ..planning.before_planning import before_planning, record_contents
from ..planning.cost import budget_problem
from ..planning.plan import pending_images
from ..planning.shards import num_shards, shard_groups
from ..planning.slurm import modal_plan, plan_for_run
from ..planning.slurm_checks import (
    keep_method_line,
    profile_placeholders,
    shard_request,
    status_query_problem,
    submission_problem,
)
from ..scenario import ConfigError, Scenario, validated_scenario
from ..settings.files import resolve_settings_file
from ..settings.identity import recorded_in_canonical_form
from ..settings.load import SNAKEFILE_CONFIGFILE, defaults_taken, defaults_taken_line
from ..settings.names import ESTIMATE_RULE
from ..settings.seeds import job_seeds
from ..snakemake_adapter import Facts
from . import estimate
from .groups import register_groups
from .run import Run, executor_in_use, say

__all__ = [
    "check_before_first_job",
    "on_end",
    "on_start",
    "say_encoder_warnings",
    "start",
]


def check_installed_package(facts: Facts) -> None:
    """
    A warning line when the `multigeom_workflow` package Python imports is not this
    workflow's own (``src/`` beside the Snakefile): another checkout installed in the
    environment would run its code with this workflow's rules.
    """
    here = os.path.realpath(os.path.join(facts.basedir, "src"))
    package = os.path.dirname(os.path.dirname(__file__))  # .../multigeom_workflow
    imported = os.path.realpath(os.path.dirname(package))
    if facts.main and imported != here:
        say(
            f"warning: the multigeom_workflow package imported is "
            f"{imported}/multigeom_workflow, not this workflow's "
            f"({here}/multigeom_workflow): run `pip install -e .` in "
            f"{facts.basedir} to use this checkout"
        )


def _before_planning(scenario: Scenario, dryrun: bool) -> list[str]:
    """
    Before Snakemake plans (`multigeom_workflow.planning.before_planning`): in a real
    run, files kept by SLURM allocations that ended early put back, unchanged inputs'
    dates kept, changed per-image files checked and bad ones set aside; a dry run
    changes nothing and says what would be done. Either way Snakemake is shown the
    files as the real run leaves them (`show_snakemake`), so that its plan is the
    real run's. A command that runs no job (``--summary``, ``--list-changes``, ...:
    `adapter.inspection_only`) changes nothing either. Returns the inputs whose
    recorded date could not be set (kept as recorded at the run's end).
    """
    done = before_planning(scenario, dry=dryrun or adapter.inspection_only())
    for line in done.lines:
        say(line)
    adapter.show_snakemake(done.view)
    return done.refused_dates


def _export_run_settings(facts: Facts, config: dict, scenario: Scenario) -> None:
    """
    What every per-image job of this run shares, resolved once and handed to them in
    the environment (they inherit it; `RunSettings.to_env`), with the allocator's
    settings (`compute.allocator.keep_freed_memory`). In a SLURM allocation (a shard,
    profiles/slurm) every per-image job is a Snakemake process of its own: they keep
    the allocation's first Snakemake as their run, so that one warm worker serves the
    whole shard, with slot locks of the allocation's own (SLURM numbers every
    allocation's GPUs from 0, and allocations may share a node).
    """
    # every job's malloc keeps what torch frees (compute/allocator.py: the demo's
    # system time was page faults)
    keep_freed_memory()
    slurm_job = os.environ.get("SLURM_JOB_ID", "")
    if slurm_job and os.environ.get("MULTIGEOM_SLURM_JOB_ID") == slurm_job:
        return  # a later Snakemake process of the same allocation
    os.environ.update(
        RunSettings(
            run_id=str(os.getpid()),
            device=scenario.device,
            gpu_ids=list(scenario.gpu_ids),
            # in an allocation: one share, one warm worker (compute/gpus.py)
            cpu_slots=1 if slurm_job else int(facts.cores or 1),
            warm=scenario.warm_workers,
            settings_files={
                key: str(resolve_settings_file(str(config[key]), key, facts.basedir))
                for key in ("estimator", "diffusion")
            },
            engine=scenario.engine,
            precision=scenario.precision,
            # what the per-image rules' params hold (rules/estimate.smk, science.smk)
            estimator=scenario.estimator,
            seeds=job_seeds(scenario),
            diffusion=scenario.diffusion,
            configurations=_own_settings(scenario),
        ).to_env(),
        MULTIGEOM_SLURM_JOB_ID=slurm_job,
        # a shard submitted by this workflow (not a local run inside an allocation):
        # its finished files are kept if it ends early (compute/kept.py)
        MULTIGEOM_SLURM_SHARD=slurm_job if facts.remote else "",
    )
    if slurm_job:
        problem = slot_lock_problem()  # one line before any job, not one in each
        if problem:
            sys.exit(problem)
        os.environ.update(MULTIGEOM_GPU_LOCK_DIR=str(allocation_lock_dir(slurm_job)))


def _defaults_taken(workflow, scenario: Scenario, facts: Facts) -> str | None:
    """
    The line naming what a ``--configfile`` left to config/config.yaml (the demo's
    values; `multigeom_workflow.settings.load.defaults_taken`), or None. The demo's
    own keys are left out when no configuration is a demo area.
    """
    import yaml

    given = adapter.configfile_values(workflow)
    if given is None or not Path(SNAKEFILE_CONFIGFILE).is_file():
        return None
    schema_file = Path(facts.basedir) / "config" / "schemas" / "config.schema.yaml"
    taken = defaults_taken(
        adapter.read_config_file(SNAKEFILE_CONFIGFILE),
        given,
        yaml.safe_load(schema_file.read_text()),
        skip=() if any(c.is_demo for c in scenario.configurations) else ("demo",),
    )
    return defaults_taken_line(taken)


def _own_settings(scenario: Scenario) -> dict:
    """
    ``RunSettings.configurations``: each configuration's architecture and, where they
    differ from the run's, its estimator settings (without its seed), diffusion
    settings and settings files (config keys ``configs[i].estimator``, ``.diffusion``,
    ``.sigma``).
    """
    out = {}
    for c in scenario.configurations:
        own: dict = {"architecture": c.architecture}
        if c.estimator != scenario.estimator:
            own["estimator"] = c.estimator
        if c.diffusion != scenario.diffusion:
            own["diffusion"] = c.diffusion
        if (c.estimator_file, c.diffusion_file) != (
            scenario.estimator_file,
            scenario.diffusion_file,
        ):
            own["settings_files"] = {
                "estimator": str(c.estimator_file),
                "diffusion": str(c.diffusion_file),
            }
        out[c.label] = own
    return out


def start(workflow, config: dict) -> Run:
    """
    `_start`, and one line for each Snakemake internal whose use is switched off
    (`snakemake_adapter.switched_off_lines`, before any job, not in a job's own
    Snakemake). An internal the workflow cannot do without (`adapter.InternalChanged`)
    stops the run with one ``error:`` line and exit status 1.
    """
    try:
        run = _start(workflow, config)
    except adapter.InternalChanged as err:
        sys.exit(f"error: {err}")
    for line in adapter.switched_off_lines():
        if run.facts is None or run.facts.main:
            say(f"warning: {line}")
    return run


def _start(workflow, config: dict) -> Run:
    """
    Everything the workflow does when Snakemake parses it, in order: the package
    check, the configuration (one ``config error:`` line and exit status 1 on a bad
    value), its notices, the inputs' dates and the changed per-image files
    (`_before_planning`, not inside a remote job; a dry run changes nothing), the
    run settings handed to the jobs, the shard groups of a remote executor, a SLURM
    run's time limit, and the dry run's estimate (`estimate.install`).

    Returns
    -------
    Run

    Raises
    ------
    SystemExit
        With one ``config error: ...`` line, on a bad configuration.
    """
    facts = adapter.facts(workflow)
    check_installed_package(facts)
    adapter.fewer_collections()
    # Older runs recorded their settings as written (multigeom_workflow.settings
    # .identity): read in today's canonical form, or one line if Snakemake changed.
    adapter.read_recorded_params_as(recorded_in_canonical_form)
    remote = facts.remote
    try:
        scenario = validated_scenario(config, facts.basedir, remote)
    except ConfigError as err:
        # Snakemake would wrap a raised error in a traceback of the rule files.
        sys.exit(f"config error: {err}")
    dryrun = facts.dryrun
    if dryrun:
        for problem in scenario.blockers:
            say(f"warning: {problem}")
    # (the notes include the one for test images not 64 x 64: the scenario's check
    # of the images, one pass)
    for line in (
        scenario.gpu_fallback,
        *scenario.notes,
        scenario.stage5_skipped,
        scenario.draws_control_line,
        _defaults_taken(workflow, scenario, facts) if facts.main else None,
    ):
        if line:
            say(line)
    main = facts.main  # not a job's own Snakemake (remote, subprocess)
    refused_dates = _before_planning(scenario, dryrun) if main else []
    _export_run_settings(facts, config, scenario)

    given = adapter.given_resources(workflow)
    run = Run(
        scenario=scenario,
        shards_setting=config["shards"],
        executor=executor_in_use(adapter.executor_from_command_line(), given),
        facts=facts,
        given=given,
        refused_dates=refused_dates,
    )
    # Groups matter only where Snakemake submits them: remote executors, which
    # require --jobs (and the jobs they run remotely). Local runs ignore groups, and
    # a dry run submits nothing (its estimate makes the shards of the plan itself):
    # grouping 40,000 jobs costs Snakemake minutes.
    run.sharded = not main or (facts.nodes is not None and not dryrun)
    # A run for SLURM (profiles/slurm asks SLURM resources of the per-image jobs):
    # shards whose time limits fit the cluster's cap, more of them where needed
    # (docs/slurm.md); planned on the login node only.
    try:
        run.slurm = plan_for_run(
            scenario,
            run.given,
            facts.nodes,
            config["shards"],
            not main,
            executor=run.executor,
            # read only where a SLURM plan is made (a local run, a job's own
            # Snakemake in an allocation or a container reads no per-image file)
            timings=run.timings if main and run.executor == "slurm" else None,
        )
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    if run.slurm:
        run.runtimes = run.slurm.runtimes()
    if run.slurm and not dryrun:  # hard links, or copies where they are refused
        say(keep_method_line(scenario))
    if run.slurm and not dryrun:
        for line in run.slurm.over_cap():  # a dry run lists them with its plan
            say(f"warning: {line}")
    if run.sharded:
        run.n_shards = num_shards(config["shards"], facts.nodes)
        if run.on_modal:
            # on Modal: each shard's timeout (and the budget guard's worst case)
            # from its work, not the profile's 6 h
            run.modal = modal_plan(scenario, run.n_shards, run.timings)
            run.runtimes = run.modal.runtimes()
        if run.slurm or run.modal:
            plan = run.slurm or run.modal
            run.shards = plan.groups()
            run.n_shards = max(len(plan.shards), 1)
        else:
            run.shards = shard_groups(pending_images(scenario), run.n_shards)
        register_groups(workflow, run)
    if dryrun:
        for line in profile_placeholders(run.given):
            say(f"warning: {line}")
    # A run on Modal: what it would refuse, before the plugin builds its image (a
    # dry run says it as warnings), the budget from the files missing now; at
    # onstart the budget is checked again on Snakemake's plan. (Only on Modal: a
    # local or SLURM-only install has no Modal plugin.)
    if run.on_modal:
        before_modal_run(
            scenario,
            lambda: estimate.modal_estimate_now(run),
            remote=not main,
            dryrun=dryrun,
        )
    if main:
        estimate.install(workflow, run)
    if dryrun:
        from snakemake_logger_plugin_multigeom import LogHandler

        adapter.idle_logger_plugin_off(workflow, LogHandler)
    return run


def say_encoder_warnings(run: Run, min_val_corr: float, figures: str) -> None:
    """
    One line per demo configuration whose encoder, already fitted, is too poor to
    inform the estimator (its fit report beside the checkpoint;
    `multigeom_workflow.inputs.demo.encoder_warnings`), naming `figures`.
    """
    from ..inputs.demo import encoder_warnings

    for c in run.scenario.configurations:
        report = Path(c.encoder_ckpt).with_name("fit_report.json")
        if c.is_demo and report.is_file():
            for line in encoder_warnings(
                f"{c.encoder}/{c.area}",
                json.loads(report.read_text()),
                min_val_corr,
                figures,
            ):
                say(line)


def on_end(workflow, run: Run) -> None:
    """
    At the end of a real run (``onsuccess``, ``onerror``): the inputs it made
    (checkpoints, the demo's data, test images) recorded with their content, so that
    a later date change (``touch``, ``cp -r``) recomputes nothing; and one line per
    GPU this run stopped (its CUDA context failed in two workers in a row:
    `multigeom_workflow.compute.gpus.stop_gpu`), which only its job's log said.
    """
    if run.facts.main:
        record_contents(run.scenario, restore=False, keep=run.refused_dates)
        from ..compute.gpus import stopped_gpus

        for _, line in sorted(stopped_gpus(RunSettings.from_env().run_id).items()):
            say(f"warning: {line}")


def on_start(workflow, run: Run) -> None:
    """
    At the start of a real run (``onstart``), once Snakemake holds the working
    directory and its plan: remove what killed runs left (ended runs' sockets and
    CPU shares, temporary folders beside per-image files), after one line and the
    end of the run if the folder of the slot locks refuses them
    (`multigeom_workflow.compute.gpus.slot_lock_problem`); on this machine's GPUs,
    start no more per-image jobs than there are GPUs (the `gpu` resource, unless
    --resources gpu=N gave it); then `check_before_first_job`.
    """
    s = run.scenario
    # the per-image jobs hold GPU slots (or CPU shares) here: one line before any job
    # if the folder of their locks refuses them (compute/lock_folder.py)
    problem = slot_lock_problem() if run.facts.local else None
    if problem:
        sys.exit(problem)
    clean_after_killed_runs(
        folder
        for c in s.configurations
        for folder in (
            os.path.dirname(s.per_image_file(c.encoder, c.area, 0)),
            os.path.dirname(s.ceiling_file(c.encoder, c.area, 0)),
        )
    )
    if run.facts.local and s.uses_gpu and "gpu" not in run.given.limits:
        adapter.limit_local_gpus(workflow, s.gpu_slots)
    check_before_first_job(workflow, run)
    if run.executor == "slurm":
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
    from ..compute.kept import kept_files, put_back
    from ..on_slurm import allocations, status
    from ..planning.slurm_checks import per_image_folders

    folders = per_image_folders(run.scenario)

    def kept(ids: list[str]) -> int:
        return len(kept_files(folders, ids))

    def put_back_removed(ids: list[str]) -> None:
        # what their Snakemake removed as it was cancelled, after this run planned
        # with it there: back from their kept folders (kept for later shards)
        put_back(folders, ids)

    status.install()
    line = allocations.cancel_earlier_allocations(
        adapter.submit_dir(workflow), kept=kept, ended=put_back_removed
    )
    if line:
        say(line)


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
    for line in profile_placeholders(run.given):
        sys.exit(f"config error: {line}")
    name = run.executor
    if name == "slurm":  # sacct without job accounting: the run would never end
        problem = status_query_problem(adapter.slurm_status_command(workflow))
        if problem:
            sys.exit(f"config error: {problem}")
        if run.slurm and run.slurm.limits:  # sbatch's own words if it refuses
            asked = shard_request(adapter.resources_in_force(workflow, ESTIMATE_RULE))
            problem = submission_problem(asked, max(run.slurm.limits))
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
        modal = estimate.estimates_of_plan(run, estimate.the_plan(workflow, run))[4]
        problem = budget_problem(modal, s.modal["max_cost_usd"])
        if problem:
            sys.exit(problem)
