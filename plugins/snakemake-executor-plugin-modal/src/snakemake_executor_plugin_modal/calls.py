"""
The run's Modal app and one function call per Snakemake job: start the app once
(building the image, with Modal's build output shown), spawn each job with its own
resources, poll it without blocking, cancel it; and the ledger of GPU-seconds spent
against a budget.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from snakemake_interface_common.exceptions import WorkflowError

from .container import run_job
from .preflight import oauth_in_use
from .prices import GpuRequest

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "MIN_TIMEOUT_S",
    "MOUNT",
    "STARTUP_S",
    "Admission",
    "TRANSPORT_GRACE_S",
    "ContainerCall",
    "Ledger",
    "Outcome",
    "Pauses",
    "RunApp",
    "heartbeat_interval_s",
    "raised_in_container",
    "start_error",
    "transport_errors",
    "unreadable_errors",
]

#: Where containers mount the volume. ``SNAKEMAKE_MODAL_TEST_MOUNT`` moves it, read
#: when this module is imported: the plugin's tests put it below a temporary folder,
#: the only place where their local Modal server mounts volumes
#: (tests/modal_server/README.md). Not a setting: on Modal the path never matters.
MOUNT = os.environ.get("SNAKEMAKE_MODAL_TEST_MOUNT") or "/snakemake-volume"
#: The most seconds a container may take to start, by default (``--modal-startup-
#: seconds``): declared with every function as Modal's ``startup_timeout`` (a
#: container that takes longer fails) and held by the budget beyond each call's
#: timeout (`Ledger.startup_s`), so that what Modal may bill before a call's timeout
#: starts is what the ledger counts. Modal 1.6.4 otherwise sets ``startup_timeout =
#: timeout`` (``App.function``, ``modal/app.py``; "startup_timeout: Maximum startup
#: time in seconds with higher precedence than timeout", its docstring).
STARTUP_S = 120
#: The shortest timeout a job without a ``runtime`` is started with when its default
#: timeout is cut to what is left of the budget, seconds.
MIN_TIMEOUT_S = 60
#: Times a cancel is tried before the call is left to the next status check.
CANCEL_ATTEMPTS = 3
#: Seconds of client-side transport errors (no answer from Modal) after which a call
#: whose status cannot be read is given up as failed; before that it counts as running.
TRANSPORT_GRACE_S = 600.0


def transport_errors() -> tuple[type[BaseException], ...]:
    """
    Exceptions that, raised by the client itself (not in the container: see
    :func:`raised_in_container`), mean "Modal could not be asked", not "the call
    failed": the client's network (``OSError``, which includes Python's
    ``ConnectionError`` and a socket's ``TimeoutError``), Modal's ``ConnectionError``
    (what ``modal/_utils/grpc_utils.py`` raises once its retries of an ``OSError`` are
    spent), its ``TimeoutError`` (``RetryTimeoutError`` there, once the total deadline
    is spent), ``InternalError`` and ``ServiceError`` (server side, retryable), and
    grpclib's transport errors (Modal 1.6 speaks gRPC through grpclib).
    """
    import modal.exception

    errors = [
        OSError,
        modal.exception.ConnectionError,
        modal.exception.TimeoutError,
        modal.exception.InternalError,
        modal.exception.ServiceError,
    ]
    # the client's transport (a dependency of modal): a connection lost mid-call
    from grpclib.exceptions import StreamTerminatedError

    errors.append(StreamTerminatedError)
    return tuple(errors)


def unreadable_errors() -> tuple[type[BaseException], ...]:
    """
    Client-side errors after which a call counts as running for a while (its status
    could not be read, the call itself is fine): the transport errors
    (:func:`transport_errors`) and Modal's rate limit, ``ResourceExhaustedError``
    (gRPC RESOURCE_EXHAUSTED: the workspace sent too many requests).
    """
    import modal.exception

    return (*transport_errors(), modal.exception.ResourceExhaustedError)


#: How Modal names the frames of a traceback that come from a container: the file name
#: prefixed with ``<task id>:`` (``extract_traceback`` in ``modal/_traceback.py``).
_CONTAINER_FRAME = re.compile(r"^<ta-[^>]*>:")


def raised_in_container(exc: BaseException) -> bool:
    """
    Whether an exception that ``FunctionCall.get`` raised was raised in the container
    (and pickled there, then raised again here with its own class), not by the client.

    Modal 1.6 marks such an exception in two ways, both copied here: its container
    prefixes the traceback's file names with ``<task id>:`` (``extract_traceback``,
    ``modal/_traceback.py``, called by ``pickle_traceback`` in
    ``modal/_serialization.py`` from ``_runtime/container_io_manager.py``), and the
    client that raises it again gives it a ``__line_cache__`` attribute
    (``append_modal_tb``, ``modal/_traceback.py``, from ``_process_result`` in
    ``modal/_utils/function_utils.py``). An exception of the client's own (a transport
    error, ``poll_function``'s ``TimeoutError``) has neither.

    Parameters
    ----------
    exc : BaseException
        What ``FunctionCall.get`` raised.

    Returns
    -------
    bool
    """
    if getattr(exc, "__line_cache__", None) is not None:
        return True
    for frame in traceback.extract_tb(exc.__traceback__):
        if _CONTAINER_FRAME.match(frame.filename or ""):
            return True
    return False


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


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
        raised in the container): its app was stopped, or the call cancelled from
        outside the run (see :meth:`ContainerCall.poll`).
    """

    ok: bool
    message: str = ""
    result: dict | None = None
    remote: bool = False
    given_up: bool = False
    ended_by_modal: bool = False


