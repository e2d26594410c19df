"""
SLURM's own commands as the login node asks them during a run, without blocking
Snakemake's scheduler (asyncio): the controller's view of jobs (``squeue``,
``scontrol show job``) and ``scancel``. Each answers None where SLURM could not
answer, never raises (`multigeom_workflow.on_slurm.status` decides what an unanswered
query means).
"""

from __future__ import annotations

import asyncio

from ..settings.slurm_states import word

__all__ = ["scancel", "scontrol_state", "squeue_by_name", "squeue_states", "word"]


async def _run(cmd: list[str]) -> tuple[int | None, str, str]:
    """`cmd`'s exit status (None where it could not run, or ran past 60 s: then it is
    killed), stdout and stderr.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError:
        return None, "", ""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, "", ""
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _states(out: str) -> dict[str, str]:
    """``id|state`` lines -> id -> state code."""
    states = {}
    for line in out.splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            states[job] = word(state)
    return states


async def squeue_states(job_ids: list[str]) -> dict[str, str] | None:
    """
    The controller's states of `job_ids` (``squeue --states=all``): id -> state code;
    a job it no longer holds is left out. None when squeue could not answer.
    """
    if not job_ids:
        return {}
    cmd = ["squeue", "-h", "--states=all", "-j", ",".join(job_ids), "-o", "%i|%T"]
    code, out, err = await _run(cmd)
    if code != 0:
        # squeue refuses ids it no longer knows ("Invalid job id specified") when
        # every asked id is gone: none is held
        return {} if code is not None and "Invalid job id" in err else None
    return _states(out)


async def squeue_by_name(name: str) -> dict[str, str] | None:
    """
    The controller's states of the jobs named `name` (``squeue --states=all
    --name``; the plugin names every job of a run by the run's id, its ``--name`` of
    the status query): id -> state code, for jobs the controller still holds (ended
    ones for MinJobAge). None when squeue could not answer.
    """
    cmd = ["squeue", "-h", "--states=all", "--name", name, "-o", "%i|%T"]
    code, out, _ = await _run(cmd)
    return _states(out) if code == 0 else None


async def scontrol_state(job_id: str) -> str | None:
    """
    The controller's state of one job (``scontrol show job -o``, its ``JobState``):
    the state code; ``""`` where the controller no longer knows the job ("Invalid job
    id specified": it ended longer than MinJobAge ago); None where it could not
    answer.
    """
    code, out, err = await _run(["scontrol", "show", "job", "-o", job_id])
    if code == 0:
        for item in out.split():
            if item.startswith("JobState="):
                return word(item.partition("=")[2])
        return None
    return "" if code is not None and "Invalid job id" in err else None


async def scancel(job_id: str) -> None:
    """Cancel one job (``scancel``)."""
    await _run(["scancel", job_id])
