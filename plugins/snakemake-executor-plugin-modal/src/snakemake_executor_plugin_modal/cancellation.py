"""
Cancellation: the budget check that stops the run, every call cancelled, when the
spending would reach the budget by the next check (`Cancellation.check_budget`); the
calls whose cancel failed, cancelled again at every check (`cancel_orphans`); and
every call at once when Snakemake cancels the run (Ctrl-C: `cancel_every_call`).
"""

from __future__ import annotations

import time

from .calls import CANCEL_ATTEMPTS

__all__ = ["CANCEL_WAITS_S", "Cancellation", "cancel_in_rounds"]

#: Seconds waited between the rounds of cancels at Ctrl-C (`CANCEL_ATTEMPTS` rounds).
CANCEL_WAITS_S = (1.0, 2.0)


class Cancellation:
    """
    The executor's cancels and budget checks (a part of ``Executor``).

    Reads the executor's state made in ``Executor.__post_init__``: ``settings``,
    ``ledger``; the running calls (``_calls``), the jobs waiting for budget
    (``_waiting``) and the calls whose cancel failed (``_orphans``), under
    ``_calls_lock``; the budget checks' own ``_budget_lock`` (one check at a time),
    ``_budget_checked`` (when the last one was made) and ``_budget_gap_s`` (how far
    apart the last two were).
    """

    def check_budget(self) -> None:
        """
        The budget check: stop the run (one line, every call cancelled) when
        `budget_reached` says so; once stopped, cancel again the calls whose cancel
        failed. Made at every status check and, every status interval, while a
        job's files download (`Homecoming.fetch_results`, ``handle_job_error``),
        which hold up the status loop or Snakemake's lock for minutes with a shard's
        thousands of files; one check at a time (a second caller meanwhile returns
        at once).
        """
        if not self._budget_lock.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            if self._budget_checked is not None:
                self._budget_gap_s = now - self._budget_checked
            self._budget_checked = now
            stop = self.budget_reached()
            if stop is not None:
                self.logger.error(f"Modal: {stop}")
            if self.ledger.exhausted is not None:  # each check: a cancel may fail
                self.cancel_all()
        finally:
            self._budget_lock.release()

    def budget_reached(self) -> str | None:
        """
        The line that stops the run when what is spent, the running calls' cost so
        far included, would reach the lowest budget of the running calls before the
        next budget check (`Ledger.spent_line`); None otherwise (or once said).
        The next check is taken to come as late as the last one came after the one
        before it, and no sooner than Snakemake's status interval.
        """
        if self.ledger.exhausted is not None:
            return None
        running = self.running_calls()
        budgets = [b for c in running if (b := getattr(c, "budget", None))]
        if self.settings.max_cost_usd is not None:
            budgets.append((float(self.settings.max_cost_usd), "--modal-max-cost-usd"))
        if not budgets:
            return None
        ahead_s = max(self.next_seconds_between_status_checks or 0, self._budget_gap_s)
        running_usd = sum(c.cost_usd for c in running)
        ahead_usd = sum(c.usd_per_second for c in running) * ahead_s
        return self.ledger.spent_line(running_usd, min(budgets), ahead_usd, ahead_s)

    def running_calls(self) -> list:
        """The calls that may bill: running, those whose cancel has not reached
        Modal yet, the jobs admitted whose files are still uploading
        (`submission.Reservation`: their worst case is held aside), and the earlier
        runs' apps held in the budget (`earlier.EarlierHold`: ``--modal-earlier-apps
        count``) until they expire."""
        self.count_earlier()
        with self._calls_lock:
            held = getattr(self, "_earlier", [])
            starting = list(getattr(self, "_starting", {}).values())
            return [*self._calls.values(), *self._orphans, *starting, *held]

    def count_earlier(self, everything: bool = False) -> None:
        """
        Count in the ledger what the earlier runs' apps held in the budget have
        cost, once they can bill no more (stopped by the budget's stop, or past
        their bound), or all of them (`everything`: at the run's end); each of their
        containers is one container of the ledger.
        """
        with self._calls_lock:
            held = getattr(self, "_earlier", [])
            done = [h for h in held if everything or h.expired]
            self._earlier = [h for h in held if h not in done]
        for hold in done:
            for _ in range(hold.app.containers):
                self.ledger.add(hold.request, hold.seconds)

    def cancel_all(self) -> None:
        """Cancel every running call not cancelled yet (the budget is reached; a
        call whose cancel failed is tried again at the next check); waiting jobs
        are refused when they are next checked."""
        for call in self.running_calls():
            if not call.cancelled:
                call.cancel()

    def cancel_orphans(self, rounds: int = 1) -> None:
        """Cancel again the calls whose cancel failed, once each (at every status
        check) or in `rounds` rounds 1 and 2 s apart (the run's end, before the
        app's stop: `cancel_in_rounds`); count them once it works."""
        with self._calls_lock:
            orphans, self._orphans = self._orphans, []
        left = cancel_in_rounds(orphans, rounds)
        for call in orphans:
            if call not in left:
                self.ledger.add(call.request, call.seconds)
        with self._calls_lock:
            self._orphans.extend(left)

    def cancel_every_call(self) -> None:
        """
        Cancel every running call (``cancel_jobs``: Ctrl-C), not only Snakemake's
        active jobs (its list leaves out the calls being checked at this moment),
        and those whose cancel failed before; every waiting job is dropped, and a
        job admitted while its files upload is never spawned (its `Reservation`
        cancelled). The calls are tried in `CANCEL_ATTEMPTS` rounds, 1 and 2 s
        apart (``CANCEL_WAITS_S``), each round once per call still running; where
        one fails even so, the app's stop at the run's end ends it.
        """
        with self._calls_lock:
            calls = [*self._calls.values(), *self._orphans]
            starting = list(getattr(self, "_starting", {}).values())
            self._calls, self._orphans, self._waiting = {}, [], {}
        for reservation in starting:
            reservation.cancel()
        cancel_in_rounds(calls, CANCEL_ATTEMPTS)
        for call in calls:
            self.ledger.add(call.request, call.seconds)


def cancel_in_rounds(calls: list, rounds: int) -> list:
    """
    Cancel `calls` (`ContainerCall.cancel`, once per call and round) in `rounds`
    rounds, ``CANCEL_WAITS_S`` (1, 2 s) apart, each round trying only the calls
    still running, the last one saying each refusal; never called in the status
    loop with more than one round. Returns the calls whose cancel failed every
    time.
    """
    left = list(calls)
    for wait_s in CANCEL_WAITS_S[: max(rounds - 1, 0)]:
        left = [c for c in left if not c.cancel(warn=False)]
        if not left:
            return []
        time.sleep(wait_s)
    return [c for c in left if not c.cancel()]  # the last round: a refusal is said
