"""
The run's Modal app and its lifetime: started once (the image built first, with
Modal's build output shown), one function per GPU request, each job bound to its
own resources (`RunApp`); the client's heartbeats that keep the ephemeral app alive
(`heartbeat_interval_s`), the pauses of this process that stop them (`Pauses`), and
the line that says the app has ended under the run (`ended_line`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from snakemake_interface_common.exceptions import WorkflowError

from . import limits
from .container import run_job
from .errors import start_error
from .limits import STARTUP_S
from .prices import GpuRequest

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "Pauses",
    "RunApp",
    "ended_line",
    "heartbeat_interval_s",
]


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
            volumes={limits.MOUNT: volume},
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


def ended_line(app_id: str, message: str, paused_s: float, interval_s: float) -> str:
    """
    The one line that says the run's app has ended under it: Modal ended a call
    without a cancel from this run (`calls.Outcome.ended_by_modal`), with what this
    process knows of why.

    Parameters
    ----------
    app_id : str
        The app's id (`RunApp.app_id`).
    message : str
        What the call's outcome said.
    paused_s : float
        The longest pause of this process since the call was spawned (`Pauses`),
        seconds; 0 if none: then a stop from outside or a lost connection.
    interval_s : float
        The client's heartbeat interval, seconds.

    Returns
    -------
    str
    """
    if paused_s:
        why = (
            f"this process did not run for {paused_s:.0f} s meanwhile (the machine "
            "slept, or the process was stopped), so its Modal client sent no "
            f"heartbeat for longer than its {interval_s:g} s interval, and Modal "
            "stops an ephemeral app whose client stops heartbeating"
        )
    else:
        why = (
            "the app was stopped (`modal app stop`, Modal's dashboard), or Modal "
            "stopped hearing its client's heartbeats (a lost connection)"
        )
    return (
        f"Modal: the run's app {app_id} has ended: {message}; "
        f"{why}. Every call of the run fails now (the outputs their containers "
        "committed are brought home) and no job is started: run Snakemake "
        "again to compute the rest"
    )
