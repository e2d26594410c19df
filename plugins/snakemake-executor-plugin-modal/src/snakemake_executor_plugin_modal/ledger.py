"""
The ledger of the run's GPU-, core- and GiB-seconds and USD, and the budget guard: a
job starts only if its worst case fits beside what is spent and what the running
calls may still cost (`Ledger.admit`); the run stops when the spending reaches the
budget (`Ledger.spent_line`). Pure accounting: no Modal call, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .limits import MIN_TIMEOUT_S, STARTUP_S
from .prices import ContainerRequest

__all__ = ["Admission", "Ledger"]


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
    GPU-, core- and GiB-seconds and USD spent by the run, and the budget guard.

    The guard holds at every moment, not only at submission: a call is started only
    if its worst case (its container's price per second x (its timeout +
    `startup_s`): Modal stops a container at its timeout, and the start-up before
    it is billed too) fits in the budget left once the finished calls are paid and
    every running call's worst case is put aside (`Ledger.admit`); and the executor
    cancels every call when what is spent, running calls included, reaches the
    budget (`Ledger.spent_line`). A container's price per second is that of its
    GPUs, its requested CPU cores and its requested memory
    (:class:`~snakemake_executor_plugin_modal.prices.ContainerRequest`, at Modal's
    published rates).

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
    core_seconds : float
        Their physical-core-seconds (seconds x cores requested).
    gib_seconds : float
        Their GiB-seconds of memory (seconds x GiB requested).
    gpu_usd, cpu_usd, memory_usd : float
        What their GPUs, cores and memory cost, USD.
    cost_usd : float
        Their price, USD: the sum of the three.
    exhausted : str or None
        Once the budget was reached: the line that said so (every later job is
        refused with it).
    """

    max_cost_usd: float | None = None
    startup_s: float = float(STARTUP_S)
    gpu_seconds: float = 0.0
    core_seconds: float = 0.0
    gib_seconds: float = 0.0
    gpu_usd: float = 0.0
    cpu_usd: float = 0.0
    memory_usd: float = 0.0
    exhausted: str | None = None
    _calls: int = 0

    @property
    def cost_usd(self) -> float:
        """USD spent by finished calls: GPUs + cores + memory."""
        return self.gpu_usd + self.cpu_usd + self.memory_usd

    def add(self, request: ContainerRequest, seconds: float) -> None:
        """
        Record a finished call of ``seconds`` (wall-clock, from its submission to
        its end) of a container that requested ``request``; a GPU type without a
        price adds its GPU-seconds, not their USD.
        """
        self._calls += 1
        seconds = float(seconds)
        self.gpu_seconds += request.gpus * seconds
        self.core_seconds += request.cores * seconds
        self.gib_seconds += request.memory_gib * seconds
        if not math.isnan(request.gpu_usd_per_second):
            self.gpu_usd += request.gpu_usd_per_second * seconds
        self.cpu_usd += request.cpu_usd_per_second * seconds
        self.memory_usd += request.memory_usd_per_second * seconds

    def worst_case(self, request: ContainerRequest, timeout_s: float) -> float:
        """
        The most USD one call can cost: its price per second (GPUs, cores and
        memory) x (timeout + `startup_s`); 0 for a GPU type without a price
        (refused before the run starts: `preflight`).
        """
        if math.isnan(request.usd_per_second):
            return 0.0
        return request.usd_per_second * (float(timeout_s) + self.startup_s)

    def budget_of(self, budget: tuple[float, str] | None) -> tuple[float, str] | None:
        """`budget` (USD, where it comes from), else `max_cost_usd`, else None."""
        if budget is None and self.max_cost_usd is not None:
            budget = (float(self.max_cost_usd), "--modal-max-cost-usd")
        return budget

    def admit(
        self,
        request: ContainerRequest,
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
        request : ContainerRequest
            Its container: GPUs (the most expensive type of a fallback list),
            cores and memory.
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
        if budget is None or math.isnan(request.usd_per_second):
            return Admission("start", timeout_s)
        limit, source = budget
        if self.exhausted is not None:
            return Admission("refuse", message=self.exhausted)
        price = request.usd_per_second
        left = limit - self.cost_usd - reserved_usd
        need = self.worst_case(request, timeout_s)
        if need <= left:
            return Admission("start", timeout_s)
        sep = " " if source.startswith("--") else "="
        worst = (
            f"its worst case, {price:.6g} USD/s ({_parts(request)}) x "
            f"({timeout_s} s of timeout + "
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
        request: ContainerRequest,
        timeout_s: float,
        reserved_usd: float = 0.0,
        budget: tuple[float, str] | None = None,
    ) -> str | None:
        """
        Why a job of this fixed timeout (its ``runtime``) could not start even with
        nothing else running, or None if it could (`admit`).
        """
        admission = self.admit(request, timeout_s, budget, reserved_usd, running=0)
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
        """One line: GPU-, core- and GiB-seconds, and USD spent (GPU, CPU, memory;
        to 1/100 of a cent: a short run's CPU and memory cost less than a cent)."""
        return (
            f"Modal: {self._calls} container(s), "
            f"{self.gpu_seconds:,.0f} GPU-seconds, {self.core_seconds:,.0f} "
            f"core-seconds, {self.gib_seconds:,.0f} GiB-seconds, "
            f"{self.cost_usd:.4f} USD spent (GPU {self.gpu_usd:.4f}, CPU "
            f"{self.cpu_usd:.4f}, memory {self.memory_usd:.4f})"
        )


def _parts(request: ContainerRequest) -> str:
    """What a container's price per second is made of, e.g. ``1 x T4 + 2 cores +
    4 GiB``."""
    gpu = ""
    if request.gpu is not None:
        gpu = f"{request.gpu.count} x {'/'.join(request.gpu.types)} + "
    return f"{gpu}{request.cores:g} cores + {request.memory_gib:.3g} GiB"
