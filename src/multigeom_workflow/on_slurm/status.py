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

A status query that cannot answer is not an end either. The plugin's query returns
``(None, None)`` when ``sacct`` fails ("Problem talking to the database: Connection
refused": slurmdbd restarting, its database down); after ``status_attempts`` such
answers in one status check, ``check_active_jobs`` yields no job, and the executor
interface keeps only the jobs it yielded: the running shards are forgotten and the
login node's Snakemake waits for ever (plugin issue #207, open; tried on the real
cluster, 2026-12-02: an allocation that ended COMPLETED with all its files, and a
run still waiting 5 minutes later). The layer never hands that answer on: while the
accounting does not answer it reads the run's jobs from the controller (``squeue
--name``, what SLURM 22.05 keeps of a job for MinJobAge after its end), or, when the
controller cannot answer either, hands an answer without any job, so that the plugin
yields every shard as still running and asks again at the next check; it says what it
knows in one line (`outage_line`), again at most every `OUTAGE_LINE_S` seconds, and
once more when the query answers again. A tracked allocation whose state no answer
has given for `UNKNOWN_LIMIT_S` seconds is looked up by ``scontrol show job`` and,
where the controller no longer knows it (it ended unseen), by its shard's files:
completed where they are all there, else failed (the images it finished are kept and
taken back by the retry, `multigeom_workflow.compute.kept`); it is never dropped.
The layer also sees, in each answer, the allocations of this run that nobody tracks:
one whose sbatch reply was lost (`multigeom_workflow.on_slurm.submit`) and that
appeared only after its shard was submitted again is cancelled, so that no image
computes twice at once.

tests/test_slurm_status.py and tests/test_slurm_site.py check the plugin's source for
what this relies on.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Awaitable, Callable, Iterable

from ..settings.slurm_states import (
    ENDED_STATES,
    HELD_STATES,
    LIVE_STATES,
    PLUGIN_FAIL_STATES,
    WAITING_AGAIN,
)
from ..settings.slurm_states import word as _word
from .queries import scancel, scontrol_state, squeue_by_name, squeue_states

__all__ = [
    "ENDED_STATES",
    "LIVE_STATES",
    "OUTAGE_LINE_S",
    "PLUGIN_FAIL_STATES",
    "UNKNOWN_LIMIT_S",
    "StatusLayer",
    "how_it_ended",
    "install",
    "outage_line",
    "state_for_plugin",
]

#: Seconds between two lines about a status query that does not answer.
OUTAGE_LINE_S = 60.0
#: Seconds a tracked allocation may go without a state in any answer before it is
#: looked up by other means (`scontrol_state`, its shard's files): SLURM's default
#: MinJobAge (300 s), after which the controller forgets an ended job.
UNKNOWN_LIMIT_S = 300.0

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


def _what(tool: str) -> str:
    return "accounting (sacct)" if tool == "sacct" else "controller (squeue)"


def outage_line(
    tool: str, seconds: float, why: str, tracked: int, controller: bool
) -> str:
    """
    The line saying what the run knows while SLURM's status query does not answer.

    Parameters
    ----------
    tool : str
        The plugin's status command: ``sacct`` (the accounting, slurmdbd) or
        ``squeue`` (the controller).
    seconds : float
        Since its last answer (or the first query).
    why : str
        What the command said last (its last line of stderr), or "".
    tracked : int
        Allocations still tracked.
    controller : bool
        Whether the controller (``squeue --name``) answered in its place.
    """
    said = f" ({why})" if why else ""
    how = (
        "their states read from SLURM's controller (squeue) meanwhile"
        if controller
        else "each waited for and asked about again at every status check"
    )
    return (
        f"SLURM's {_what(tool)} has not answered for {seconds:.0f} s{said}; "
        f"{tracked} allocation(s) still tracked, {how}"
    )


def _tool(command: str) -> str:
    return (shlex.split(command) or ["sacct"])[0]


def _option(command: str, flag: str) -> str | None:
    words = shlex.split(command)
    for word, value in zip(words, words[1:], strict=False):
        if word == flag:
            return value
    return None


def _answered(job: str, states: dict) -> bool:
    """Whether `states` gives `job`'s state (an array task's by its parent's id, as
    the plugin's ``_status_lookup_ids``).
    """
    return job in states or job.partition("_")[0] in states


class _Heard:
    """The plugin's logger, keeping the last line its query said (at debug level:
    why the query failed, e.g. "sacct: error: Problem talking to the database").
    """

    def __init__(self, logger):
        self.logger, self.said = logger, ""

    def debug(self, msg, *args, **kwargs):
        lines = [x.strip() for x in str(msg).splitlines() if x.strip()]
        said = lines[-1] if lines else ""
        self.said = said.removeprefix("SLURM query command failed: ")
        self.logger.debug(msg, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.logger, name)


