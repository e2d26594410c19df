"""
SLURM's job states as the workflow reads them: one vocabulary, defined here and
imported everywhere (the status layer over the SLURM plugin, the submissions, the
allocations an earlier run left, the files kept by allocations that ended).

The codes are SLURM's (squeue(1) and sacct(1), "JOB STATE CODES"); ``ERROR`` is the
SLURM plugin's own (snakemake-executor-plugin-slurm 2.8.0). A state as SLURM prints it
(``CANCELLED by 0``, ``CANCELLED+``) is read by its code (`word`).

``PREEMPTED``, settled once: in accounting (``sacct -X``) it is the final state of
the attempt that was preempted, whether or not SLURM runs the job again. With
``PreemptMode=CANCEL`` the job has ended; with ``PreemptMode=REQUEUE`` the controller
holds it again, ``PENDING`` (or ``REQUEUED``) in ``squeue``, while ``sacct -X`` still
says ``PREEMPTED`` (tried on a real cluster, SLURM 22.05, 2026-12-01). So
``PREEMPTED`` is in `ENDED_STATES`, and whether a job that reached it still runs is the
controller's answer: every reader asks ``squeue`` first and takes a state of
`LIVE_STATES` from it over accounting's.

Nothing here runs a SLURM command or imports another part of the workflow.
"""

from __future__ import annotations

__all__ = [
    "ENDED_STATES",
    "HELD_STATES",
    "LIVE_STATES",
    "PLUGIN_FAIL_STATES",
    "WAITING_AGAIN",
    "WILL_RUN",
    "word",
]

#: The SLURM plugin's failure states (``fail_stati`` of ``Executor.check_active_jobs``,
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
#: Final states of a job that did not complete (``COMPLETED`` is the one that did).
ENDED_STATES = frozenset({*PLUGIN_FAIL_STATES, "PREEMPTED", "REVOKED"})
#: States of a job that SLURM still holds and may run (again): the controller's
#: answer, a requeued job's too.
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
#: States of a job that SLURM runs or will run: a submission found in one computes
#: its shard; one ending (``COMPLETING``, ``SIGNALING``, ``STAGE_OUT``: after a time
#: limit or a failure), or stopped, does not.
WILL_RUN = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "SUSPENDED",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
    }
)


def word(state: str) -> str:
    """A state's code: ``CANCELLED by 0`` -> ``CANCELLED``, ``CANCELLED+`` too."""
    return (state.split() or [""])[0].rstrip("+")