class RunApp:
    """
    The run's one Modal app: one function running
    :func:`~snakemake_executor_plugin_modal.container.run_job` without a GPU, and
    one with ``--modal-gpu`` (a fallback list is allowed there only: Modal 1.6's
    ``with_options`` takes one GPU type). Each job is spawned through
    ``Function.with_options`` with its own CPU, memory, GPU and timeout.

    Containers serve one input each (``single_use_containers``): a container kept
    warm would run the next job on the volume view of the previous one.

    Parameters
    ----------
    name : str
        App name, shown in Modal's dashboard.
    image : modal.Image
    volume : modal.Volume
    timeout_s : int
        Default timeout of a call, seconds.
    default_gpu : GpuRequest or None
        ``--modal-gpu``.
    ephemeral_disk_mb : int or None
        Scratch disk of every container, MiB (Modal sets it per function).
    secrets : list of modal.Secret
        Environment variables of every container (``--envvars``).
    fallback_gpus : list of GpuRequest
        Other GPU fallback lists that jobs request (their ``modal_gpu`` resource):
        one function each, declared before the app starts.
    startup_timeout_s : int
        The most seconds a container may take to start (``--modal-startup-seconds``,
        default :data:`STARTUP_S`: what the budget keeps aside beyond a call's
        timeout), declared with every function as Modal's ``startup_timeout``:
        without it modal 1.6.4 sets ``startup_timeout = timeout`` (``modal/app.py``,
        ``App.function``), so a container could spend its whole timeout starting,
        billed beyond what the ledger holds; ``with_options`` cannot change it
        (``FunctionBindParams`` carries no start-up timeout, ``modal/_functions.py``).

    Raises
    ------
    WorkflowError
        If the image cannot be built or the app cannot start: one line naming what
        went wrong (:func:`start_error`).
    """

    def __init__(
        self,
        name: str,
        image,
        volume,
        timeout_s: int,
        default_gpu: GpuRequest | None,
        ephemeral_disk_mb: int | None = None,
        secrets: list | None = None,
        fallback_gpus: list[GpuRequest] | None = None,
        startup_timeout_s: int = STARTUP_S,
    ):
        import modal

        self.default_gpu = default_gpu
        self.app = modal.App(name)
        options = dict(
            image=image,
            volumes={MOUNT: volume},
            timeout=int(timeout_s),
            serialized=True,
            single_use_containers=True,
            secrets=list(secrets or []),
            startup_timeout=int(startup_timeout_s),
        )
        if ephemeral_disk_mb:
            options["ephemeral_disk"] = int(ephemeral_disk_mb)
        self.cpu_function = self.app.function(**options, name="run_job")(run_job)
        # GPU request -> its function (a fallback list is allowed only here)
        self.gpu_functions = {}
        for i, gpu in enumerate(dict.fromkeys([default_gpu, *(fallback_gpus or [])])):
            if gpu is not None:
                self.gpu_functions[gpu] = self.app.function(
                    **options, gpu=gpu.modal_spec, name=f"run_job_gpu{i or ''}"
                )(run_job)
        self.gpu_function = self.gpu_functions.get(default_gpu)
        # The image is built first, its build output shown (objects print their own
        # output under enable_output: modal/_image.py); the app is started outside
        # enable_output, which would stream every container's output and a spinner
        # here for the app's whole life (modal/runner.py, _run_app). Containers'
        # output goes to each job's log and to Modal's dashboard.
        try:
            with modal.enable_output():
                image.build()
            self._run = self.app.run()
            self._run.__enter__()
        except Exception as e:
            self._run = None
            raise start_error(
                e, [gpu.modal_spec for gpu in self.gpu_functions]
            ) from None

    @property
    def app_id(self) -> str:
        """
        Modal's id of the running app (``ap-...``): what ``modal app logs`` takes for
        an ephemeral app, which has no name the CLI can look up.
        """
        return getattr(self.app, "app_id", None) or "<app id: see Modal's dashboard>"

    def spawn(
        self, spec: dict, gpu: GpuRequest | None, cpu: float, memory_mb, timeout_s
    ):
        """Start one job; returns Modal's ``FunctionCall``."""
        return self.bound(gpu, cpu, memory_mb, timeout_s).spawn(spec)

    def bound(self, gpu: GpuRequest | None, cpu: float, memory_mb, timeout_s):
        """
        The function a job is spawned on: the app's function for its GPU, bound
        with ``Function.with_options`` to its CPU, memory, GPU and timeout (its
        start-up timeout stays the function's: ``FunctionOptions`` has none,
        ``modal/_function_variants.py``, modal 1.6.4).

        Raises
        ------
        WorkflowError
            For a GPU fallback list that no function of the app declares.
        """
        options = dict(cpu=float(cpu), timeout=int(timeout_s))
        if memory_mb:
            options["memory"] = int(memory_mb)
        if gpu is None:
            function = self.cpu_function
        elif gpu in self.gpu_functions:
            function = self.gpu_functions[gpu]  # may hold a fallback list
        elif gpu.fallbacks:
            raise WorkflowError(
                f"GPU fallback list {','.join(gpu.types)} was not planned when the "
                "run started (Modal takes a list only where a function is declared); "
                "give one GPU type for this job"
            )
        else:
            function = self.gpu_function or self.cpu_function
            options["gpu"] = gpu.modal_spec
        return function.with_options(**options)

    def stop(self, warn: Callable[[str], None] = print) -> None:
        """Stop the app (idempotent); an error doing so is reported, not raised."""
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.__exit__(None, None, None)
        except Exception as e:  # the run's results are home; only the app is left
            warn(f"Modal: could not stop the app cleanly ({type(e).__name__}: {e})")


