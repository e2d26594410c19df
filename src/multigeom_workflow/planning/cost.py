"""
What is left to compute, how long it takes and what it costs: the estimate that every
`snakemake -n` prints, and the budget check of a run on Modal.

Model (that of the old notebook helper, `multigeom.pipeline.distribute.estimate_cost`):

    device-seconds = images left x seconds per image + start-ups x start-up seconds
    wall-clock     = device-seconds / workers
    cost (USD)     = device-seconds x price per GPU-second (Modal)

Seconds per image are measured where possible: the median ``elapsed_seconds`` (time
inside the estimator) of the run's existing per-image files computed by the same engine
in the same precision on the same kind of device (and GPU model), which the workflow
records in their provenance. Else the engine's defaults (`ENGINE_SECONDS_PER_IMAGE`),
which are for the paper's estimator settings and are scaled by the Monte-Carlo work
(timesteps x samples) of the configured estimator.
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..compute import gpus
from ..settings.files import timestep_grid

__all__ = [
    "DEFAULT_SECONDS_PER_IMAGE",
    "DEFAULT_STARTUP_S",
    "ENGINE_SECONDS_PER_IMAGE",
    "MODAL_PLUGIN_MISSING",
    "PAPER_MC_WORK",
    "CostEstimate",
    "budget_problem",
    "estimate_cost",
    "existing_files",
    "file_precision",
    "format_duration",
    "format_duration_short",
    "gpu_matches",
    "gpu_price",
    "measured_seconds_per_image",
    "modal_prices",
    "monte_carlo_work",
    "read_timings",
    "run_timings",
]

#: What the estimate says of Modal where the Modal executor plugin is not installed
#: (a local or SLURM-only install: `pip install -e .` alone).
MODAL_PLUGIN_MISSING = (
    "not estimated: the Modal executor plugin is not installed (pip install -e "
    "./plugins/snakemake-executor-plugin-modal)"
)


def modal_prices() -> dict[str, float] | None:
    """
    Modal GPU prices in USD per second: the Modal executor plugin's
    (``snakemake_executor_plugin_modal.prices.price_table``: its table, a third-party
    copy of Modal's price page with its date, and the prices given with
    ``--modal-gpu-prices``), so that the estimate and the plugin's cost guard price
    alike; the config key ``modal.prices_usd_per_s`` overrides or adds entries (and
    is given to the plugin for a run on Modal: ``on_modal.preflight``). None where the
    plugin is not installed: it is imported only here, when a Modal price is asked
    for.
    """
    try:
        from snakemake_executor_plugin_modal.prices import price_table
    except ModuleNotFoundError:
        return None
    return price_table()


#: Seconds per image with the paper's estimator settings: an RTX 5090-class local GPU
#: (upstream's figure), an A100 on Modal (the paper's), a 32-core CPU (upstream's).
DEFAULT_SECONDS_PER_IMAGE = {"gpu": 15.0, "modal": 30.0, "cpu": 885.0}
#: Seconds per image with the paper's settings, per engine. The fast engine has not been
#: timed on a GPU yet (benchmarks/gpu_lease.sh does it): until then its GPU figures are
#: upstream's, an upper bound. Upstream's GPU figures were taken with PyTorch's
#: defaults (precision tf32); IEEE fp32 runs the convolutions without tensor cores and
#: may take longer (docs/gpus.md). On the CPU the UNet passes (batches as upstream's)
#: dominate and the two engines cost the same.
ENGINE_SECONDS_PER_IMAGE = {
    "upstream": DEFAULT_SECONDS_PER_IMAGE,
    "fast": dict(DEFAULT_SECONDS_PER_IMAGE),
}
#: Start-up of a worker (imports, model loading), upstream's figure.
DEFAULT_STARTUP_S = 15.0
#: The paper's Monte-Carlo work per image: 24 timesteps x 200 samples.
PAPER_MC_WORK = 24 * 200


@dataclass(frozen=True)
class CostEstimate:
    """
    Estimated time and cost of the per-image computations left.

    Attributes
    ----------
    images_left : int
        Per-image computations left, all configurations together.
    workers : int
        How many run at once (GPUs, CPU cores or Modal containers).
    seconds_per_image : float
        Device-seconds of one image on one worker, and `seconds_source`, where that
        figure comes from.
    startups : int
        How many times a worker starts (imports, model loading).
    startup_s : float
        Seconds of one start-up, and `startup_source`.
    gpu : str or None
        Modal GPU type, with its `price_usd_per_s` (None if unknown or not on Modal).
    """

    images_left: int
    workers: int
    seconds_per_image: float
    seconds_source: str
    startups: int
    startup_s: float
    startup_source: str
    gpu: str | None = None
    price_usd_per_s: float | None = None

    @property
    def device_seconds(self) -> float:
        """Images left x seconds per image + start-ups x start-up seconds."""
        if self.images_left == 0:
            return 0.0
        return (
            self.images_left * self.seconds_per_image + self.startups * self.startup_s
        )

    @property
    def wall_seconds(self) -> float:
        """Device-seconds spread over the workers."""
        return self.device_seconds / max(self.workers, 1)

    @property
    def cost_usd(self) -> float | None:
        """Device-seconds x price per second; None when the price is unknown."""
        if self.price_usd_per_s is None:
            return None
        return self.device_seconds * self.price_usd_per_s


def estimate_cost(
    images_left: int,
    workers: int,
    seconds_per_image: float,
    startup_s: float = DEFAULT_STARTUP_S,
    *,
    startups: int | None = None,
    gpu: str | None = None,
    prices: dict[str, float] | None = None,
    seconds_source: str = "given",
    startup_source: str = "given",
) -> CostEstimate:
    """
    The estimate of `images_left` per-image computations on `workers` workers.

    `startups` defaults to one per worker (warm workers); `gpu` is looked up in `prices`
    (default `modal_prices`). Example (the old helper's known case): 4 x 200
    images, 10 workers, 30 s per image, 15 s start-up, A100-80GB: 24,150 GPU-seconds,
    2,415 s wall-clock, 16.76 USD.

    Raises
    ------
    ValueError
        If `workers` < 1 or a duration is negative.
    """
    if workers < 1:
        raise ValueError(f"workers = {workers}: at least 1 is needed")
    if seconds_per_image < 0 or startup_s < 0:
        raise ValueError("seconds per image and start-up seconds must be >= 0")
    table = (modal_prices() or {}) if prices is None else prices
    return CostEstimate(
        images_left=images_left,
        workers=min(workers, max(images_left, 1)),
        seconds_per_image=seconds_per_image,
        seconds_source=seconds_source,
        startups=min(workers, images_left) if startups is None else startups,
        startup_s=startup_s,
        startup_source=startup_source,
        gpu=gpu,
        price_usd_per_s=gpu_price(gpu, table) if gpu else None,
    )


def gpu_price(gpu: str, prices: dict[str, float]) -> float | None:
    """
    USD per second of one container's GPUs on Modal, as the Modal executor plugin's
    budget guard prices them (``GpuRequest.usd_per_second``): a type
    (``"A100-80GB"``), a count (``"H100:2"``: twice the price), or a fallback list
    (``"A100-80GB,H100"``: its dearest type).

    Returns
    -------
    float or None
        None if the specification is malformed or a type is not in `prices`.
    """
    try:
        from snakemake_executor_plugin_modal.prices import parse_gpu
    except ModuleNotFoundError:  # no plugin: no price (`MODAL_PLUGIN_MISSING`)
        return None
    try:
        request = parse_gpu(gpu)
    except ValueError:
        return None
    found = [prices.get(t) for t in request.types]
    return None if None in found else request.count * max(found)


def monte_carlo_work(estimator: dict) -> int:
    """Timesteps x samples of an estimator's settings (upstream's YAML layout)."""
    return len(timestep_grid(estimator)) * int(estimator["monte_carlo"]["n_samples"])


def file_precision(prov: dict) -> str:
    """
    The arithmetic a per-image file was computed in (`multigeom_workflow.settings.names.
    PRECISIONS`): its ``provenance["precision"]`` once the workflow set the switches
    (``provenance["arithmetic"]`` recorded); before, PyTorch's defaults ran, which are
    tf32 on a GPU and fp32 on the CPU, whatever the file says.
    """
    if "arithmetic" in prov:
        return str(prov.get("precision", "fp32"))
    return "tf32" if str(prov.get("device", "")).startswith("cuda") else "fp32"


def existing_files(files: list[str | Path]) -> list[Path]:
    """
    The files of `files` that exist, in order: one listing of each folder, not one
    `stat` per file (40,000 per-image files of a run not begun: a few folders, most
    of them not there yet).
    """
    names: dict[str, set[str]] = {}
    out = []
    for f in map(str, files):
        folder, name = os.path.split(f)
        if folder not in names:
            try:
                names[folder] = set(os.listdir(folder or "."))
            except OSError:  # no folder (yet): none of its files
                names[folder] = set()
        if name in names[folder] and os.path.isfile(f):  # (not a dangling link)
            out.append(Path(f))
    return out


def _mtime(path: Path) -> float:
    """A file's modification time; -inf once it is gone (set aside meanwhile)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return float("-inf")


