"""
What a run on a SLURM cluster (``profiles/slurm``) checks and prepares on the login
node, before Snakemake plans the jobs: per-image files of allocations that ended
early put back (`restore_ended_allocations`), and a cluster without job accounting
named before the run hangs on it (`status_query_problem`).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ..compute.kept import restore_after_ended_allocations
from ..scenario import Scenario

__all__ = ["restore_ended_allocations", "status_query_problem"]


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