def start_error(
    exc: BaseException, gpus: list | None = None, doing: str = "start the run's app"
) -> WorkflowError:
    """
    What went wrong when the run's image was built or its app started, named for what
    it is, as one line a user can act on; nothing was submitted.

    Parameters
    ----------
    exc : BaseException
        What ``Image.build`` or entering ``App.run()`` raised.
    gpus : list, optional
        The GPU specifications of the app's functions (named when the server rejects
        one).
    doing : str
        What the client was doing, for the line of an unreachable Modal.

    Returns
    -------
    WorkflowError

    Notes
    -----
    Modal 1.6 raises, at this point: ``ImageBuildError`` (a failed build step; its
    message names ``modal image logs <id>``), ``AuthError`` (a wrong, revoked or
    expired token), ``InvalidError`` from the server (a GPU type it does not offer,
    a Python its image builder does not support: ``_validate_python_version`` in
    ``modal/_image.py``), ``ModuleNotMountable`` (``modal/_utils/package_utils.py``:
    a local package that cannot be mounted; not a ``modal.exception.Error``), and the
    client's ``ConnectionError`` when Modal cannot be reached.
    """
    import modal.exception

    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = f"{type(exc).__name__}: {first}"
    tail = "; nothing was submitted"
    if isinstance(exc, modal.exception.ImageBuildError):
        image_id = getattr(exc, "image_id", None)
        hint = f"; see `modal image logs {image_id}`" if image_id else ""
        return WorkflowError(
            f"Modal: the container image could not be built ({what}){hint}{tail}"
        )
    if isinstance(exc, modal.exception.AuthError):
        if oauth_in_use():
            given = (
                "the OAuth credentials (MODAL_OAUTH_*) are wrong, revoked or "
                "expired; renew them with your identity provider"
            )
        else:
            given = (
                "the token is wrong, revoked or expired; run `modal token new` (or "
                "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET)"
            )
        return WorkflowError(f"Modal refused the credentials ({what}): {given}{tail}")
    if isinstance(exc, modal.exception.ModuleNotMountable):
        return WorkflowError(
            f"--modal-local-packages: a package cannot be copied into the image "
            f"({what}); name importable packages of Python source files{tail}"
        )
    if isinstance(exc, modal.exception.InvalidError) and "gpu" in text.lower():
        named = f" (this run asks for {', '.join(map(str, gpus))})" if gpus else ""
        return WorkflowError(
            f"Modal rejected the GPU request{named} ({what}): check --modal-gpu and "
            f"the jobs' modal_gpu or gpu_model resources{tail}"
        )
    if isinstance(exc, modal.exception.InvalidError) and "python" in text.lower():
        return WorkflowError(
            f"Modal's image builder does not offer this Python ({what}); run "
            f"Snakemake from a Python it supports{tail}"
        )
    if isinstance(exc, transport_errors()):
        return WorkflowError(
            f"Modal could not be reached to {doing} ({what}); check the "
            f"network and start the run again{tail}"
        )
    return WorkflowError(f"Modal: the run's app could not start ({what}){tail}")


