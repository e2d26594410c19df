"""
Every way a SLURM allocation ends, seen as an end: a layer over the status query of
``snakemake-executor-plugin-slurm`` (2.8.0, the newest release on 2026-12-01), on the
login node, in a run with ``--executor slurm``.

The plugin reads each job's state with ``sacct`` (``JobIDRaw|State``) and compares it
with its failure states exactly (``status in fail_stati`` in
``Executor.check_active_jobs``); every other state is "still running?". On a real
cluster (SLURM 22.05, tried 2026-12-01) that misses several ends and takes one
requeue for an end:

- ``scancel`` gives the state ``CANCELLED by <uid>``: not in the plugin's list, so
  the login node's Snakemake waited on a cancelled shard for as long as it was left;
- ``PREEMPTED`` (a partition's ``PreemptMode=CANCEL``) is final but the plugin yields
  it as running, forever;
- after a node failure the plugin adds the job's node list, unquoted, to every later
  ``--exclude`` (plugin issue #485: ``--exclude=None assigned,...``): on a one-node
  GPU partition every later shard is unschedulable. SLURM itself keeps a failed
  node out until it is back;
- a job SLURM requeued (``scontrol requeue``, preemption with ``PreemptMode=REQUEUE``,
  a node failure with requeueing on: the cluster's default ``JobRequeue=1``) waits
  as ``PENDING`` in the controller, while ``sacct -X`` shows the ended attempt's
  state (``NODE_FAIL``): failed on that, the shard would be submitted again while
  SLURM runs the first one again too.

The layer (`StatusLayer`, put in place by `install`) hands the plugin, for each job,
what SLURM means: an ended job's state as the first word the plugin knows
(``CANCELLED``; ``FAILED`` for an end not in its list, or a node failure: no
exclusion), and a requeued job's live state from ``squeue`` (the controller's), so
that it is waited for. It says once per job, in one line, how it ended. The plugin's
own behaviour is kept everywhere else (its queries, messages, retries, cancelling).
tests/test_slurm_status.py checks the plugin's source for what this relies on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = [
    "ENDED_STATES",
    "LIVE_STATES",
    "PLUGIN_FAIL_STATES",
    "StatusLayer",
    "how_it_ended",
    "install",
    "state_for_plugin",
]

#: The plugin's failure states (``fail_stati`` of ``Executor.check_active_jobs``,
#: snakemake-executor-plugin-slurm 2.8.0); a job in one of them is reported failed.
PLUGIN_FAIL_STATES = (
    "BOOT_FAIL",
    "CANCELLED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "TIMEOUT",
    "ERROR",
)
#: Final states of a job that did not complete (SLURM's job state codes, squeue(1)
#: "JOB STATE CODES"); ``ERROR`` is the plugin's own.
ENDED_STATES = frozenset({*PLUGIN_FAIL_STATES, "PREEMPTED", "REVOKED"})
#: States of a job that SLURM still holds and may run (again): the controller's
#: answer for a requeued job.
LIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
        "RESV_DEL_HOLD",
        "RESIZING",
        "SUSPENDED",
        "STOPPED",
        "COMPLETING",
        "CONFIGURING",
        "SIGNALING",
        "STAGE_OUT",
    }
)
#: Held states: SLURM runs the job again only once it is released.
HELD_STATES = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"})
#: States of a job that ran and waits to run again: requeued.
WAITING_AGAIN = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", *HELD_STATES})

_WHY = {
    "CANCELLED": "cancelled (scancel) by uid {by}",
    "PREEMPTED": (
        "preempted by a job of a higher-priority partition and not requeued "
        "(PreemptMode=CANCEL)"
    ),
    "NODE_FAIL": "its node failed and SLURM did not requeue it",
    "TIMEOUT": "reached its time limit",
    "OUT_OF_MEMORY": (
        "ran out of memory (raise set-resources estimate_image:mem_mb in the profile)"
    ),
    "DEADLINE": "passed its deadline",
    "BOOT_FAIL": "its node failed to boot",
    "FAILED": "its batch script failed (its SLURM log is kept)",
    "REVOKED": "was revoked (a federated job started on another cluster)",
    "ERROR": "its state could not be read",
}


def _word(state: str) -> str:
    """A state's code: ``CANCELLED by 0`` -> ``CANCELLED``, ``CANCELLED+`` too."""
    return (state.split() or [""])[0].rstrip("+")


def how_it_ended(job_id: str, state: str) -> str:
    """
    One line saying how allocation `job_id` ended, as SLURM's `state` says
    (``CANCELLED by 0``, ``PREEMPTED``, ``NODE_FAIL``, ...).
    """
    word = _word(state)
    by = state.split()[-1] if word == "CANCELLED" and " by " in state else "?"
    why = _WHY.get(word, "ended").format(by=by)
    return (
        f"SLURM allocation {job_id} ended {state}: {why}; Snakemake fails its shard "
        "now, keeping the images it finished: a retry (retries in the profile) or the "
        "next run computes only the rest"
    )


