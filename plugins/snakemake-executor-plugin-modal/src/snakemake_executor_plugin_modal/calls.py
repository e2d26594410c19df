"""
One Modal function call per Snakemake job: start it in its own ephemeral app, poll it
without blocking, cancel it; and the ledger of GPU-seconds spent against a budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .container import run_job
from .prices import GpuRequest

__all__ = ["MOUNT", "ContainerCall", "Ledger", "Outcome"]

#: Where containers mount the volume.
MOUNT = "/snakemake-volume"


@dataclass
class Outcome:
    """
    How a finished call ended.

    Attributes
    ----------
    ok : bool
        The job's command exited with status 0.
    message : str
        For a failure: what happened and the tail of the job's log.
    result : dict or None
        What :func:`~snakemake_executor_plugin_modal.container.run_job` returned, if it
        returned.
    """

    ok: bool
    message: str = ""
    result: dict | None = None


class ContainerCall:
    """
    A job running in a Modal container.

    Each call has its own ephemeral app (``modal.App.run``), so that every job can
    have its own GPU type and timeout; Modal caches the image build across them.

    Parameters
    ----------
    name : str
        App name, shown in Modal's dashboard.
    image : modal.Image
    gpu : GpuRequest or None
        None: a CPU-only container.
    cpu : float
        CPU cores reserved for the container (the job's threads).
    timeout_s : int
        Seconds after which Modal stops the container.
    volume : modal.Volume
    spec : dict
        Argument of :func:`~snakemake_executor_plugin_modal.container.run_job`.
    """

    def __init__(
        self, name, image, gpu: GpuRequest | None, cpu: float, timeout_s, volume, spec
    ):
        import modal

        self.gpu = gpu
        self.timeout_s = timeout_s
        app = modal.App(name)
        function = app.function(
            image=image,
            gpu=gpu.modal_spec if gpu else None,
            cpu=cpu,
            timeout=int(timeout_s),
            volumes={MOUNT: volume},
            serialized=True,
        )(run_job)
        self._run = app.run()
        self._run.__enter__()
        try:
            self.started = time.monotonic()
            self.call = function.spawn(spec)
        except BaseException:
            self.stop()
            raise
        self.ended: float | None = None

    @property
    def call_id(self) -> str:
        """Modal's id of the function call (``fc-...``)."""
        return self.call.object_id

    def poll(self) -> Outcome | None:
        """
        The outcome if the call has ended, else None; never blocks.

        Uses ``FunctionCall.get(timeout=0)``, which raises Python's ``TimeoutError``
        while the call runs (``modal._functions``, Modal 1.x); Modal's own
        ``modal.exception.TimeoutError`` is taken the same way.
        """
        import modal.exception

        try:
            result = self.call.get(timeout=0)
        except modal.exception.FunctionTimeoutError:
            outcome = Outcome(
                False, f"the container ran past its timeout of {self.timeout_s} s"
            )
        except (TimeoutError, modal.exception.TimeoutError):
            return None
        except Exception as e:  # a remote exception, a preempted or lost container
            outcome = Outcome(False, f"the Modal call failed: {type(e).__name__}: {e}")
        else:
            ok = result["returncode"] == 0
            message = (
                ""
                if ok
                else f"the job's command exited with status {result['returncode']}; "
                f"last lines of its log:\n{result['log_tail']}"
            )
            outcome = Outcome(ok, message, result)
        self.ended = time.monotonic()
        self.stop()
        return outcome

    def cancel(self) -> None:
        """Stop the container and the app."""
        try:
            self.call.cancel(terminate_containers=True)
        finally:
            self.ended = self.ended or time.monotonic()
            self.stop()

    def stop(self) -> None:
        """Stop the ephemeral app (idempotent)."""
        run, self._run = getattr(self, "_run", None), None
        if run is not None:
            run.__exit__(None, None, None)

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
    ) -> str | None:
        """
        Why the next job must not be submitted, or None if it may.

        The rule: spent by finished calls + spent so far by running calls
        (`running_usd`) + expected cost of the next job > ``max_cost_usd``.
        """
        if self.max_cost_usd is None:
            return None
        spent = self.cost_usd + running_usd
        expected = self.expected_cost(gpu, runtime_s)
        if spent + expected > self.max_cost_usd:
            return (
                f"--modal-max-cost-usd {self.max_cost_usd:g}: {spent:.2f} USD "
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