def read_timings(
    files: list[str | Path],
    limit: int = 32,
    engine: str | None = None,
    precision: str | None = None,
) -> list[tuple[str, str, float]]:
    """
    (device, device name, ``elapsed_seconds``) of the newest `limit` existing per-image
    files that record their device (``provenance["device"]`` and
    ``provenance["device_name"]``, written by the workflow), and, when `engine` is
    given, were computed by that engine (``provenance["engine"]``; files without it
    were computed by upstream's), and when `precision` is given, in that precision
    (`file_precision`: IEEE fp32 on a GPU is slower than its TF32). torch is imported
    only when there is a file to read.
    """
    existing = existing_files(files)
    if not existing:
        return []
    import torch

    existing.sort(key=_mtime, reverse=True)
    timings = []
    for path in existing[:limit]:
        try:
            d = torch.load(path, map_location="cpu", weights_only=False)
            prov = d.get("provenance") or {}
            if engine is not None and prov.get("engine", "upstream") != engine:
                continue
            if precision is not None and file_precision(prov) != precision:
                continue
            if prov.get("device"):
                name = str(prov.get("device_name", ""))
                seconds = float(d["elapsed_seconds"])
                timings.append((str(prov["device"]), name, seconds))
        except Exception:  # a damaged file or another format: not a measurement
            continue  # (`multigeom-workflow verify` names it)
    return timings