#: Seconds between the heartbeats of Modal's client, where its config gives none
#: (``heartbeat_interval``, 15 by default: ``modal/config.py``).
HEARTBEAT_INTERVAL_S = 15.0


def heartbeat_interval_s() -> float:
    """
    Seconds between two heartbeats of Modal's client to the run's app: its
    ``heartbeat_interval`` setting (``MODAL_HEARTBEAT_INTERVAL``; ``modal/config.py``,
    read by ``modal/client.py`` as ``HEARTBEAT_INTERVAL``), else
    :data:`HEARTBEAT_INTERVAL_S`.
    """
    try:
        import modal.config

        value = modal.config.config.get("heartbeat_interval")
        return float(value) if value else HEARTBEAT_INTERVAL_S
    except Exception:  # noqa: BLE001 (a client without the setting: the default)
        return HEARTBEAT_INTERVAL_S


class Pauses:
    """
    When this process did not run: a daemon thread that ticks every `tick_s`
    seconds and records each gap between two ticks longer than `least_s` beyond
    the tick (the machine asleep, the process stopped with SIGSTOP or starved).

    Modal's client heartbeats the run's ephemeral app from this process every
    ``heartbeat_interval`` seconds (15 by default, ``modal/config.py``;
    ``_run_app``'s heartbeat loop, ``modal/runner.py``), and Modal stops an
    ephemeral app whose client is no longer connected ("Ephemeral Apps are stopped
    automatically when the calling program exits, or when the server detects that
    the client is no longer connected", Modal's docs, guide "Apps"): while this
    process does not run, no heartbeat leaves it. What the gaps show is said with the
    line that names an app that ended (the executor's ``app_ended``).

    The clock is ``CLOCK_BOOTTIME`` where the system has it (Linux: it counts a
    suspended machine's sleep, which ``time.monotonic`` does not, and is not moved
    by clock adjustments), else ``time.monotonic``.

    Parameters
    ----------
    least_s : float
        Gaps shorter than this (seconds beyond one tick) are not recorded: the
        client's heartbeat interval (one heartbeat missed at least).
    tick_s : float
        Seconds between ticks.
    """

    def __init__(self, least_s: float, tick_s: float = 1.0):
        self.least_s = float(least_s)
        self.tick_s = float(tick_s)
        #: (when it ended on :meth:`clock`, its length in seconds) per gap
        self.gaps: list[tuple[float, float]] = []
        self._last = self.clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="modal-pauses", daemon=True
        )
        self._thread.start()

    @staticmethod
    def clock() -> float:
        """Seconds on the clock the gaps are measured with (see the class)."""
        boottime = getattr(time, "CLOCK_BOOTTIME", None)
        if boottime is not None:
            return time.clock_gettime(boottime)
        return time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            now = self.clock()
            gap = now - self._last - self.tick_s
            if gap >= self.least_s:
                self.gaps.append((now, gap))
            self._last = now

    def longest(self, since: float | None = None) -> float:
        """
        The longest gap (seconds) that ended after `since` (on :meth:`clock`; None:
        any), 0 if none; the gap up to now counts too (a thread that asks right
        after the process resumed may run before this one's next tick).
        """
        now = self.clock()
        gaps = [*self.gaps, (now, now - self._last - self.tick_s)]
        return max(
            (
                g
                for at, g in gaps
                if g >= self.least_s and (since is None or at > since)
            ),
            default=0.0,
        )

    def stop(self) -> None:
        """End the thread (at the run's end)."""
        self._stop.set()


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
    """

    def __init__(
        self,
        call,
        gpu: GpuRequest | None,
        timeout_s,
        warn: Callable[[str], None] = print,
        grace_s: float = TRANSPORT_GRACE_S,
    ):
        self.call = call
        self.gpu = gpu
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
          raises when no output is there yet (``modal/_functions.py``): running;
        - ``RemoteError`` itself (not a subclass), not raised in the container, after
          no cancel of this run:
          Modal ended the call (what the client raises for an input that ended
          ``GENERIC_STATUS_TERMINATED`` without data, ``_process_result`` in
          ``modal/_utils/function_utils.py``: a stopped app's calls end so); a
          failure marked ``ended_by_modal``, not cancelled again;
        - a client-side transport error or a rate limit (:func:`unreadable_errors`):
          running, reported, for at most ``grace_s`` seconds in a row, then a
          failure, and the call is cancelled;
        - anything else (Modal's ``ExecutionError``, ``InternalFailure``,
          ``RemoteError``; the client's ``AuthError`` for a token revoked
          meanwhile, ``NotFoundError``, ``PermissionDeniedError``, ...): a failure,
          and the call is cancelled.

        A call that may still run is never left running: it is cancelled
        (``FunctionCall.cancel``, tried again where that fails: :meth:`cancel`)
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
                f"the container raised {type(e).__name__}: {_first_line(e)}",
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
            outcome = Outcome(
                False,
                "Modal ended the call without a cancel from this run "
                f"({type(e).__name__}: {_first_line(e)})",
                ended_by_modal=True,
            )
        elif type(e) is TimeoutError and not e.args:  # poll_function: no output yet
            self._unreachable_since = None
            return None
        elif isinstance(e, unreadable_errors()):
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
        else:
            # Modal's verdict (a lost container, an internal failure) or the client's
            # own error (a token revoked meanwhile, a call Modal cannot find): the
            # container may still run, so it is cancelled before the job fails
            outcome = Outcome(
                False, f"the Modal call failed: {type(e).__name__}: {_first_line(e)}"
            )
            self.cancel()
            return outcome
        self.ended = self.ended or time.monotonic()
        return outcome

    def cancel(self, attempts: int = CANCEL_ATTEMPTS) -> bool:
        """
        Stop the container (``FunctionCall.cancel(terminate_containers=True)``),
        trying `attempts` times (1, 2, 4, ... s apart); True once Modal took it.
        A cancel that failed every time is reported, not raised: the call counts as
        running (its seconds go on counting in :attr:`seconds`) and the executor
        tries again at every status check, then stops the app at the run's end.
        """
        if self.cancelled:
            return True
        for attempt in range(attempts):
            try:
                self.call.cancel(terminate_containers=True)
            except Exception as e:
                error = e
                if attempt + 1 < attempts:
                    time.sleep(2.0**attempt)
                continue
            self.cancelled = True
            self.ended = self.ended or time.monotonic()
            return True
        self.warn(
            f"Modal call {self.call_id}: cancel failed {attempts} time(s) "
            f"({type(error).__name__}: {error}); its container may still run and "
            "bill: counted as running, cancelled again at the next status check"
        )
        return False

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
        """What the call's GPUs cost per second (0 when not priced)."""
        if self.gpu is None or math.isnan(self.gpu.usd_per_second):
            return 0.0
        return self.gpu.usd_per_second

    @property
    def cost_usd(self) -> float:
        """USD of the GPUs so far (0 for a CPU-only container or an unknown type)."""
        return self.usd_per_second * self.seconds


