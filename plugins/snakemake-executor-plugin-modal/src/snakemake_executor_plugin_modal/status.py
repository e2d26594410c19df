"""
The status of the running calls, at each of Snakemake's status checks: a job
waiting for budget is started when the guard admits it, a running call is polled
without blocking (`ContainerCall.poll`), and a finished one's files are brought home
and its success or failure reported, with its log's tail; a call Modal ended without
a cancel from the run, in an app that Modal says has ended, ends the run's app for
every call (`Status.app_ended`), while one whose container was lost in an app that
runs on is its job's failure only (`calls.Outcome.lost`: retried, the others run
on), as is one past its deadline (`calls.Outcome.past_deadline`).

No round waits on one job: a refused cancel is tried once a round
(`ContainerCall.cancel`), and a finished job's files come home in a small pool of
threads (`home_queue.HomeQueue`) whose ends the rounds collect, each job reported
once its files are home; a round waits for them at most
`home_queue.ROUND_WAIT_S`.
"""

from __future__ import annotations

import asyncio
import time

from .app import ended_line
from .calls import ContainerCall, Outcome
from .home_queue import ROUND_WAIT_S

__all__ = ["LOG_TAIL_LINES", "Status"]

#: Lines of a failed job's log printed with its error.
LOG_TAIL_LINES = 30


