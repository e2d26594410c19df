"""
A status loop that never waits on one job (issue 47): a cancel that Modal refuses is
tried once per status round and again at the next, never slept on; a finished job's
slow download runs beside the loop, and the other jobs are polled and reported
meanwhile; a job's admission never waits for another job's upload.

The executor is made without Snakemake (``Executor.__new__``) with the state its
status rounds and its submission read; its calls are real `ContainerCall`s over
stand-in ``FunctionCall``s, its downloads and uploads stand-ins that take the time a
test gives them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import types

import pytest
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from snakemake_executor_plugin_modal import Executor
from snakemake_executor_plugin_modal import submission as submission_module
from snakemake_executor_plugin_modal.calls import ContainerCall, Ledger, Pauses
from snakemake_executor_plugin_modal.home_queue import ROUND_WAIT_S, HomeQueue
from snakemake_executor_plugin_modal.prices import ContainerRequest


class FunctionCall:
    """A ``modal.FunctionCall`` stand-in: ``get`` raises `raises` (a bare
    ``TimeoutError()``: running) or returns a result of `returncode`; ``cancel``
    raises `cancel_error` while it is set, and is counted either way."""

    def __init__(self, call_id, raises=None, returncode=0, cancel_error=None):
        self.object_id = call_id
        self.raises = raises
        self.returncode = returncode
        self.cancel_error = cancel_error
        self.cancels = 0

    def get(self, timeout=None):
        if self.raises is not None:
            raise self.raises
        return {"returncode": self.returncode, "log_tail": "", "seconds": 1.0}

    def cancel(self, terminate_containers=False):
        self.cancels += 1
        if self.cancel_error is not None:
            raise self.cancel_error


class Job:
    """A single job: what the status round and the submission read of one."""

    log = []

    def __init__(self, name):
        self.name = name

    def is_group(self):
        return False


class _Unlimited:
    """``status_rate_limiter``'s stand-in: an async context that never waits."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


def _executor(tmp_path, max_cost_usd=None) -> Executor:
    """The executor's state, as ``__post_init__`` makes it, with its reports
    recorded (``ex.reported``: (external id, "success"/"error", seconds since
    ``ex.t0``)) and its downloads taking ``ex.download_s[external id]`` seconds."""
    ex = Executor.__new__(Executor)
    ex.settings = types.SimpleNamespace(
        max_cost_usd=max_cost_usd, timeout=3600, deadline_margin_seconds=60
    )
    ex.ledger = Ledger(max_cost_usd)
    ex._calls, ex._waiting, ex._starting, ex._failed = {}, {}, {}, {}
    ex._orphans, ex._waited, ex._app_ended = [], 0, None
    ex._calls_lock = threading.Lock()
    ex._admit_lock = threading.RLock()
    ex._budget_lock = threading.Lock()
    ex._budget_checked, ex._budget_gap_s = None, 0.0
    ex._next_seconds_between_status_checks = 2
    ex.status_rate_limiter = _Unlimited()
    ex.home = HomeQueue()
    ex.workdir = tmp_path
    # a round's one listing of the volume, shared by its downloads: none here
    ex.stager = types.SimpleNamespace(listing=lambda shared=False: None)
    ex.app = types.SimpleNamespace(app_id="ap-test", app=None)
    ex.pauses = Pauses(30.0)
    ex.logged = []
    ex.logger = types.SimpleNamespace(
        error=ex.logged.append, info=ex.logged.append, warning=ex.logged.append
    )
    ex.get_jobname = lambda job: job.name
    ex.t0 = time.monotonic()
    ex.reported = []
    ex.download_s = {}

    def fetch_results(job_info, ok, listing=None):
        time.sleep(ex.download_s.get(job_info.external_jobid, 0.0))

    def report(kind):
        def record(job_info, msg=None):
            seconds = time.monotonic() - ex.t0
            ex.reported.append((job_info.external_jobid, kind, seconds))

        return record

    ex.fetch_results = fetch_results
    ex.report_job_success = report("success")
    ex.report_job_error = report("error")
    return ex


def _running(ex, handle) -> SubmittedJobInfo:
    """A job whose call (`handle`) runs, as `Submission.submit` leaves it."""
    ex._calls[handle.object_id] = ContainerCall(handle, None, 60, warn=ex.logged.append)
    spec = {"log": f".snakemake/modal/{handle.object_id}.log"}
    return SubmittedJobInfo(
        Job(handle.object_id), external_jobid=handle.object_id, aux={"spec": spec}
    )


