"""
Downloads off the status loop: a finished job's files come home in a small pool of
threads (`HomeQueue`), keyed by the job's external id; each status round collects
the downloads that ended (`HomeQueue.collect`) and reports those jobs, so that one
job's thousands of files never hold up another job's status. A failed job's
finished outputs come home in the same pool (`HomeQueue.later`), off Snakemake's
scheduler lock; the run's end waits for them (`HomeQueue.close`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

__all__ = ["HOME_THREADS", "ROUND_WAIT_S", "HomeQueue"]

#: Jobs whose files download at once (each download fans out over
#: ``staging.DOWNLOAD_THREADS`` threads of its own).
HOME_THREADS = 2
#: Seconds a status round waits, at its end, for the downloads of its jobs (so that
#: a small job is reported in the round that saw it end, not one status interval
#: later); a download still running then is collected by a later round.
ROUND_WAIT_S = 0.5


class HomeQueue:
    """
    The downloads of finished jobs, in `threads` threads.

    Parameters
    ----------
    threads : int
        Downloads running at once; the others queue.
    """

    def __init__(self, threads: int = HOME_THREADS):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="modal-home")
        self._lock = threading.Lock()
        #: external id -> (its download, what the round that collects it needs)
        self._jobs: dict[str, tuple[Future, object]] = {}
        #: downloads that nobody reports (a failed job's finished outputs)
        self._later: list[Future] = []

    def start(self, key: str, fetch: Callable[[], object], payload: object) -> None:
        """Download a finished job's files (`fetch`, run in the pool); `payload`
        comes back with its end (`collect`)."""
        with self._lock:
            self._jobs[key] = (self._pool.submit(fetch), payload)

    def holds(self, key: str) -> bool:
        """Whether the job's files are coming home (started, not collected)."""
        with self._lock:
            return key in self._jobs

    def collect(self, key: str) -> tuple[object, BaseException | None] | None:
        """
        The job's `payload` and what its download raised (None: its files are
        home), once it ended, and the job forgotten; None while it runs (or for a
        job that is not held).
        """
        with self._lock:
            held = self._jobs.get(key)
            if held is None or not held[0].done():
                return None
            del self._jobs[key]
        future, payload = held
        return payload, future.exception()

    def wait_any(self, keys: Iterable[str], timeout_s: float) -> None:
        """Wait until one of these jobs' downloads ends, or `timeout_s` seconds."""
        with self._lock:
            futures = [self._jobs[k][0] for k in keys if k in self._jobs]
        if futures and timeout_s > 0:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def later(self, fetch: Callable[[], object]) -> Future:
        """Run a download that nobody reports (`fetch` says its own errors): a
        failed job's finished outputs; the run's end waits for it (`close`)."""
        future = self._pool.submit(fetch)
        with self._lock:
            self._later = [f for f in self._later if not f.done()] + [future]
        return future

    def pending(self) -> int:
        """Downloads not ended yet."""
        with self._lock:
            futures = [f for f, _ in self._jobs.values()] + self._later
        return sum(not f.done() for f in futures)

    def close(self, cancel: bool = False) -> None:
        """
        The run's end: wait for the downloads running (a failed job's finished
        outputs come home, so the next run computes only the rest); with `cancel`
        (Ctrl-C) those not started yet are dropped.
        """
        self._pool.shutdown(wait=True, cancel_futures=cancel)