def state_for_plugin(state: str, live: str | None) -> str:
    """
    The state to hand the plugin for one job.

    Parameters
    ----------
    state : str
        What ``sacct`` (or ``squeue``, the plugin's status command) says.
    live : str or None
        What the controller (``squeue``) says of the job now, None where it does not
        know it (ended longer than MinJobAge ago) or was not asked.

    Returns
    -------
    str
        For a job that ended without completing: the controller's live state when
        SLURM holds it again (requeued: waited for), else the state's code where the
        plugin fails on it (``CANCELLED`` for ``CANCELLED by 0``), else ``FAILED``
        (``PREEMPTED``, ``REVOKED``, and ``NODE_FAIL``, which the plugin would add to
        every later ``--exclude``). Any other state as its code.
    """
    word = _word(state)
    if word not in ENDED_STATES:
        return word
    if live is not None and _word(live) in LIVE_STATES:
        return _word(live)
    if word in PLUGIN_FAIL_STATES and word != "NODE_FAIL":
        return word
    return "FAILED"


async def squeue_states(job_ids: list[str]) -> dict[str, str] | None:
    """
    The controller's states of `job_ids` (``squeue --states=all``): id -> state code;
    a job it no longer holds is left out. None when squeue could not answer.
    """
    if not job_ids:
        return {}
    cmd = ["squeue", "-h", "--states=all", "-j", ",".join(job_ids), "-o", "%i|%T"]
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    except (TimeoutError, OSError):
        return None
    if proc.returncode != 0:
        # squeue refuses ids it no longer knows ("Invalid job id specified") when
        # every asked id is gone: none is held
        return {} if b"Invalid job id" in err else None
    states = {}
    for line in out.decode().splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            states[job] = _word(state)
    return states


class StatusLayer:
    """
    The plugin's status query (``query_job_status(command, logger)``: job id -> state,
    and the query's seconds), with each job's state as SLURM means it
    (`state_for_plugin`), and one line per job that ended without completing
    (`how_it_ended`) or was requeued.

    Parameters
    ----------
    query : callable
        The plugin's ``query_job_status``.
    live : callable, optional
        Job ids -> the controller's states (default `squeue_states`), asked only for
        jobs whose state says they ended without completing.
    """

    def __init__(
        self,
        query: Callable[..., Awaitable],
        live: Callable[[list[str]], Awaitable] = squeue_states,
    ):
        self.original, self.live = query, live
        self.said: set[tuple[str, str]] = set()
        self.running: set[str] = set()  # jobs seen running

    async def query(self, command: str, logger):
        """The plugin's query, its answer as SLURM means it (see the class)."""
        states, seconds = await self.original(command, logger)
        if not states:
            return states, seconds
        ended = sorted(j for j, s in states.items() if _word(s) in ENDED_STATES)
        live = await self.live(ended) if ended else {}
        out = {}
        for job, state in states.items():
            if job in ended and live is None:
                # the controller could not say whether SLURM requeued it: ask again
                # at the next status check rather than fail a job that may run again
                out[job] = "PENDING"
                continue
            out[job] = state_for_plugin(state, (live or {}).get(job))
            self._say(logger, job, state, out[job])
        return out, seconds

    def _say(self, logger, job: str, state: str, given: str) -> None:
        word = _word(state)
        requeued = given in WAITING_AGAIN and job in self.running
        if given == "RUNNING":
            self.running.add(job)
        elif requeued:  # ran, and waits to run again (scontrol requeue: PENDING)
            self.running.discard(job)
        if word in ENDED_STATES and given not in LIVE_STATES:
            line = how_it_ended(job, state)
        elif word in ENDED_STATES or requeued:  # ended, and SLURM holds it again
            after = f" after {state}" if word in ENDED_STATES else ""
            line = (
                f"SLURM allocation {job} was requeued{after} (now {given}): "
                "SLURM runs it again under the same job id; it keeps the images it "
                "finished and computes only the rest"
            )
            if given in HELD_STATES:
                line += f" once released (scontrol release {job}; scancel ends it)"
        else:
            return
        if (job, line) not in self.said:
            self.said.add((job, line))
            logger.warning(line)


def install() -> StatusLayer:
    """
    Put `StatusLayer` over the plugin's status query
    (``snakemake_executor_plugin_slurm.query_job_status``, which
    ``Executor.check_active_jobs`` calls by that module name); once per process.
    """
    import snakemake_executor_plugin_slurm as plugin

    current = plugin.query_job_status
    layer = getattr(current, "__self__", None)
    if isinstance(layer, StatusLayer):
        return layer
    layer = StatusLayer(current)
    plugin.query_job_status = layer.query
    return layer
