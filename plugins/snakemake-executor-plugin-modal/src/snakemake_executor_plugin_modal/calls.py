"""
One Modal function call per Snakemake job: poll it without blocking, classify how
it ended (`Outcome`), cancel it (`ContainerCall`).

This module also keeps importable, from where the workflow and earlier code import
them, the names that moved to a module of their own: the run's app and its
lifetime (`app`), the ledger and its budget guard (`ledger`), what Modal's errors
mean (`errors`), the run's fixed bounds (`limits`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from .app import HEARTBEAT_INTERVAL_S, Pauses, RunApp, heartbeat_interval_s
from .errors import (
    first_line,
    raised_in_container,
    start_error,
    transport_errors,
    unreadable_errors,
)
from .ledger import Admission, Ledger
from .limits import DEADLINE_MARGIN_S, MIN_TIMEOUT_S, MOUNT, STARTUP_S
from .prices import ContainerRequest, GpuRequest

__all__ = [
    "CANCEL_ATTEMPTS",
    "TRANSPORT_GRACE_S",
    "ContainerCall",
    "Outcome",
    # kept importable from here (defined in app, errors, ledger, limits)
    "HEARTBEAT_INTERVAL_S",
    "MIN_TIMEOUT_S",
    "MOUNT",
    "STARTUP_S",
    "Admission",
    "Ledger",
    "Pauses",
    "RunApp",
    "heartbeat_interval_s",
    "raised_in_container",
    "start_error",
    "transport_errors",
    "unreadable_errors",
]

#: Rounds of cancels at Ctrl-C (`Cancellation.cancel_every_call`), 1 and 2 s apart;
#: in the status loop a cancel is tried once per status check, never waited on.
CANCEL_ATTEMPTS = 3
#: Seconds of client-side transport errors (no answer from Modal) after which a call
#: whose status cannot be read is given up as failed; before that it counts as running.
TRANSPORT_GRACE_S = 600.0


@dataclass
class Outcome:
    """
    How a finished call ended.

    Attributes
    ----------
    ok : bool
        The job's command exited with status 0.
    message : str
        For a failure: what happened (one line; the log's tail is added by the
        executor, which fetches the log).
    result : dict or None
        What :func:`~snakemake_executor_plugin_modal.container.run_job` returned, if it
        returned.
    remote : bool
        The call ended with an exception raised in the container.
    given_up : bool
        The call's status could not be read for the whole grace period: it may still
        run (the executor cancels it).
    ended_by_modal : bool
        Modal ended the call without a cancel from this run (``RemoteError``, not
        raised in the container) and says the run's app has ended (see
        :meth:`ContainerCall.poll`).
    lost : bool
        Modal ended the call without a cancel from this run while the run's app
        runs on: its container was lost (killed by the kernel's OOM killer, its
        process killed, its worker lost) or the call cancelled from outside the
        run; this job's failure only.
    past_deadline : bool
        No output came within the call's deadline
        (:attr:`ContainerCall.deadline_s`): the call was cancelled.
    """

    ok: bool
    message: str = ""
    result: dict | None = None
    remote: bool = False
    given_up: bool = False
    ended_by_modal: bool = False
    lost: bool = False
    past_deadline: bool = False


class ContainerCall:
    """
    A job running in a Modal container.

    Parameters
    ----------
    call : modal.FunctionCall
    gpu : GpuRequest or None
        None: a CPU-only container.
    timeout_s : int
        Seconds after which Modal stops the container.
    warn : callable
        Where transport errors are reported (the executor's logger).
    grace_s : float
        Seconds of transport errors in a row after which the call is given up.
    app_stopped : callable or None
        Asks Modal whether the run's app has ended (`app_state.app_stopped` bound to
        the app); None: a call that Modal ended without a cancel from this run is
        taken as the app's end.
    startup_s, margin_s : float
        The start-up bound and the margin (seconds) that, with `timeout_s`, make
        the call's deadline (:meth:`set_deadline`).
    request : ContainerRequest or None
        What its container requested (GPUs, cores, memory), which prices its
        seconds; None: `gpu` with Modal's default cores and memory.
    """

    def __init__(
        self,
        call,
        gpu: GpuRequest | None,
        timeout_s,
        warn: Callable[[str], None] = print,
        grace_s: float = TRANSPORT_GRACE_S,
        app_stopped: Callable[[], bool] | None = None,
        startup_s: float = STARTUP_S,
        margin_s: float = DEADLINE_MARGIN_S,
        request: ContainerRequest | None = None,
    ):
        self.call = call
        self.gpu = gpu
        self.request = request or ContainerRequest(gpu)
        self.timeout_s = timeout_s
        self.warn = warn
        self.grace_s = grace_s
        self.started = time.monotonic()
        #: When it was spawned, on `Pauses.clock` (a pause of this process since
        #: then may have ended its app).
        self.spawned_at = Pauses.clock()
        self.ended: float | None = None
        #: Whether ``cancel`` reached Modal.
        self.cancelled = False
        #: The budget that applied when it started (USD, where it comes from).
        self.budget: tuple[float, str] | None = None
        self._unreachable_since: float | None = None
        self.app_stopped = app_stopped
        self.set_deadline(startup_s, margin_s)

    def set_deadline(self, startup_s: float, margin_s: float) -> None:
        """
        Set :attr:`deadline_s`, the seconds from the spawn after which a call whose
        output has not come is cancelled and its job failed (:meth:`poll`): its
        timeout (Modal stops the container then) + `startup_s` (the most its
        container may take to start, declared as Modal's ``startup_timeout``) +
        `margin_s` (what neither counts: the wait to be scheduled, a GPU's queue,
        the output's way back; ``limits.DEADLINE_MARGIN_S`` says why).
        """
        self.startup_s = float(startup_s)
        self.margin_s = float(margin_s)
        #: Seconds from the spawn within which the call's output must come.
        self.deadline_s = float(self.timeout_s) + self.startup_s + self.margin_s

    @property
    def call_id(self) -> str:
        """Modal's id of the function call (``fc-...``)."""
        return self.call.object_id

    def poll(self) -> Outcome | None:
        """
        The outcome if the call has ended, else None; never blocks.

        What ``FunctionCall.get(timeout=0)`` raised is classified by where it came
        from (:func:`raised_in_container`):

        - raised in the container (Modal pickles it there and raises it again here
          with its own class: ``TimeoutError``, ``OSError``, even
          ``modal.exception.ConnectionError``): the job's failure, whatever its class;
        - ``FunctionTimeoutError`` (Modal stopped the container at its timeout),
          ``OutputExpiredError`` (the call ended, its result is gone): failures;
        - the bare builtin ``TimeoutError()`` that ``_FunctionCall.poll_function``
          raises when no output is there yet (``modal/_functions.py``): running,
          until the call's deadline (:attr:`deadline_s` seconds after its spawn);
          past it a failure marked ``past_deadline``, and the call is cancelled;
        - ``RemoteError`` itself (not a subclass), not raised in the container, after
          no cancel of this run: Modal ended the call. ``_process_result``
          (``modal/_utils/function_utils.py``) raises it for an input that ended
          without data in any status but success, timeout and internal failure: a
          stopped app's calls (``GENERIC_STATUS_TERMINATED``) and a lost
          container's alike (``GENERIC_STATUS_KERNEL_OOM_KILL``, or ``TERMINATED``
          for a process killed by a signal; modal_proto/api.proto). So Modal is
          asked for the app's state (``app_stopped``): ended, a failure marked
          ``ended_by_modal``; running, this job's failure marked ``lost`` (retried
          where Snakemake's ``retries`` allow; the other calls run on); the state
          not readable (a transport error), running for now as below, the question
          asked again at the next check; neither is cancelled again (the input
          has ended);
        - a client-side transport error or a rate limit (:func:`unreadable_errors`):
          running, reported, for at most ``grace_s`` seconds in a row, then a
          failure, and the call is cancelled;
        - anything else (Modal's ``ExecutionError``, ``InternalFailure``,
          ``RemoteError``; the client's ``AuthError`` for a token revoked
          meanwhile, ``NotFoundError``, ``PermissionDeniedError``, ...): a failure,
          and the call is cancelled.

        A call that may still run is never left running: it is cancelled
        (``FunctionCall.cancel``, once, tried again at the next status check where
        that fails: :meth:`cancel`)
        before its failure is returned, since its container would go on billing and
        committing beside the retry's; its seconds up to then are what
        :attr:`seconds` counts.
        """
        try:
            result = self.call.get(timeout=0)
        except Exception as e:  # classified below; nothing is let through
            return self._outcome_of(e)
        self._unreachable_since = None
        ok = result["returncode"] == 0
        message = (
            "" if ok else f"the job's command exited with status {result['returncode']}"
        )
        self.ended = time.monotonic()
        return Outcome(ok, message, result)

    def _outcome_of(self, e: Exception) -> Outcome | None:
        """The outcome that an exception raised by ``get`` stands for (see poll)."""
        import modal.exception

        if raised_in_container(e):  # the function ended by raising
            outcome = Outcome(
                False,
                f"the container raised {type(e).__name__}: {first_line(e)}",
                remote=True,
            )
        elif isinstance(e, modal.exception.FunctionTimeoutError):  # Modal stopped it
            outcome = Outcome(
                False, f"the container ran past its timeout of {self.timeout_s} s"
            )
        elif isinstance(e, modal.exception.OutputExpiredError):  # it had ended
            outcome = Outcome(
                False,
                "Modal no longer holds the call's result (OutputExpiredError); its "
                "committed files are on the volume and are reused by a retry",
            )
        elif type(e) is modal.exception.RemoteError and not self.cancelled:
            try:
                stopped, unread = self.app_stopped is None or self.app_stopped(), ""
            except Exception as state_error:  # classified: nothing is let through
                if isinstance(state_error, unreadable_errors()):
                    return self._unreadable(state_error)
                stopped = False
                unread = (
                    f" (the app's state could not be read: "
                    f"{type(state_error).__name__}: {first_line(state_error)})"
                )
            said = f"({type(e).__name__}: {first_line(e)})"
            if stopped:
                outcome = Outcome(
                    False,
                    f"Modal ended the call without a cancel from this run {said}",
                    ended_by_modal=True,
                )
            else:
                outcome = Outcome(
                    False,
                    f"its container was lost {said}: Modal ended the call without "
                    "a cancel from this run while the run's app runs on (killed by "
                    "the kernel's OOM killer, its process killed, its worker lost, "
                    f"or the call cancelled from outside){unread}; this job fails "
                    "(and is retried where its retries allow), the others run on",
                    lost=True,
                )
        elif type(e) is TimeoutError and not e.args:  # poll_function: no output yet
            self._unreachable_since = None
            waited_s = time.monotonic() - self.started
            if waited_s <= self.deadline_s:
                return None
            # Modal never said how it ended: stopped, so that a retry is the only
            # container writing its files (it may run and bill on)
            outcome = Outcome(
                False,
                f"no output from Modal within the call's deadline of "
                f"{self.deadline_s:.0f} s after its spawn (its timeout "
                f"{float(self.timeout_s):.0f} s + start-up {self.startup_s:.0f} s + "
                f"margin {self.margin_s:.0f} s, --modal-deadline-margin-seconds); "
                "the call is cancelled",
                past_deadline=True,
            )
            self.cancel()
            return outcome
        elif isinstance(e, unreadable_errors()):
            return self._unreadable(e)
        else:
            # Modal's verdict (a lost worker: ``InternalFailure``, "lost inputs or
            # worker preemption", modal/_functions.py; an internal failure) or the
            # client's own error (a token revoked meanwhile, a call Modal cannot
            # find): the container may still run, so it is cancelled before the job
            # fails
            outcome = Outcome(
                False, f"the Modal call failed: {type(e).__name__}: {first_line(e)}"
            )
            self.cancel()
            return outcome
        self.ended = self.ended or time.monotonic()
        return outcome

    def _unreadable(self, e: Exception) -> Outcome | None:
        """
        The call's status (or its app's state) could not be read (`e`, one of
        :func:`unreadable_errors`): running, reported, for at most ``grace_s``
        seconds in a row; then a failure marked ``given_up``, and the call is
        cancelled.
        """
        now = time.monotonic()
        since = self._unreachable_since = self._unreachable_since or now
        if now - since < self.grace_s:
            self.warn(
                f"Modal call {self.call_id}: status not readable "
                f"({type(e).__name__}: {e}); still taken as running "
                f"({now - since:.0f} of {self.grace_s:.0f} s)"
            )
            return None
        # it may still run, bill and commit: stopped, so that a retry is the only
        # container writing its files (Modal: the last commit wins)
        outcome = Outcome(
            False,
            f"Modal could not be reached for {self.grace_s:.0f} s "
            f"({type(e).__name__}: {e}); the call is given up and cancelled",
            given_up=True,
        )
        self.cancel()
        return outcome

    def cancel(self, warn: bool = True) -> bool:
        """
        Stop the container (``FunctionCall.cancel(terminate_containers=True)``),
        tried once, never waited on: True once Modal took it. A refused cancel is
        reported (where `warn`), not raised, and costs the status check no more than
        the one request: the call counts as running (its seconds go on counting in
        :attr:`seconds`), the executor tries again at the next status check
        (`Cancellation.cancel_orphans`; at Ctrl-C, `CANCEL_ATTEMPTS` rounds), and
        stops the app at the run's end.
        """
        if self.cancelled:
            return True
        try:
            self.call.cancel(terminate_containers=True)
        except Exception as e:  # reported; tried again by the next check
            if warn:
                self.warn(
                    f"Modal call {self.call_id}: cancel failed "
                    f"({type(e).__name__}: {first_line(e)}); its container may "
                    "still run and bill: counted as running, cancelled again at the "
                    "next status check"
                )
            return False
        self.cancelled = True
        self.ended = self.ended or time.monotonic()
        return True

    def reserved_usd(self, startup_s: float) -> float:
        """
        What the budget keeps aside for this call while it runs: its worst case
        (price x (timeout + `startup_s`)), or what it has cost so far where that is
        more (a call that waited for a GPU, or could not be cancelled).
        """
        worst = self.usd_per_second * (float(self.timeout_s) + startup_s)
        return max(worst, self.cost_usd)

    @property
    def seconds(self) -> float:
        """Wall-clock seconds from submission to the end (or now), what Modal bills."""
        return (self.ended or time.monotonic()) - self.started

    @property
    def usd_per_second(self) -> float:
        """What the call's container (GPUs, cores, memory) costs per second, USD
        (0 for a GPU type without a price)."""
        price = self.request.usd_per_second
        return 0.0 if math.isnan(price) else price

    @property
    def cost_usd(self) -> float:
        """USD of the container so far (0 for a GPU type without a price)."""
        return self.usd_per_second * self.seconds