def _round(ex, active) -> tuple[list, float]:
    """One status round (``check_active_jobs``): the jobs it yields, and its
    seconds."""

    async def collect():
        return [j async for j in ex.check_active_jobs(active)]

    t0 = time.monotonic()
    still = asyncio.run(collect())
    return still, time.monotonic() - t0


@pytest.mark.timeout(30)
def test_a_refused_cancel_costs_the_round_one_request_and_is_tried_next_round(
    tmp_path,
):
    """
    A call that fails (Modal's ``InternalFailure``: it may still run) is cancelled
    before its job fails; Modal refuses the cancel. The round returns in under
    0.5 s (before: three tries 1 and 2 s apart, over 3 s), the job is reported
    failed in that round, and the call is kept as one whose cancel failed: the
    next round tries it once more, and once Modal takes it, it is cancelled and
    counted in the ledger.
    """
    import modal.exception

    ex = _executor(tmp_path)
    refused = modal.exception.ConnectionError("cancel refused")
    handle = FunctionCall(
        "fc-1", raises=modal.exception.InternalFailure("lost"), cancel_error=refused
    )
    job = _running(ex, handle)
    still, took = _round(ex, [job])
    assert took < 0.5
    assert still == [] and [(i, k) for i, k, _ in ex.reported] == [("fc-1", "error")]
    assert handle.cancels == 1 and len(ex._orphans) == 1
    assert any("cancel failed" in line for line in ex.logged)
    still, took = _round(ex, [])  # the next round: tried once more, refused again
    assert took < 0.5 and handle.cancels == 2 and len(ex._orphans) == 1
    handle.cancel_error = None
    _round(ex, [])
    assert handle.cancels == 3 and ex._orphans == [] and ex.ledger._calls == 1
    ex.home.close()


@pytest.mark.timeout(30)
def test_a_slow_download_delays_no_other_jobs_status(tmp_path):
    """
    Three jobs: A and B end in the same round, A's files take 1.5 s to come home,
    B's none; C runs on. B is reported within 0.3 s of the round's start, C is
    yielded as running, and the round returns within `ROUND_WAIT_S` + 0.3 s with A
    still active (its files coming home); A is reported by the first round after
    its download ended, not before.
    """
    ex = _executor(tmp_path)
    a, b = FunctionCall("fc-a"), FunctionCall("fc-b")
    c = FunctionCall("fc-c", raises=TimeoutError())  # no output yet: running
    jobs = [_running(ex, h) for h in (a, b, c)]
    ex.download_s = {"fc-a": 1.5}
    start = time.monotonic() - ex.t0
    still, took = _round(ex, jobs)
    assert took < ROUND_WAIT_S + 0.3
    assert sorted(j.external_jobid for j in still) == ["fc-a", "fc-c"]
    ((bid, kind, at),) = ex.reported
    assert (bid, kind) == ("fc-b", "success") and at - start < 0.3
    still, took = _round(ex, still)  # A's files still coming: not reported
    assert took < ROUND_WAIT_S + 0.3 and len(ex.reported) == 1
    time.sleep(1.5)
    still, took = _round(ex, still)
    assert took < 0.3 and [j.external_jobid for j in still] == ["fc-c"]
    aid, kind, at = ex.reported[1]
    assert (aid, kind) == ("fc-a", "success") and at - start >= 1.5
    ex.home.close()


