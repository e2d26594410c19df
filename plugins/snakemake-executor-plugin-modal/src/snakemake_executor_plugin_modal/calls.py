"""
The run's Modal app and one function call per Snakemake job: start the app once
(building the image, with Modal's build output shown), spawn each job with its own
resources, poll it without blocking, cancel it; and the ledger of GPU-seconds spent
against a budget.
"""

from __future__ import annotations

import math
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from snakemake_interface_common.exceptions import WorkflowError

from .container import run_job
from .prices import GpuRequest

__all__ = [
    "MOUNT",
    "TRANSPORT_GRACE_S",
    "ContainerCall",
    "Ledger",
    "Outcome",
    "RunApp",
    "raised_in_container",
    "start_error",
    "transport_errors",
]

#: Where containers mount the volume.
MOUNT = "/snakemake-volume"
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
    try:
        from grpclib.exceptions import StreamTerminatedError

        errors.append(StreamTerminatedError)
    except ImportError:  # the fake backend has no grpclib
        pass
    return tuple(errors)


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
    """

    ok: bool
    message: str = ""
    result: dict | None = None
    remote: bool = False
    given_up: bool = False


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
        return function.with_options(**options).spawn(spec)

    def stop(self, warn: Callable[[str], None] = print) -> None:
        """Stop the app (idempotent); an error doing so is reported, not raised."""
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.__exit__(None, None, None)
        except Exception as e:  # the run's results are home; only the app is left
            warn(f"Modal: could not stop the app cleanly ({type(e).__name__}: {e})")


def start_error(exc: BaseException, gpus: list | None = None) -> WorkflowError:
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
        return WorkflowError(
            f"Modal refused the credentials ({what}): the token is wrong, revoked or "
            "expired; run `modal token new` (or set MODAL_TOKEN_ID and "
            f"MODAL_TOKEN_SECRET){tail}"
        )
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
            f"Modal could not be reached to start the run's app ({what}); check the "
            f"network and start the run again{tail}"
        )
    return WorkflowError(f"Modal: the run's app could not start ({what}){tail}")


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
        self.ended: float | None = None
        #: Whether ``cancel`` reached Modal.
        self.cancelled = False
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
        - ``FunctionTimeoutError`` (the container ran past its timeout),
          ``OutputExpiredError`` (the result is gone), ``InternalFailure``,
          ``RemoteError``, ``ExecutionError``: failures;
        - the bare builtin ``TimeoutError()`` that ``_FunctionCall.poll_function``
          raises when no output is there yet (``modal/_functions.py``): running;
        - a client-side transport error (:func:`transport_errors`): running, reported,
          for at most ``grace_s`` seconds in a row, then a failure, and the call is
          cancelled (``FunctionCall.cancel``: a container that still runs would bill
          and commit beside the retry's); its seconds up to then are what
          :attr:`seconds` counts;
        - anything else: a failure.
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

        if raised_in_container(e):
            outcome = Outcome(
                False,
                f"the container raised {type(e).__name__}: {_first_line(e)}",
                remote=True,
            )
        elif isinstance(e, modal.exception.FunctionTimeoutError):
            outcome = Outcome(
                False, f"the container ran past its timeout of {self.timeout_s} s"
            )
        elif isinstance(e, modal.exception.OutputExpiredError):
            outcome = Outcome(
                False,
                "Modal no longer holds the call's result (OutputExpiredError); its "
                "committed files are on the volume and are reused by a retry",
            )
        elif type(e) is TimeoutError and not e.args:  # poll_function: no output yet
            self._unreachable_since = None
            return None
        elif isinstance(e, transport_errors()):
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
            self.cancel()
            outcome = Outcome(
                False,
                f"Modal could not be reached for {self.grace_s:.0f} s "
                f"({type(e).__name__}: {e}); the call is given up and cancelled",
                given_up=True,
            )
        else:  # Modal's own verdict: a lost container, an internal failure
            outcome = Outcome(
                False, f"the Modal call failed: {type(e).__name__}: {_first_line(e)}"
            )
        self.ended = self.ended or time.monotonic()
        return outcome

    def cancel(self) -> None:
        """
        Stop the container (``FunctionCall.cancel(terminate_containers=True)``); an
        error doing so is reported, not raised (the app's stop at the run's end stops
        its containers in any case).
        """
        try:
            self.call.cancel(terminate_containers=True)
            self.cancelled = True
        except Exception as e:
            self.warn(
                f"Modal call {self.call_id}: cancel failed ({type(e).__name__}: {e}); "
                "its container may run until the app stops at the end of the run, "
                "and that time is not counted in the cost"
            )
        finally:
            self.ended = self.ended or time.monotonic()

    @property
    def seconds(self) -> float:
        """Wall-clock seconds from submission to the end (or now), what Modal bills."""
        return (self.ended or time.monotonic()) - self.started

    @property
    def cost_usd(self) -> float:
        """USD of the GPUs so far (0 for a CPU-only container or an unknown type)."""
        if self.gpu is None or math.isnan(self.gpu.usd_per_second):
            return 0.0
        return self.gpu.usd_per_second * self.seconds


@dataclass
class Ledger:
    """
    GPU-seconds and USD spent by the run, and the budget guard.

    Attributes
    ----------
    max_cost_usd : float or None
        Budget; None: no limit.
    gpu_seconds : float
        GPU-seconds spent by finished calls (seconds x GPUs).
    cost_usd : float
        Their price (:data:`~snakemake_executor_plugin_modal.prices.PRICES_USD_PER_S`).
    """

    max_cost_usd: float | None = None
    gpu_seconds: float = 0.0
    cost_usd: float = 0.0
    _call_seconds: list = field(default_factory=list)

    def add(self, gpu: GpuRequest | None, seconds: float) -> None:
        """Record a finished call of ``seconds`` wall-clock on ``gpu``."""
        self._call_seconds.append(seconds)
        if gpu is None:
            return
        self.gpu_seconds += gpu.count * seconds
        price = gpu.usd_per_second
        if not math.isnan(price):
            self.cost_usd += price * seconds

    def expected_cost(self, gpu: GpuRequest | None, runtime_s: float | None) -> float:
        """
        Expected USD of the next call: its ``runtime`` resource if set, else the mean
        wall-clock of the finished calls (0 before any has finished).
        """
        if gpu is None or math.isnan(gpu.usd_per_second):
            return 0.0
        if runtime_s is None:
            calls = self._call_seconds
            runtime_s = sum(calls) / len(calls) if calls else 0.0
        return gpu.usd_per_second * runtime_s

    def refusal(
        self,
        gpu: GpuRequest | None,
        runtime_s: float | None,
        running_usd: float = 0.0,
        budget: tuple[float, str] | None = None,
    ) -> str | None:
        """
        Why the next job must not be submitted, or None if it may.

        The rule: spent by finished calls + spent so far by running calls
        (`running_usd`) + expected cost of the next job > the budget: `budget`
        (USD, and where it comes from: ``"--modal-max-cost-usd"`` or ``"resource
        modal_max_cost_usd"``) if given, else ``max_cost_usd``.
        """
        if budget is None and self.max_cost_usd is not None:
            budget = (self.max_cost_usd, "--modal-max-cost-usd")
        if budget is None:
            return None
        limit, source = budget
        spent = self.cost_usd + running_usd
        expected = self.expected_cost(gpu, runtime_s)
        if spent + expected > limit:
            sep = " " if source.startswith("--") else "="
            return (
                f"{source}{sep}{limit:g}: {spent:.2f} USD "
                f"spent, the next job would bring it to about "
                f"{spent + expected:.2f} USD; not submitting it (raise the "
                "limit to go on; finished outputs are kept)"
            )
        return None

    def summary(self) -> str:
        """One line: GPU-seconds and USD spent."""
        return (
            f"Modal: {len(self._call_seconds)} container(s), "
            f"{self.gpu_seconds:,.0f} GPU-seconds, {self.cost_usd:.2f} USD spent"
        )