class Status:
    """
    The executor's status checks (a part of ``Executor``).

    Reads the executor's state made in ``Executor.__post_init__``: the running calls
    (``_calls``), the jobs waiting for budget (``_waiting``) and the calls whose
    cancel failed (``_orphans``), under ``_calls_lock``; the failed jobs' specs until
    their files come home (``_failed``: `Homecoming.bring_home_failed`); the
    downloads of finished jobs (``home``, a `home_queue.HomeQueue`); ``ledger``,
    ``app``, ``pauses``, ``workdir``; ``_app_ended``, which it sets.
    """

    async def poll_active(self, active_jobs):
        """
        ``check_active_jobs``'s work: yields the jobs still active, those whose
        files are coming home included. Modal's client calls block: they run in
        threads, not in Snakemake's event loop. Snakemake holds no lock meanwhile
        (``RemoteExecutor._wait_for_jobs`` takes its ``lock`` only to copy the
        active jobs before and to add back those yielded after).
        """
        await asyncio.to_thread(self.cancel_orphans)
        await asyncio.to_thread(self.check_budget)
        if not active_jobs:
            # Snakemake's status thread runs from the executor's start, while the
            # image is built: the stager (made there) may not be there yet, and no
            # job is (a job is submitted once the executor has started)
            return
        homebound = []  # jobs whose files are coming home
        # the jobs this round ends read one listing of the volume (taken at the
        # first download, once the loop has seen them all end: `staging.Listing`)
        listing, ended = self.stager.listing(shared=True), []
        for job_info in active_jobs:
            external_id = job_info.external_jobid
            if self.home.holds(external_id):
                homebound.append(job_info)
                continue
            with self._calls_lock:
                waiting = self._waiting.get(external_id)
                call = self._calls.get(external_id)
            if waiting is not None:
                if await self.start_waiting(job_info):
                    yield job_info
                continue
            if call is None:  # cancelled meanwhile
                continue
            if self._app_ended is None:
                async with self.status_rate_limiter:
                    outcome = await asyncio.to_thread(call.poll)
                if outcome is None:
                    yield job_info
                    continue
                if outcome.ended_by_modal:
                    self.app_ended(call, outcome)
                    outcome.message = self.ended_with_app()
            else:  # not taken as running: Modal may never give its output
                outcome = Outcome(False, self.ended_with_app())
                await asyncio.to_thread(call.cancel)  # if it runs on even so
            with self._calls_lock:
                if self._calls.pop(external_id, None) is None:
                    continue  # cancelled meanwhile (Ctrl-C): counted there
                if not outcome.ok and call.ended is None:  # its cancel failed
                    self._orphans.append(call)
            if call.ended is not None:
                self.ledger.add(call.request, call.seconds)
            if call.cancelled and self.ledger.exhausted is not None:
                outcome.message = self.ledger.exhausted
            fetch = lambda j=job_info, ok=outcome.ok: self.fetch_results(j, ok, listing)  # noqa: E731
            ended.append((external_id, fetch, (call, outcome)))
            homebound.append(job_info)
        for started in ended:  # after the loop: the listing holds all they wrote
            self.home.start(*started)
        async for job_info in self.collect_homebound(homebound):
            yield job_info

    async def collect_homebound(self, homebound: list):
        """
        Report the jobs among `homebound` whose files are home (`report_outcome`),
        each as soon as its download ends, for at most `ROUND_WAIT_S` seconds;
        yields the others (still active: a later round collects them).
        """
        deadline = time.monotonic() + ROUND_WAIT_S
        while homebound:
            still = []
            for job_info in homebound:
                ended = self.home.collect(job_info.external_jobid)
                if ended is None:
                    still.append(job_info)
                    continue
                (call, outcome), error = ended
                self.report_outcome(job_info, call, outcome, error)
            homebound = still
            left_s = deadline - time.monotonic()
            if not homebound or left_s <= 0:
                break
            keys = [j.external_jobid for j in homebound]
            await asyncio.to_thread(self.home.wait_any, keys, left_s)
        for job_info in homebound:
            yield job_info

    def report_outcome(
        self, job_info, call: ContainerCall, outcome, error: BaseException | None
    ) -> None:
        """Report a finished job's success or failure once its files came home
        (`error`: what their download raised, which fails the job)."""
        if error is not None:
            outcome.ok = False
            outcome.message = f"could not download the job's files: {error}"
        if outcome.ok:
            self.report_job_success(job_info)
            return
        # brought home once Snakemake has removed the failed job's outputs
        self._failed[job_info.job] = job_info.aux["spec"]
        msg = f"Modal call {call.call_id}: {outcome.message}\n" + self.log_report(
            job_info, outcome
        )
        if job_info.job.is_group():  # Snakemake prints no message for it
            self.logger.error(f"{self.get_jobname(job_info.job)}: {msg}")
        self.report_job_error(job_info, msg=msg)

    def app_ended(self, call: ContainerCall, outcome: Outcome) -> None:
        """
        Say once, in one line (`app.ended_line`), that the run's app has ended under
        it: Modal ended `call` without a cancel from this run and says the app has
        ended (`Outcome.ended_by_modal`, `app_state.app_stopped`), with what this
        process knows of why (`Pauses`:
        it did not run, so its client sent no heartbeat, for longer than the
        heartbeat interval). From then on every running call fails at its next
        status check (Modal may never give a stopped app's calls an output: none is
        taken as running) and no job is started (a spawn into a stopped app fails
        with an error that does not say why); failed shards bring home what their
        containers committed (`handle_job_error`), so the next run computes only
        the rest.
        """
        if self._app_ended is not None:
            return
        self._app_ended = ended_line(
            self.app.app_id,
            outcome.message,
            self.pauses.longest(since=call.spawned_at),
            self.pauses.least_s,
        )
        self.logger.error(self._app_ended)

    def ended_with_app(self) -> str:
        """A job's message once the run's app has ended (the line said once)."""
        return f"ended with the run's app {self.app.app_id} (said above)"

    def log_report(self, job_info, outcome) -> str:
        """The tail of a failed job's container log, and where the whole log is."""
        local = self.workdir / job_info.aux["spec"]["log"]
        if local.exists():
            tail = local.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            where = f"whole log: {local}"
        elif outcome.result is not None:
            tail = outcome.result["log_tail"].splitlines()[-LOG_TAIL_LINES:]
            where = "the log did not reach the volume"
        else:
            return (
                "no log reached the volume (the container was lost before its first "
                f"sync); Modal's own logs: `modal app logs {self.app.app_id}`\n"
            )
        return f"last lines of its log ({where}):\n" + "\n".join(tail) + "\n"
