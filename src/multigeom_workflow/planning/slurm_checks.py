"""
What a run on a SLURM cluster checks and prepares on the login node, beside its shard
plan (`multigeom_workflow.planning.slurm`): per-image files of allocations that ended
early put back (`restore_ended_allocations`), a cluster without job accounting named
before the run hangs on it (`status_query_problem`), a shard's request tried with
``sbatch --test-only`` (`submission_problem`), how finished files are kept
(`keep_method_line`), and a profile's values left to set (`profile_placeholders`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from ..compute.kept import (
    KEEP_ENV,
    choose_keep_method,
    restore_after_ended_allocations,
)
from ..scenario import Scenario

__all__ = [
    "ACCOUNTING_DISABLED",
    "PLACEHOLDER_PREFIX",
    "SHARD_ASKS",
    "keep_method_line",
    "per_image_folders",
    "profile_placeholders",
    "restore_ended_allocations",
    "shard_request",
    "status_query_problem",
    "submission_problem",
]


def _given(resources: dict, name: str) -> str | None:
    """A resource as given (name -> value as written), quotes off; None if not."""
    value = resources.get(name)
    return None if value is None else str(value).strip("'\"")


def per_image_folders(scenario: Scenario) -> list[str]:
    """The run's per-image folders: each configuration's, and the noise ceiling's."""
    return sorted(
        {
            os.path.dirname(path(c.encoder, c.area, 0))
            for c in scenario.configurations
            for path in (scenario.per_image_file, scenario.ceiling_file)
        }
    )


def restore_ended_allocations(scenario: Scenario) -> str | None:
    """
    Put back the per-image files that SLURM allocations finished before they ended
    early (time limit, ``scancel``, preemption, node failure) and Snakemake removed
    with their shard (`multigeom_workflow.compute.kept`).

    Returns
    -------
    str or None
        One line saying how many files came back and from which allocations (job id
        and state), or None when nothing did.
    """
    restored, ended = restore_after_ended_allocations(per_image_folders(scenario))
    if not restored:
        return None
    return (
        f"restored {len(restored)} per-image file(s) finished in SLURM allocation(s) "
        f"that ended early ({', '.join(ended)}): Snakemake had removed them with "
        "their shard; only the images still missing are computed"
    )


#: What ``sacct`` prints on a cluster without job accounting (SLURM 22.05 to 24.x).
ACCOUNTING_DISABLED = "accounting storage is disabled"


def status_query_problem(status_command: str | None) -> str | None:
    """
    The line that stops a SLURM run whose job-status query cannot work: the plugin
    reads job states with ``sacct`` (its default), which on a cluster without job
    accounting answers "Slurm accounting storage is disabled", so that the run never
    sees a shard end.

    Parameters
    ----------
    status_command : str or None
        The plugin's setting ``--slurm-status-command`` (``sacct``, ``squeue``, or
        None for its default).

    Returns
    -------
    str or None
        The problem, naming the setting to give, or None when the query works (or
        ``sacct`` is not there, where the plugin uses ``squeue`` itself).
    """
    if status_command == "squeue" or shutil.which("sacct") is None:
        return None
    try:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-o", "JobID", "-S", "now"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    said = (out.stdout + out.stderr).strip()
    if ACCOUNTING_DISABLED not in said.lower():
        return None
    first = said.splitlines()[0]
    return (
        f"this SLURM cluster keeps no job accounting (sacct: {first!r}): "
        "the plugin's status query by sacct would never see a shard end; set "
        "`slurm-status-command: squeue` in the profile (or --slurm-status-command "
        "squeue; it needs MinJobAge of 120 s or more: scontrol show config | grep "
        "MinJobAge)"
    )


def submission_problem(resources, minutes: int) -> str | None:
    """
    The line that stops a SLURM run whose shards' allocation SLURM would refuse,
    with sbatch's own words: ``sbatch --test-only`` with what a shard asks for (the
    per-image rule's ``set-resources``: account, partition, GPUs, CPUs per GPU,
    memory, constraint, QOS, ``slurm_extra``, and the longest shard's time limit).
    Snakemake reports a refused submission of a group as "Error in group ...
    message: None", without them (snakemake-executor-plugin-slurm issue #456).

    Parameters
    ----------
    resources
        The per-image rule's resources as a profile gives them (name -> value).
    minutes : int
        The longest shard's time limit.

    Returns
    -------
    str or None
        The problem, or None when sbatch accepts the request (or is not there).
    """
    if shutil.which("sbatch") is None:
        return None
    get = lambda name: _given(resources, name)  # noqa: E731
    args = ["sbatch", "--test-only", "--parsable", f"--time={max(int(minutes), 1)}"]
    for name, flag in (
        ("slurm_account", "--account"),
        ("slurm_partition", "--partition"),
        ("constraint", "--constraint"),
        ("qos", "--qos"),
    ):
        if get(name):
            args.append(f"{flag}={get(name)}")
    gpus = get("gpu")
    if gpus and gpus != "0":
        model = get("gpu_model")
        args.append(f"--gpus={model}:{gpus}" if model else f"--gpus={gpus}")
        if get("cpus_per_gpu"):
            args.append(f"--cpus-per-gpu={get('cpus_per_gpu')}")
    if get("cpus_per_task"):
        args.append(f"--cpus-per-task={get('cpus_per_task')}")
    if get("mem_mb"):
        args.append(f"--mem={get('mem_mb')}")
    if get("slurm_extra"):
        args += shlex.split(get("slurm_extra"))
    args.append("--wrap=true")
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode == 0:
        return None
    said = " ".join((out.stderr or out.stdout).split())
    said = said or f"exit status {out.returncode}"
    return (
        f"SLURM refuses the shards' allocation: {said} (asked: "
        f"{shlex.join(args[3:-1])}, the per-image rule's set-resources in the profile "
        'and the longest shard\'s time limit; `sinfo -o "%P %l %c %m %G"` lists what '
        "the partitions allow)"
    )


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


def shard_request(resources: dict) -> dict[str, str]:
    """
    What each allocation asks SLURM for, from the resources in force of the
    per-image rule (`multigeom_workflow.snakemake_adapter.resources_in_force`:
    declared in the rule, `SHARD_RESOURCES`, with a profile's or the command line's
    ``set-resources`` applied by Snakemake): name -> value as a string, for the names
    of `SHARD_ASKS` that are set.
    """
    return {
        name: str(value).strip("'\"")
        for name, value in resources.items()
        if name in SHARD_ASKS
    }


#: How a profile marks a value its user must set (profiles/slurm): a run refuses it.
PLACEHOLDER_PREFIX = "SET-"


def profile_placeholders(given) -> list[str]:
    """
    One line per resource value that a profile (or --set-resources) left as the
    profile's placeholder (``SET-...``, e.g. ``slurm_account=SET-your-account``): SLURM
    would refuse such an allocation only once submitted, so the run refuses it first.

    Parameters
    ----------
    given : multigeom_workflow.snakemake_adapter.GivenResources
    """
    lines = []
    for rule, resources in given.per_rule.items():
        for name, value in resources.items():
            if value.startswith(PLACEHOLDER_PREFIX):
                lines.append(
                    f"profile entry set-resources {rule}:{name}={value} is the "
                    "profile's placeholder: give your cluster's value in a copy of the "
                    "profile or with --set-resources, or remove the entry "
                    "(docs/slurm.md)"
                )
    return lines