def run_timings(scenario) -> list[tuple[str, str, float]]:
    """
    `read_timings` of a run's own per-image files (``scenario.per_image_files()``)
    in its engine and precision: what every estimate of the run's seconds per image
    reads (the dry run's, the shards' time limits on SLURM and Modal, the Modal
    budget); `multigeom_workflow.on_snakemake.run.Run.timings` reads it once per
    process.
    """
    return read_timings(
        scenario.per_image_files(), engine=scenario.engine, precision=scenario.precision
    )


def measured_seconds_per_image(
    timings: list[tuple[str, str, float]], device_kind: str, gpu_name: str | None = None
) -> tuple[float, int] | None:
    """
    The median seconds of the `timings` (from `read_timings`) computed on `device_kind`
    (``"cpu"`` or ``"cuda"``; on a GPU that `gpu_matches` `gpu_name` when it is given),
    and how many there are; None when none qualifies.
    """
    seconds = [
        s
        for device, name, s in timings
        if gpus.device_kind(device) == device_kind
        and (not gpu_name or gpu_matches(gpu_name, name))
    ]
    if not seconds:
        return None
    return statistics.median(seconds), len(seconds)


def gpu_matches(gpu_type: str, device_name: str) -> bool:
    """
    Whether a GPU reported by torch (``"NVIDIA A100-SXM4-80GB"``) is of a Modal GPU type
    (``"A100-80GB"``): every part of the type is a word of the name, so ``"L4"`` does
    not match ``"NVIDIA L40S"`` nor ``"A10"`` an A100.
    """
    parts = [p for p in re.split(r"[-\s:]+", gpu_type) if p]
    return bool(parts) and all(
        re.search(rf"(?<![A-Za-z0-9]){re.escape(p)}(?![A-Za-z0-9])", device_name, re.I)
        for p in parts
    )


def budget_problem(estimate: CostEstimate, max_cost_usd: float) -> str | None:
    """
    One line saying why a run on Modal must not start (its estimated cost is above
    `max_cost_usd`, or its GPU's price is unknown), or None when it may.
    """
    if estimate.images_left == 0:
        return None
    if estimate.cost_usd is None:
        return (
            f"budget: the price of Modal GPU {estimate.gpu!r} is unknown (known: "
            f"{', '.join(sorted(modal_prices() or {}))}); add it to the config key "
            "modal.prices_usd_per_s to estimate the cost"
        )
    if estimate.cost_usd > max_cost_usd:
        return (
            f"budget: the run is estimated at {estimate.cost_usd:.2f} USD "
            f"({estimate.device_seconds:,.0f} GPU-seconds on {estimate.gpu}), above "
            f"the limit modal.max_cost_usd = {max_cost_usd:.2f} USD"
        )
    return None


def format_duration(seconds: float) -> str:
    """``"2,415 s (40 min)"``-style text for a number of seconds."""
    if seconds < 90:
        return f"{seconds:,.0f} s"
    return f"{seconds:,.0f} s ({format_duration_short(seconds)})"


def format_duration_short(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"3.4 h"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