def _submittable(ex, monkeypatch, upload_s: dict) -> list:
    """Make `ex` submit jobs with stand-ins for the stager and the app: a job's
    files take ``upload_s[name]`` seconds to upload; every container costs 0.01
    USD/s (1 core) for 100 s of timeout + 0 s of start-up. Returns the log of
    (name, "upload start"/"upload end"/"spawn"/"submitted", seconds since
    ``ex.t0``)."""
    events = []
    monkeypatch.setattr(
        submission_module, "container_request", lambda job, gpu: ContainerRequest()
    )
    monkeypatch.setattr(submission_module, "runtime_seconds", lambda job: 100)
    monkeypatch.setattr(submission_module, "cpus", lambda job: 1.0)
    monkeypatch.setattr(submission_module, "memory_mb", lambda job: None)
    monkeypatch.setattr(ContainerRequest, "usd_per_second", property(lambda self: 0.01))
    ex.ledger.startup_s = 0.0
    ex.gpu_request = lambda job: None
    ex.budget = lambda job: None

    def log(name, what):
        events.append((name, what, time.monotonic() - ex.t0))

    def upload(stage):
        (name,) = stage
        log(name, "upload start")
        time.sleep(upload_s.get(name, 0.0))
        log(name, "upload end")

    def spawn(spec, gpu, cpu, memory, timeout_s):
        log(spec["stage"][0], "spawn")
        return FunctionCall(f"fc-{spec['stage'][0]}", raises=TimeoutError())

    ex.stager.upload = upload
    ex.app.spawn = spawn
    ex.job_spec = lambda job: {"stage": [job.name], "log": f"{job.name}.log"}
    ex.report_job_submission = lambda info: log(info.job.name, info.external_jobid)
    return events


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "budget_usd, b_starts",
    [(10.0, True), (1.5, False)],
    ids=["room-for-both", "room-for-one"],
)
def test_admission_never_waits_for_another_jobs_upload(
    tmp_path, monkeypatch, budget_usd, b_starts
):
    """
    Job A is admitted and uploads its files for 1.5 s; job B is submitted 0.1 s
    into A's upload. B's admission is decided within 0.3 s, without waiting for A's
    upload: with 10 USD of budget both worst cases (1 USD each: 0.01 USD/s x 100 s)
    fit and B is spawned while A still uploads; with 1.5 USD only one fits, and A's,
    held aside while it uploads, makes B wait (reported submitted as
    ``waiting-1``). A's reservation then becomes its call, counted once.
    """
    ex = _executor(tmp_path, max_cost_usd=budget_usd)
    events = _submittable(ex, monkeypatch, {"A": 1.5})
    first = threading.Thread(target=ex.submit, args=(Job("A"),))
    first.start()
    while not any(e[:2] == ("A", "upload start") for e in events):
        time.sleep(0.01)
    time.sleep(0.1)
    asked = time.monotonic() - ex.t0
    ex.submit(Job("B"))
    decided = time.monotonic() - ex.t0
    assert decided - asked < 0.3
    running = ex.running_calls()
    assert len(running) == 1 + b_starts  # A's reservation (and B's call)
    assert ex._starting and not any(e[:2] == ("A", "upload end") for e in events)
    if b_starts:
        assert [e[:2] for e in events if e[0] == "B"] == [
            ("B", "upload start"),
            ("B", "upload end"),
            ("B", "spawn"),
            ("B", "fc-B"),
        ]
    else:
        assert [e[:2] for e in events if e[0] == "B"] == [("B", "waiting-1")]
        assert "while 1 call(s) run" in ex.logged[-1]
    first.join()
    assert ex._starting == {}
    assert sorted(ex._calls) == ["fc-A", "fc-B"][: 1 + b_starts]
    assert len(ex.running_calls()) == 1 + b_starts
    ex.home.close()


@pytest.mark.timeout(30)
def test_a_job_admitted_during_a_cancel_is_never_spawned(tmp_path, monkeypatch):
    """Ctrl-C while job A uploads (`cancel_every_call`): its reservation is
    cancelled, A is not spawned once its files are up, and its submission fails
    with one line."""
    from snakemake_interface_common.exceptions import WorkflowError

    ex = _executor(tmp_path, max_cost_usd=10.0)
    events = _submittable(ex, monkeypatch, {"A": 0.5})
    failed = []

    def submit():
        try:
            ex.submit(Job("A"))
        except WorkflowError as e:
            failed.append(str(e))

    first = threading.Thread(target=submit)
    first.start()
    while not any(e[:2] == ("A", "upload start") for e in events):
        time.sleep(0.01)
    ex.cancel_every_call()
    first.join()
    assert failed == ["the run was cancelled before its spawn"]
    assert not any(e[1] == "spawn" for e in events)
    assert ex._starting == {} and ex._calls == {}
    ex.home.close()


@pytest.mark.timeout(30)
def test_a_round_before_the_stager_exists_reads_nothing_of_it(tmp_path):
    """Snakemake's status thread runs from the executor's start, while the image is
    built and before ``__post_init__`` has made the stager: a round then has no job
    and must not read it (it did: AttributeError 'stager', the status thread died
    and the scheduler waited for ever)."""
    ex = _executor(tmp_path)
    del ex.stager
    still, seconds = _round(ex, [])
    assert still == [] and ex.reported == [] and seconds < 1.0
