"""
Submission and admission: a job Snakemake hands the executor is spawned if the
budget guard admits it now (`Ledger.admit`), held until a running call ends (reported
submitted as ``waiting-<n>``), or refused; its files are staged and its container
spawned with the admitted timeout (`Submission.start`).

The guard's lock is held only for its arithmetic: an admitted job's worst case is
held aside as a `Reservation` while its files upload, outside the lock, so that
another job's admission never waits for an upload.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
from dataclasses import dataclass

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from .app_state import app_stopped
from .calls import ContainerCall
from .ledger import Admission
from .limits import MAX_TIMEOUT_S
from .prices import ContainerRequest
from .resources import container_request, cpus, memory_mb, runtime_seconds

__all__ = ["Reservation", "Submission"]

_reservations = itertools.count(1)


@dataclass
class Reservation:
    """
    A job admitted whose files upload before its container is spawned: the
    budget holds its worst case aside meanwhile (`Cancellation.running_calls`), as
    it will for its call, so that jobs admitted during the upload are checked
    against the budget left after it.

    Attributes
    ----------
    request : ContainerRequest
        Its container (GPUs, cores, memory), which prices its seconds.
    timeout_s : int
        Its admitted timeout, seconds.
    budget : (float, str) or None
        The budget that applies to it (USD, where it comes from).
    cancelled : bool
        The run was stopped meanwhile (Ctrl-C, the budget reached): it is not
        spawned.
    cost_usd : float
        USD it has cost: none, no container runs yet.
    """

    request: ContainerRequest
    timeout_s: int
    budget: tuple[float, str] | None = None
    cancelled: bool = False
    cost_usd: float = 0.0

    @property
    def usd_per_second(self) -> float:
        """What its container will cost per second once spawned, USD."""
        price = self.request.usd_per_second
        return 0.0 if math.isnan(price) else price

    def reserved_usd(self, startup_s: float) -> float:
        """Its worst case, USD: price x (timeout + `startup_s` seconds)."""
        return self.usd_per_second * (float(self.timeout_s) + startup_s)

    def cancel(self, warn: bool = True) -> bool:
        """Never spawn it (it has no container to stop); True."""
        self.cancelled = True
        return True


class Submission:
    """
    The executor's submission and admission (a part of ``Executor``).

    Reads the executor's state made in ``Executor.__post_init__``: ``settings``,
    ``ledger``, ``app``, ``stager``; the running calls (``_calls``), the jobs waiting
    for budget (``_waiting``, ``_waited``), the calls whose cancel failed
    (``_orphans``) and the jobs admitted whose files upload (``_starting``:
    `Reservation`), under ``_calls_lock``; ``_admit_lock``, under which a job is
    admitted and its worst case reserved as one step, whether submitted
    (Snakemake's thread) or started after waiting (the status thread), so that two
    jobs never pass the guard against the same budget left; the lock is not held
    for the upload and the spawn. ``_app_ended`` (`Status.app_ended`). The running
    calls it holds aside are `Cancellation.running_calls`.
    """

    def not_submitted(self, job_info, msg: str) -> None:
        """Report a job that was not submitted (its own error: ``--retries``
        applies); Snakemake prints no message for a group's error: said here."""
        if job_info.job.is_group():
            self.logger.error(msg)
        self.report_job_error(job_info, msg=msg)

    def submission_error(self, job, e: Exception) -> str:
        """The line of a job whose submission raised `e`."""
        text = (str(e).strip().splitlines() or [""])[0]
        kind = "" if isinstance(e, WorkflowError) else f"{type(e).__name__}: "
        return f"Modal: job {self.get_jobname(job)} not submitted: {kind}{text}"

    def submit(self, job) -> None:
        """
        Spawn the job's container if the budget guard admits it now
        (:meth:`admission`); else hold it until a running call ends (reported
        submitted as ``waiting-<n>``: :meth:`start_waiting` starts it), or refuse
        it (see ``Executor.run_job``).
        """
        name = self.get_jobname(job)
        if self._app_ended is not None:
            msg = f"Modal: job {name} not submitted: {self.ended_with_app()}"
            self.not_submitted(SubmittedJobInfo(job), msg)
            return
        with self._admit_lock:  # admitted and reserved as one step
            admission = self.admission(job)
            if admission.verdict == "refuse":
                msg = f"Modal: job {name}: {admission.message}"
                self.not_submitted(SubmittedJobInfo(job), msg)
                return
            if admission.verdict == "wait":
                with self._calls_lock:
                    self._waited += 1
                    external_id = f"waiting-{self._waited}"
                    self._waiting[external_id] = job
                self.logger.info(f"Modal: job {name} waits: {admission.message}")
                self.report_job_submission(
                    SubmittedJobInfo(job, external_jobid=external_id, aux={})
                )
                return
            key = self.reserve(job, admission)
        call, spec = self.start(job, admission, key)  # no lock held: the upload
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=call.call_id, aux={"spec": spec})
        )

    def admission(self, job) -> Admission:
        """
        What the budget guard says of this job now (`Ledger.admit`): its timeout is
        its ``runtime`` (fixed), else ``--modal-timeout`` (which may be cut to what
        is left of the budget); its price per second is its container's (GPUs,
        cores, memory: `resources.container_request`); the running calls' worst
        cases are held aside.
        """
        request = container_request(job, self.gpu_request(job))
        runtime_s = runtime_seconds(job)
        timeout_s = min(runtime_s or self.settings.timeout, MAX_TIMEOUT_S)
        running = self.running_calls()
        return self.ledger.admit(
            request,
            timeout_s,
            self.budget(job),
            sum(c.reserved_usd(self.ledger.startup_s) for c in running),
            len(running),
            may_cut=runtime_s is None,
        )

    def reserve(self, job, admission: Admission) -> int:
        """Hold an admitted job's worst case aside (a `Reservation` in
        ``_starting``) until its call is registered; call under ``_admit_lock``.
        Returns its key."""
        key = next(_reservations)
        reservation = Reservation(
            container_request(job, self.gpu_request(job)),
            admission.timeout_s,
            self.budget(job),
        )
        with self._calls_lock:
            self._starting[key] = reservation
        return key

    def start(
        self, job, admission: Admission, key: int, external_id: str | None = None
    ) -> tuple[ContainerCall, dict]:
        """
        Stage the job's files and spawn its container with the admitted timeout,
        its worst case held aside meanwhile (the `Reservation` of `key`, which it
        ends: the call registered in ``_calls`` under `external_id`, else its call
        id, in the same step); returns the call and the job's spec. A job whose
        reservation was cancelled during the upload (Ctrl-C, the budget reached) is
        not spawned: raises `WorkflowError`. The call asks Modal for the app's
        state when Modal ends it unasked (`app_state.app_stopped`), and has its
        deadline: timeout + ``--modal-startup-seconds`` +
        ``--modal-deadline-margin-seconds`` (`ContainerCall.set_deadline`).
        """
        try:
            call, spec = self._stage_and_spawn(job, admission, key)
        except BaseException:
            with self._calls_lock:
                self._starting.pop(key, None)
            raise
        with self._calls_lock:
            self._starting.pop(key, None)
            self._calls[external_id or call.call_id] = call
        return call, spec

    def _stage_and_spawn(
        self, job, admission: Admission, key: int
    ) -> tuple[ContainerCall, dict]:
        """`start`'s upload and spawn, outside ``_admit_lock``."""
        if admission.message:  # its timeout was cut to the budget left
            self.logger.warning(
                f"Modal: job {self.get_jobname(job)}: {admission.message}"
            )
        gpu = self.gpu_request(job)
        spec = self.job_spec(job)
        self.stager.upload(spec["stage"])
        with self._calls_lock:
            cancelled = self._starting[key].cancelled
        if cancelled:
            raise WorkflowError(
                self.ledger.exhausted or "the run was cancelled before its spawn"
            )
        handle = self.app.spawn(
            spec, gpu, cpus(job), memory_mb(job), admission.timeout_s
        )
        call = ContainerCall(
            handle,
            gpu,
            admission.timeout_s,
            warn=self.logger.warning,
            request=container_request(job, gpu),
        )
        call.budget = self.budget(job)
        # only an app that Modal says has ended ends the run (`ContainerCall.poll`)
        call.app_stopped = functools.partial(app_stopped, self.app.app)
        call.set_deadline(
            self.ledger.startup_s, float(self.settings.deadline_margin_seconds)
        )
        return call, spec

    async def start_waiting(self, job_info) -> bool:
        """
        Start a job that waits for budget if the guard admits it now; True while it
        is active (started, or still waiting), False once it was refused or failed
        to start (reported).
        """
        job = job_info.job
        name = self.get_jobname(job)
        try:
            started = await asyncio.to_thread(self._start_if_admitted, job_info)
            if started is None:
                return True
        except Exception as e:
            with self._calls_lock:
                self._waiting.pop(job_info.external_jobid, None)
            self.not_submitted(job_info, self.submission_error(job, e))
            return False
        call, spec = started
        self.logger.info(f"Modal: job {name} started ({call.call_id})")
        job_info.aux["spec"] = spec
        return True

    def _start_if_admitted(self, job_info) -> tuple | None:
        """A waiting job's admission and start, as one step (`_admit_lock`): the
        call and its spec, None while it still waits; raises when refused."""
        if self._app_ended is not None:
            raise WorkflowError(self.ended_with_app())
        with self._admit_lock:  # the guard's arithmetic only, not the upload
            admission = self.admission(job_info.job)
            if admission.verdict == "wait":
                return None
            if admission.verdict == "refuse":
                raise WorkflowError(admission.message)
            key = self.reserve(job_info.job, admission)
        with self._calls_lock:  # started: no longer waiting
            self._waiting.pop(job_info.external_jobid, None)
        return self.start(job_info.job, admission, key, job_info.external_jobid)
