"""
The budget is checked while a job's files download (issue 37): a failed shard's
finished images come home in ``handle_job_error``, under Snakemake's scheduler lock,
and a finished shard's outputs in the status loop; either holds up the status
checks for as long as thousands of files take. The stop line says what is spent and
what the running calls would cost by the next check, as far away as the checks
actually are.

The executor is made without Snakemake (``Executor.__new__``) with the state its
budget check reads; its running calls are stand-ins priced by the second.
"""

from __future__ import annotations

import threading
import time
import types

from snakemake_executor_plugin_modal import Executor
from snakemake_executor_plugin_modal.calls import Ledger
from snakemake_executor_plugin_modal.home_queue import HomeQueue
from snakemake_executor_plugin_modal.staging import VolumeStager

from .test_linear import _shard


class RunningCall:
    """A running call billed ``usd_per_second`` from its start (`cost_usd`)."""

    budget = None

    def __init__(self, usd_per_second: float, spent_usd: float = 0.0):
        self.usd_per_second = usd_per_second
        self.started = time.monotonic() - spent_usd / usd_per_second
        self.cancelled_at = None

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None

    @property
    def cost_usd(self) -> float:
        end = self.cancelled_at or time.monotonic()
        return self.usd_per_second * (end - self.started)

    def cancel(self, attempts: int = 1) -> bool:
        self.cancelled_at = self.cancelled_at or time.monotonic()
        return True


def _executor(max_cost_usd: float, calls: list, interval_s: float) -> Executor:
    """The executor's budget state, as ``__post_init__`` makes it."""
    ex = Executor.__new__(Executor)
    ex.settings = types.SimpleNamespace(max_cost_usd=max_cost_usd)
    ex.ledger = Ledger(max_cost_usd)
    ex._calls = {f"fc-{i}": c for i, c in enumerate(calls)}
    ex._orphans = []
    ex._calls_lock = threading.Lock()
    ex._budget_lock = threading.Lock()
    ex._budget_checked = None
    ex._budget_gap_s = 0.0
    ex._next_seconds_between_status_checks = interval_s
    ex.logged = []
    ex.logger = types.SimpleNamespace(
        error=ex.logged.append, info=ex.logged.append, warning=ex.logged.append
    )
    return ex


def test_the_stop_line_projects_to_the_next_check_as_far_as_checks_are():
    """
    0.90 USD spent by a call billing 0.001 USD/s, a budget of 1 USD, checks 10 s
    apart: no stop (0.91 USD by the next check). When the last check came 200 s
    after the one before (a download held the loop), the next is taken to come as
    late: 1.10 USD by then, so every call is cancelled now, and the line says both
    what is spent and what the projection is, with how far away.
    """
    call = RunningCall(0.001, spent_usd=0.9)
    ex = _executor(1.0, [call], interval_s=10)
    ex.check_budget()
    assert ex.logged == [] and not call.cancelled
    ex._budget_checked = time.monotonic() - 200  # the last check, 200 s ago
    ex.check_budget()
    assert call.cancelled
    (line,) = ex.logged
    assert line.startswith(
        "Modal: --modal-max-cost-usd 1: 0.90 USD spent, running calls included, "
        "1.10 USD by the next budget check (about 200 s away) if they ran on; the "
        "budget is reached: every call is cancelled"
    )
    assert ex.ledger.exhausted == line.removeprefix("Modal: ")


def test_a_download_calls_its_tick_while_files_come(tmp_path):
    """`VolumeStager.download` calls ``tick`` every ``tick_s`` while its files
    download in parallel, and not once they are all home."""
    volume, _ = _shard()
    real = volume.read_file

    def slow(path):
        time.sleep(0.05)
        yield from real(path)

    volume.read_file = slow
    ticks = []
    stager = VolumeStager(volume, "proj", tmp_path)
    rels = [f"runs/per_image/img{i:05d}.pt" for i in range(64)]  # 8 rounds of 8
    got = stager.download(rels, tick=lambda: ticks.append(1))
    assert got == rels and ticks == []  # tick_s 10 s: the download is quicker
    t0 = time.monotonic()
    stager.download(rels, tick=lambda: ticks.append(1), tick_s=0.1)
    took = time.monotonic() - t0
    assert 2 <= len(ticks) <= took / 0.1 + 1


def test_a_failed_shards_home_coming_checks_the_budget(tmp_path):
    """
    ``handle_job_error`` (under Snakemake's scheduler lock) hands a failed shard's
    finished images to the pool of downloads and returns at once (under 0.3 s; the
    download takes about 0.8 s); a call that reaches the budget while they
    download is cancelled then, with the stop line, not after; the run's end
    (`HomeQueue.close`) waits for all 64 images.
    """
    volume, members = _shard()
    real = volume.read_file

    def slow(path):
        time.sleep(0.1)
        yield from real(path)

    volume.read_file = slow
    members = [
        {"outputs": [f"runs/per_image/img{i:05d}.pt"], "key": m["key"]}
        for i, m in enumerate(members * 16)
    ]  # 64 images: 8 rounds of 8 threads, about 0.8 s
    call = RunningCall(0.01, spent_usd=0.995)  # at 1 USD 0.5 s from now
    ex = _executor(1.0, [call], interval_s=0.05)
    ex.stager = VolumeStager(volume, "proj", tmp_path)
    ex.get_jobname = lambda job: "shard-1"
    job = object()
    ex._failed = {job: {"members": members}}
    ex.home = HomeQueue()
    t0 = time.monotonic()
    ex.handle_job_error(job)
    assert time.monotonic() - t0 < 0.3
    ex.home.close()
    assert call.cancelled
    assert any("the budget is reached" in line for line in ex.logged)
    assert sum((tmp_path / m["outputs"][0]).exists() for m in members) == 64
