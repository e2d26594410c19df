"""
Per-image files finished in a SLURM allocation that then ended early (time limit,
``scancel``, preemption, a node failing) are kept, not lost.

A shard is one Snakemake group job, one allocation. When the allocation ends before
all of its images are done, Snakemake on the login node fails the whole group and
removes the outputs of every job of it, finished ones included ("Removing output
files of failed job ... since they might be corrupted": Snakemake 9.27,
``jobs.py``, ``Job.postprocess(error=True)`` then ``Job.cleanup``; the per-image
files cannot be corrupted here, each one is renamed into place only when complete).
So every per-image job run in an allocation also hard-links its finished file into a
folder of that allocation beside it (``.kept-slurm-<jobid>/img0005.pt``: no copy, the
same file under a second name Snakemake does not know), and:

- a job whose file is missing takes it back from such a folder of another allocation
  of the run instead of computing it (Snakemake's ``--retries`` resubmits a failed
  shard whole: its finished images come back in milliseconds);
- at the start of a run, on the login node, before Snakemake plans what is left
  (`restore_after_ended_allocations`), the folders of allocations that SLURM says did
  not complete put back the files Snakemake removed; those of allocations that
  completed are dropped (their files were accepted; one removed since was removed on
  purpose and is computed again).

Snakemake's own record of the file (``.snakemake/metadata``: written before it removed
the file) still holds its params, so a file put back is recomputed only if the
settings changed since (the profile's ``rerun-triggers``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = [
    "KEPT_PREFIX",
    "drop_kept",
    "keep_finished",
    "restore_after_ended_allocations",
    "slurm_job_states",
    "take_kept",
]

#: The folder beside a per-image file that keeps what one allocation finished.
KEPT_PREFIX = ".kept-slurm-"
#: SLURM states of a job that has not ended (its folder is left as it is).
ACTIVE_STATES = {
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
    "COMPLETING",
    "CONFIGURING",
    "PREEMPTED",  # requeued after preemption: SLURM runs it again
}


#: Set by the workflow (multigeom_workflow.snakemake_hooks) to the allocation's job
#: id in a shard it submitted; a local run inside an interactive allocation keeps
#: nothing.
SHARD_ENV = "MULTIGEOM_SLURM_SHARD"


def _job_id() -> str | None:
    job = os.environ.get("SLURM_JOB_ID")
    return job if job and os.environ.get(SHARD_ENV) == job else None


def keep_finished(out: str | Path, job_id: str | None = None) -> Path | None:
    """
    Keep a finished per-image file of an allocation under a second name.

    Parameters
    ----------
    out : str or Path
        The per-image file, complete.
    job_id : str, optional
        The allocation (default ``$SLURM_JOB_ID`` in a shard the workflow submitted,
        `SHARD_ENV`); elsewhere nothing is done.

    Returns
    -------
    Path or None
        The kept name (``<folder>/.kept-slurm-<jobid>/<name>``), a hard link to `out`.
    """
    job_id = job_id or _job_id()
    if not job_id:
        return None
    out = Path(out)
    kept = out.parent / f"{KEPT_PREFIX}{job_id}" / out.name
    kept.parent.mkdir(exist_ok=True)
    kept.unlink(missing_ok=True)
    os.link(out, kept)
    return kept


def take_kept(out: str | Path, job_id: str | None = None) -> Path | None:
    """
    Put back a per-image file that another allocation of the run finished and
    Snakemake removed with its failed shard.

    Parameters
    ----------
    out : str or Path
        The per-image file the job is to write (missing).
    job_id : str, optional
        This allocation (default as for `keep_finished`); elsewhere nothing is done.

    Returns
    -------
    Path or None
        The kept file linked back to `out` (its modification time set to now, as for
        a file the job wrote), or None when there is none.
    """
    job_id = job_id or _job_id()
    out = Path(out)
    if not job_id or out.exists():
        return None
    own = f"{KEPT_PREFIX}{job_id}"
    for kept in sorted(out.parent.glob(f"{KEPT_PREFIX}*/{out.name}")):
        if kept.parent.name == own:
            continue
        os.link(kept, out)
        os.utime(out)
        return kept
    return None


def drop_kept(out: str | Path) -> list[Path]:
    """
    Remove the kept names of a per-image file (every allocation's), so that a file
    cleared on purpose is not put back; returns them.
    """
    out = Path(out)
    dropped = sorted(out.parent.glob(f"{KEPT_PREFIX}*/{out.name}"))
    for kept in dropped:
        kept.unlink(missing_ok=True)
    return dropped


def slurm_job_states(job_ids: Iterable[str]) -> dict[str, str]:
    """
    The states SLURM reports for `job_ids` (first word: ``COMPLETED``, ``TIMEOUT``,
    ``CANCELLED``, ...): ``sacct`` (job accounting), else ``squeue`` (jobs that ended
    less than MinJobAge ago). A job neither knows is left out.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    queries = [
        ["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o", "JobIDRaw,State"],
        ["squeue", "-h", "--states=all", "-j", ",".join(ids), "-o", "%i|%T"],
    ]
    states: dict[str, str] = {}
    for cmd in queries:
        if shutil.which(cmd[0]) is None:
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode != 0:
            continue
        for line in out.stdout.splitlines():
            job, _, state = line.partition("|")
            if job in ids and state and job not in states:
                states[job] = state.split()[0]
        if len(states) == len(ids):
            break
    return states


def restore_after_ended_allocations(
    folders: Iterable[str | Path],
    states: Callable[[Iterable[str]], dict[str, str]] = slurm_job_states,
) -> tuple[list[Path], list[str]]:
    """
    At the start of a run: put back the per-image files that allocations finished
    before they ended early, and drop the kept folders no longer needed.

    Parameters
    ----------
    folders : iterable of str or Path
        The per-image folders of the run (one per configuration, and the noise
        ceiling's).
    states : callable
        Job ids -> SLURM state (default `slurm_job_states`); a job missing from the
        answer (SLURM did not say, or could not be asked) counts as not completed:
        its files are put back, and its folder is kept (it may still be running).

    Returns
    -------
    restored : list of Path
        The per-image files put back.
    ended : list of str
        ``"<jobid> <STATE>"`` of each allocation whose files were put back.

    Notes
    -----
    A folder of an allocation still queued or running is left as it is; one of an
    allocation that ``COMPLETED`` is removed without putting anything back.
    """
    kept_dirs = [
        d for f in folders for d in Path(f).glob(f"{KEPT_PREFIX}*") if d.is_dir()
    ]
    if not kept_dirs:
        return [], []
    known = states({d.name[len(KEPT_PREFIX) :] for d in kept_dirs})
    restored, ended = [], set()
    for d in kept_dirs:
        job = d.name[len(KEPT_PREFIX) :]
        state = known.get(job, "UNKNOWN")
        if state in ACTIVE_STATES:
            continue
        if state != "COMPLETED":
            for kept in sorted(d.glob("img*.pt")):
                out = d.parent / kept.name
                if not out.exists():
                    os.link(kept, out)
                    restored.append(out)
                    ended.add(f"{job} {state}")
        if state != "UNKNOWN":  # SLURM said it ended: its copies are no longer needed
            shutil.rmtree(d, ignore_errors=True)
    return restored, sorted(ended)
