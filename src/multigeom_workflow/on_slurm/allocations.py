"""
Allocations that an earlier run of the same working directory left running: its
Snakemake on the login node ended abruptly (``kill -9``, a dropped ssh session, the
login node rebooted) while its shards ran on. A new run would submit the same images
again while they still compute. At the start of a real run (``onstart``, once
Snakemake holds the working directory), before any submission, the new run cancels
them (``scancel``), waits until SLURM has ended them, and says so in one line; the
images they finished are kept (`multigeom_workflow.compute.kept`) and taken back by
the new shards instead of being computed again.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import time
from collections.abc import Callable

from ..settings.names import PER_IMAGE_RULES
from ..settings.slurm_states import LIVE_STATES

__all__ = ["cancel_earlier_allocations", "earlier_allocations"]

#: Seconds to wait for cancelled allocations to end (SLURM's KillWait is 30 s by
#: default: SIGTERM, then SIGKILL).
WAIT_S = 300.0


def _squeue(args: list[str]) -> list[list[str]] | None:
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", *args], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # every job asked for by id is gone from the controller: none is held
        return [] if "Invalid job id" in out.stderr else None
    return [line.split("|", 3) for line in out.stdout.splitlines() if line.strip()]


def earlier_allocations(workdir: str, query=_squeue) -> list[tuple[str, str]]:
    """
    The allocations of this user still queued or running whose working directory is
    `workdir` and that run the workflow's per-image jobs (their comment names a
    per-image rule: the plugin's ``--comment rule_<name>_...``).

    Returns
    -------
    list of (job id, state)
    """
    rows = query(["-u", getpass.getuser(), "-o", "%i|%T|%Z|%k"]) or []
    here = os.path.realpath(workdir)
    out = []
    for row in rows:
        if len(row) != 4:
            continue
        job, state, folder, comment = row
        if state not in LIVE_STATES or os.path.realpath(folder) != here:
            continue
        if any(rule in comment for rule in PER_IMAGE_RULES):
            out.append((job, state))
    return out


def cancel_earlier_allocations(
    workdir: str,
    query=_squeue,
    cancel: Callable[[list[str]], None] | None = None,
    wait_s: float = WAIT_S,
    kept: Callable[[list[str]], int] | None = None,
    ended: Callable[[list[str]], None] | None = None,
) -> str | None:
    """
    Cancel the allocations `earlier_allocations` finds and wait until SLURM has
    ended them; `kept` counts the finished images the given allocations kept
    (said in the line); `ended` is called with their ids once they have ended.

    Returns
    -------
    str or None
        The line saying what was cancelled (None when nothing was running).

    Raises
    ------
    SystemExit
        With one ``config error:`` line when they have not ended after `wait_s`.
    """
    found = earlier_allocations(workdir, query)
    if not found:
        return None
    ids = [job for job, _ in found]
    if cancel is None:
        subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)
    else:
        cancel(ids)
    deadline = time.monotonic() + wait_s
    while True:
        rows = query(["--states=all", "-j", ",".join(ids), "-o", "%i|%T|%Z|%k"])
        left = [r[0] for r in rows or [] if len(r) == 4 and r[1] in LIVE_STATES]
        if rows is not None and not left:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"config error: SLURM allocation(s) {', '.join(left or ids)} of an "
                f"earlier run of {workdir} still run after scancel ({wait_s:g} s): "
                "start the run again once `squeue -j "
                f"{','.join(left or ids)}` lists none"
            )
        time.sleep(2)
    if ended is not None:
        ended(ids)
    listed = ", ".join(f"{job} {state}" for job, state in found)
    finished = (
        "the images they finished"
        if kept is None
        else (f"the {kept(ids)} image(s) they finished")
    )
    return (
        f"cancelled {len(found)} SLURM allocation(s) of an earlier run of this "
        f"working directory that were still queued or running ({listed}): its "
        f"Snakemake had ended without them; {finished} are kept and taken back, the "
        "rest computed by this run"
    )