class StatusLayer:
    """
    The plugin's status query (``query_job_status(command, logger)``: job id -> state,
    and the query's seconds; ``(None, None)`` when the command failed), with each
    job's state as SLURM means it (`state_for_plugin`), one line per job that ended
    without completing (`how_it_ended`) or was requeued, and never an answer the
    plugin would forget its jobs on (see the module).

    Parameters
    ----------
    query : callable
        The plugin's ``query_job_status``.
    live : callable, optional
        Job ids -> the controller's states (default `squeue_states`), asked only for
        jobs whose state says they ended without completing.
    by_name : callable, optional
        A run's name -> the controller's states of its jobs (default
        `squeue_by_name`), asked when ``sacct`` does not answer.
    lookup : callable, optional
        A job id -> its state as the controller knows it (default `scontrol_state`),
        for a tracked job without a state for `UNKNOWN_LIMIT_S` seconds.
    cancel : callable, optional
        A job id -> cancels it (default `scancel`): an allocation of this run that no
        shard tracks.
    clock : callable, optional
        Seconds (default ``time.monotonic``).
    exists : callable, optional
        A path -> whether the file is there (default ``os.path.exists``).
    """

    def __init__(
        self,
        query: Callable[..., Awaitable],
        live: Callable[[list[str]], Awaitable] = squeue_states,
        by_name: Callable[[str], Awaitable] = squeue_by_name,
        lookup: Callable[[str], Awaitable] = scontrol_state,
        cancel: Callable[[str], Awaitable] = scancel,
        clock: Callable[[], float] = time.monotonic,
        exists: Callable[[str], bool] = os.path.exists,
    ):
        self.original, self.live, self.by_name = query, live, by_name
        self.lookup, self.cancel = lookup, cancel
        self.clock, self.exists = clock, exists
        self.said: set[tuple[str, str]] = set()
        self.running: set[str] = set()  # jobs seen running
        self.tracked: dict[str, list[str]] = {}  # job id -> its shard's files
        self.known: dict[str, float] = {}  # job id -> when an answer last gave it
        self.answered_at: float | None = None  # the query's last answer
        self.down = False  # the query has not answered since its last answer
        self.said_at: float | None = None  # the last line about it
        #: The ids this run's sbatch calls gave (the submission layer's), when known.
        self.submitted: Callable[[], set[str]] | None = None
        self.sightings: dict[str, int] = {}  # untracked live job -> answers seen in

    def track(self, active_jobs: Iterable) -> None:
        """
        The allocations the plugin checks now (``check_active_jobs``'s
        ``active_jobs``: ``SubmittedJobInfo``; ``external_jobid``, and its
        ``job.output``, the shard's files).
        """
        now = self.clock()
        self.tracked = {
            str(j.external_jobid): [str(f) for f in j.job.output] for j in active_jobs
        }
        self.known = {job: self.known.get(job, now) for job in self.tracked}

    async def query(self, command: str, logger):
        """The plugin's query, its answer as SLURM means it (see the class)."""
        heard = _Heard(logger)
        states, seconds = await self.original(command, heard)
        now, tool = self.clock(), _tool(command)
        if self.answered_at is None:
            self.answered_at = now
        controller = True  # whether SLURM's controller answered (to look up jobs)
        if states is None:
            states, controller = await self._unanswered(
                command, tool, heard.said, logger, now
            )
            seconds = 0.0
        else:
            if self.down:
                logger.warning(
                    f"SLURM's {_what(tool)} answers again after "
                    f"{now - self.answered_at:.0f} s: the run goes on, "
                    f"{len(self.tracked)} allocation(s) tracked"
                )
            self.down, self.said_at, self.answered_at = False, None, now
        states = dict(states)
        for job in self.tracked:
            if _answered(job, states):
                self.known[job] = now
        decided = await self._look_up_unknown(states, logger, now) if controller else {}
        await self._cancel_untracked(states, logger)
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
        out.update(decided)
        return out, seconds

    async def _unanswered(self, command, tool, why, logger, now):
        """
        What to hand the plugin for a query that failed: the controller's states of
        the run's jobs where ``sacct`` failed and ``squeue`` answers, else none (every
        job yielded as still running, asked about again); the line at most every
        `OUTAGE_LINE_S` seconds. Returns the states and whether the controller
        answered.
        """
        self.down = True
        name = _option(command, "--name") if tool == "sacct" else None
        states = await self.by_name(name) if name else None
        if self.said_at is None or now - self.said_at >= OUTAGE_LINE_S:
            self.said_at = now
            logger.warning(
                outage_line(
                    tool,
                    now - self.answered_at,
                    why,
                    len(self.tracked),
                    states is not None,
                )
            )
        return (states or {}), states is not None

    async def _look_up_unknown(self, states: dict, logger, now: float) -> dict:
        """
        Tracked jobs without a state in any answer for `UNKNOWN_LIMIT_S` seconds:
        the controller's state where it knows them (added to `states`); where it
        no longer does, their shard's files decide (returned: job -> ``COMPLETED``
        or ``FAILED``, said in one line each); where it does not answer, nothing
        (waited for).
        """
        decided = {}
        for job, files in self.tracked.items():
            waited = now - self.known.get(job, now)
            if _answered(job, states) or waited < UNKNOWN_LIMIT_S:
                continue
            state = await self.lookup(job)
            if state is None:  # the controller does not answer: waited for
                continue
            if state:
                states[job], self.known[job] = state, now
                self._once(
                    logger,
                    job,
                    f"SLURM allocation {job} had no state in SLURM's answers for "
                    f"{waited:.0f} s; the controller (scontrol show job) says {state}",
                )
                continue
            missing = [f for f in files if not self.exists(f)]
            gone = (
                f"SLURM allocation {job} had no state in SLURM's answers for "
                f"{waited:.0f} s and the controller no longer knows it (scontrol "
                "show job): it ended unseen, "
            )
            if not missing:
                decided[job] = "COMPLETED"
                line = f"with all {len(files)} of its shard's files: taken as completed"
            else:
                decided[job] = "FAILED"
                line = (
                    f"{len(missing)} of its shard's {len(files)} files missing: "
                    "failed now, keeping the images it finished: a retry (retries in "
                    "the profile) or the next run computes only the rest"
                )
            self._once(logger, job, gone + line)
        return decided

    async def _cancel_untracked(self, states: dict, logger) -> None:
        """
        Cancel an allocation of this run (the query asks for the run's jobs by name)
        that is queued or running while no shard tracks it and no sbatch of this run
        gave its id, seen so in two answers in a row (one may come between an sbatch
        and the plugin's tracking): an sbatch whose reply was lost, found only after
        its shard was submitted again (`multigeom_workflow.on_slurm.submit`).
        """
        if self.submitted is None:
            return
        ours = self.submitted() | set(self.tracked)
        seen = {
            job
            for job, state in states.items()
            if job.isdigit() and job not in ours and _word(state) in LIVE_STATES
        }
        self.sightings = {job: self.sightings.get(job, 0) + 1 for job in seen}
        for job, n in self.sightings.items():
            if n == 2:
                await self.cancel(job)
                state = _word(states.pop(job))
                logger.warning(
                    f"SLURM allocation {job} of this run ({state}) "
                    "is tracked by no shard: an sbatch that reported a failure while "
                    "SLURM had accepted it, its shard submitted again since; "
                    "cancelled (scancel) so that no image computes twice at once (the "
                    "images it finished are kept and taken back)"
                )

    def _once(self, logger, job: str, line: str) -> None:
        if (job, line) not in self.said:
            self.said.add((job, line))
            logger.warning(line)

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
        self._once(logger, job, line)