@dataclass
class Admission:
    """
    What the budget guard says of a job about to be submitted (`Ledger.admit`).

    Attributes
    ----------
    verdict : str
        ``"start"`` (spawn it now, with `timeout_s`), ``"wait"`` (its worst case
        does not fit while other calls run: ask again when one ends) or
        ``"refuse"`` (it cannot fit even alone).
    timeout_s : int or None
        The container's timeout, seconds, for ``"start"``.
    message : str
        Why it waits or is refused; for ``"start"``, a note when its timeout was cut
        to what is left of the budget ("" otherwise).
    """

    verdict: str
    timeout_s: int | None = None
    message: str = ""


@dataclass
class Ledger:
    """
    GPU-seconds and USD spent by the run, and the budget guard.

    The guard holds at every moment, not only at submission: a call is started only
    if its worst case (its GPUs' price x (its timeout + `startup_s`): Modal stops a
    container at its timeout, and the start-up before it is billed too) fits in the
    budget left once the finished calls are paid and every running call's worst
    case is put aside (`Ledger.admit`); and the executor cancels every call when
    what is spent, running calls included, reaches the budget
    (`Ledger.spent_line`). Only GPU seconds are priced
    (:data:`~snakemake_executor_plugin_modal.prices.PRICES_USD_PER_S`); a
    container's CPU and memory are not.

    Attributes
    ----------
    max_cost_usd : float or None
        Budget; None: no limit.
    startup_s : float
        Seconds of a container's start-up reserved beyond its timeout: the
        ``startup_timeout`` declared with every function (`RunApp`; default
        :data:`STARTUP_S`), the most Modal lets a container start before it fails.
    gpu_seconds : float
        GPU-seconds spent by finished calls (seconds x GPUs).
    cost_usd : float
        Their price.
    exhausted : str or None
        Once the budget was reached: the line that said so (every later job is
        refused with it).
    """

    max_cost_usd: float | None = None
    startup_s: float = float(STARTUP_S)
    gpu_seconds: float = 0.0
    cost_usd: float = 0.0
    exhausted: str | None = None
    _calls: int = 0

    def add(self, gpu: GpuRequest | None, seconds: float) -> None:
        """Record a finished call of ``seconds`` wall-clock on ``gpu``."""
        self._calls += 1
        if gpu is None:
            return
        self.gpu_seconds += gpu.count * seconds
        price = gpu.usd_per_second
        if not math.isnan(price):
            self.cost_usd += price * seconds

    def worst_case(self, gpu: GpuRequest | None, timeout_s: float) -> float:
        """
        The most USD one call can cost: price x (timeout + `startup_s`); 0 for a
        CPU container or a GPU type without a price.
        """
        if gpu is None or math.isnan(gpu.usd_per_second):
            return 0.0
        return gpu.usd_per_second * (float(timeout_s) + self.startup_s)

    def budget_of(self, budget: tuple[float, str] | None) -> tuple[float, str] | None:
        """`budget` (USD, where it comes from), else `max_cost_usd`, else None."""
        if budget is None and self.max_cost_usd is not None:
            budget = (float(self.max_cost_usd), "--modal-max-cost-usd")
        return budget

    def admit(
        self,
        gpu: GpuRequest | None,
        timeout_s: float,
        budget: tuple[float, str] | None = None,
        reserved_usd: float = 0.0,
        running: int = 0,
        may_cut: bool = False,
    ) -> Admission:
        """
        Whether a job may start now, and with which timeout.

        Parameters
        ----------
        gpu : GpuRequest or None
            Its GPUs (the most expensive type of a fallback list).
        timeout_s : float
            The timeout it asks for, seconds (its ``runtime``, else the default).
        budget : (float, str) or None
            The budget that applies (USD, and where it comes from:
            ``"--modal-max-cost-usd"`` or ``"resource modal_max_cost_usd"``); None:
            `max_cost_usd`.
        reserved_usd : float
            The running calls' worst cases (each at least what it has cost so far).
        running : int
            How many calls run.
        may_cut : bool
            The timeout is only a default (the job has no ``runtime``): when
            nothing else runs, it may be cut to what is left of the budget (no
            shorter than `MIN_TIMEOUT_S`).

        Returns
        -------
        Admission
            ``start`` if spent + reserved + the job's worst case <= the budget;
            else ``wait`` while calls run, if it would fit once they end; else
            ``start`` with a cut timeout (if `may_cut`, nothing running) or
            ``refuse``.
        """
        timeout_s = int(timeout_s)
        budget = self.budget_of(budget)
        if budget is None or gpu is None or math.isnan(gpu.usd_per_second):
            return Admission("start", timeout_s)
        limit, source = budget
        if self.exhausted is not None:
            return Admission("refuse", message=self.exhausted)
        price = gpu.usd_per_second
        left = limit - self.cost_usd - reserved_usd
        need = self.worst_case(gpu, timeout_s)
        if need <= left:
            return Admission("start", timeout_s)
        sep = " " if source.startswith("--") else "="
        worst = (
            f"its worst case, {price:.6g} USD/s x ({timeout_s} s of timeout + "
            f"{self.startup_s:g} s of start-up) = {need:.2f} USD"
        )
        alone = limit - self.cost_usd  # what is left once every running call ends
        if running and (may_cut or need <= alone):
            return Admission(
                "wait",
                message=f"{source}{sep}{limit:g}: {worst}, does not fit in the "
                f"{max(left, 0):.2f} USD left while {running} call(s) run (spent "
                f"{self.cost_usd:.2f} USD, {reserved_usd:.2f} USD held for the "
                "running calls); it starts when one ends",
            )
        cut = math.floor(left / price - self.startup_s) if left > 0 else 0
        if may_cut and cut >= MIN_TIMEOUT_S:
            return Admission(
                "start",
                cut,
                f"{source}{sep}{limit:g}: timeout cut from {timeout_s} s to {cut} s, "
                f"what is left of the budget ({left:.2f} USD at {price:.6g} USD/s)",
            )
        spent = self.cost_usd + reserved_usd
        return Admission(
            "refuse",
            message=f"{source}{sep}{limit:g}: {spent:.2f} USD spent, the next job "
            f"could bring it to {spent + need:.2f} USD ({worst}); not submitting it "
            "(raise the limit to go on; finished outputs are kept)",
        )

    def refusal(
        self,
        gpu: GpuRequest | None,
        timeout_s: float,
        reserved_usd: float = 0.0,
        budget: tuple[float, str] | None = None,
    ) -> str | None:
        """
        Why a job of this fixed timeout (its ``runtime``) could not start even with
        nothing else running, or None if it could (`admit`).
        """
        admission = self.admit(gpu, timeout_s, budget, reserved_usd, running=0)
        return admission.message if admission.verdict == "refuse" else None

    def spent_line(
        self,
        running_usd: float,
        limit: tuple[float, str] | None,
        ahead_usd: float = 0.0,
        ahead_s: float = 0.0,
    ) -> str | None:
        """
        The line that stops the run once what is spent, the running calls' cost so
        far included (`running_usd`), has reached the budget, or would reach it
        before the next budget check (`ahead_usd`, what the running calls cost in
        the `ahead_s` seconds until then); None before. Sets `exhausted`.
        """
        limit = self.budget_of(limit)
        if limit is None:
            return None
        usd, source = limit
        spent = self.cost_usd + running_usd
        if spent + ahead_usd < usd:
            return None
        sep = " " if source.startswith("--") else "="
        ahead = ""
        if spent < usd:  # reached only by the next check: said as such
            ahead = (
                f", {spent + ahead_usd:.2f} USD by the next budget check (about "
                f"{ahead_s:.0f} s away) if they ran on"
            )
        self.exhausted = (
            f"{source}{sep}{usd:g}: {spent:.2f} USD spent, running calls "
            f"included{ahead}; the budget is reached: every call is cancelled and no "
            "job is submitted (raise the limit to go on; finished outputs are kept)"
        )
        return self.exhausted

    def summary(self) -> str:
        """One line: GPU-seconds and USD spent."""
        return (
            f"Modal: {self._calls} container(s), "
            f"{self.gpu_seconds:,.0f} GPU-seconds, {self.cost_usd:.2f} USD spent"
        )