def _tracking(layer: StatusLayer, check):
    """The plugin's ``Executor.check_active_jobs`` telling `layer` the jobs it
    checks first.
    """
    check = getattr(check, "__wrapped__", check)

    async def check_active_jobs(self, active_jobs):
        layer.track(active_jobs)
        async for job in check(self, active_jobs):
            yield job

    check_active_jobs.__wrapped__ = check
    return check_active_jobs


def install() -> StatusLayer:
    """
    Put `StatusLayer` over the plugin's status query
    (``snakemake_executor_plugin_slurm.query_job_status``, which
    ``Executor.check_active_jobs`` calls by that module name), tell it the jobs each
    status check is about (``Executor.check_active_jobs``), and put the submission
    layer (`multigeom_workflow.on_slurm.submit.install`) over the plugin's sbatch
    calls; once per process.
    """
    import snakemake_executor_plugin_slurm as plugin

    from .. import snakemake_adapter as adapter
    from . import submit

    current = plugin.query_job_status
    layer = getattr(current, "__self__", None)
    if isinstance(layer, StatusLayer):
        return layer
    # each part checked first (snakemake_adapter.SLURM_PLUGIN_PARTS); one that
    # changed is left as the plugin has it, with one line
    layer = StatusLayer(current)
    adapter.replace_in_slurm_plugin(
        "query_job_status",
        lambda query: layer.query,
        "the plugin's own status query applies: an allocation's end it does not "
        "know (scancel, preemption), or accounting that stops answering, may leave "
        "the run waiting",
    )
    adapter.replace_in_slurm_plugin(
        "Executor.check_active_jobs",
        lambda check: _tracking(layer, check),
        "jobs whose state no answer holds are not looked up by other means",
    )
    submissions = submit.install()
    # (without the submission layer, no allocation is taken for a lost reply's)
    layer.submitted = submissions.submitted_ids if submissions else None
    return layer
