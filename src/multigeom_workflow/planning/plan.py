"""
What a run has left and what it will take: progress per configuration, the number of
workers, and the estimate that `snakemake -n` prints before its job list.

References
----------
The model and the defaults are the old notebook helper's
(`multigeom.pipeline.distribute.estimate_cost`, `print_estimate`); see
`multigeom_workflow.planning.cost`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..scenario import Scenario
from ..settings.layout import Computation
from ..settings.names import CEILING_ROW
from .cost import (
    DEFAULT_STARTUP_S,
    ENGINE_SECONDS_PER_IMAGE,
    MODAL_PLUGIN_MISSING,
    PAPER_MC_WORK,
    CostEstimate,
    budget_problem,
    estimate_cost,
    format_duration,
    measured_seconds_per_image,
    modal_prices,
    monte_carlo_work,
    run_timings,
)
from .shards import make_shards

__all__ = [
    "plan_counts",
    "planned_files",
    "MODAL_STARTER_MAX_GPUS",
    "add_progress",
    "ceiling_progress",
    "estimate_lines",
    "count_startups",
    "local_workers",
    "concurrency_line",
    "modal_estimate",
    "shards_at_once",
    "pending_images",
    "progress",
    "run_estimates",
]

#: GPUs at once on Modal's Starter plan: the default number of containers.
MODAL_STARTER_MAX_GPUS = 10


def _count(scenario: Scenario, files_of) -> dict[tuple[str, str], tuple[int, int]]:
    """Per configuration: (files of `files_of(configuration)` there, their number)."""
    out = {}
    for c in scenario.configurations:
        files = files_of(c)
        out[(c.encoder, c.area)] = (sum(os.path.exists(f) for f in files), len(files))
    return out


def progress(
    scenario: Scenario, with_ceiling: bool = False
) -> dict[tuple[str, str], tuple[int, int]]:
    """
    Per configuration (encoder, area): (per-image files done, n_images); with
    `with_ceiling`, the noise ceiling's second estimates counted too (files done,
    n_images + ceiling_images): the per-image computations of the run.
    """
    done = _count(scenario, scenario.per_image_files)
    return add_progress(done, ceiling_progress(scenario)) if with_ceiling else done


def ceiling_progress(scenario: Scenario) -> dict[tuple[str, str], tuple[int, int]]:
    """Per configuration: (noise-ceiling second estimates done, ceiling_images)."""
    return _count(scenario, scenario.ceiling_files)


def add_progress(
    a: dict[tuple[str, str], tuple[int, int]], b: dict[tuple[str, str], tuple[int, int]]
) -> dict[tuple[str, str], tuple[int, int]]:
    """Two `progress`-like counts of the same configurations, added."""
    return {key: (n + b[key][0], total + b[key][1]) for key, (n, total) in a.items()}


def local_workers(
    scenario: Scenario, cores: int | None, resources: dict
) -> tuple[int, str]:
    """
    Per-image jobs that run at once locally, and why: on the CPU one per core (each
    uses one thread); on CUDA the ``--resources gpu=N`` limit, else the visible GPUs.
    """
    if scenario.uses_gpu:
        if resources.get("gpu") is not None:
            return int(resources["gpu"]), "--resources gpu"
        n = len(scenario.gpu_ids)
        return max(n, 1), f"{n} visible GPU(s)" if n else "no GPU found"
    n = cores or os.cpu_count() or 1
    return n, "--cores" if cores else "CPU cores"


def _seconds_per_image(
    scenario: Scenario, timings, kind: str, gpu: str | None = None
) -> tuple[float, str]:
    device_kind = "cpu" if kind == "cpu" else "cuda"
    measured = measured_seconds_per_image(timings, device_kind, gpu)
    if measured:
        median, n = measured
        on = f"{device_kind} ({gpu})" if gpu else device_kind
        return median, (
            f"median of {n} per-image files computed by engine {scenario.engine} "
            f"on {on}"
        )
    # each configuration's own estimator (config key configs[i].estimator), which
    # every configuration applies to as many images: their mean
    works = [monte_carlo_work(c.estimator) for c in scenario.configurations]
    scale = sum(works) / len(works) / PAPER_MC_WORK
    default = ENGINE_SECONDS_PER_IMAGE[scenario.engine][kind]
    where = {"gpu": "an RTX 5090-class GPU", "modal": "an A100", "cpu": "a 32-core CPU"}
    return default * scale, (
        f"engine {scenario.engine}'s default {default:g} s on {where[kind]} for the "
        f"paper's settings x {scale:.3g} for this estimator's Monte-Carlo work"
    )


def run_estimates(
    scenario: Scenario,
    done: dict[tuple[str, str], tuple[int, int]],
    cores: int | None,
    nodes: int | None,
    resources: dict,
    pending: list[tuple[tuple[str, str], int]] | None = None,
    timings: list | None = None,
) -> tuple[CostEstimate, CostEstimate, str]:
    """
    The estimates of the work left (`done`: per configuration, computations not left
    and in all), run locally and run on Modal (``modal.gpu`` of the config, the GPU
    that the per-image jobs ask the Modal executor for; ``--jobs`` containers or Modal
    Starter's 10), and why the local run has its number of workers. `pending`: the
    images to compute, ((encoder, area), index), as shards take them (default: those
    with a file missing, `pending_images`). `timings`: the run's measured timings
    (`run_timings`, read here when not given and work is left).

    Start-ups: with warm workers, one per (worker, configuration with work left), at
    most one per image; with cold jobs, one per per-image job.
    """
    left = sum(total - n for n, total in done.values())
    workers, why = local_workers(scenario, cores, resources)
    if not left:
        timings = []
    elif timings is None:
        timings = run_timings(scenario)
    kind = "gpu" if scenario.uses_gpu else "cpu"
    spi, source = (
        _seconds_per_image(scenario, timings, kind) if left else (0.0, "nothing left")
    )
    n_start, startup_source = count_startups(scenario, done, workers)
    local = estimate_cost(
        left,
        workers,
        spi,
        DEFAULT_STARTUP_S,
        startups=n_start,
        seconds_source=source,
        startup_source=startup_source,
    )
    modal = modal_estimate(scenario, done, timings, nodes, pending)
    return local, modal, why


def count_startups(
    scenario: Scenario, done: dict[tuple[str, str], tuple[int, int]], n_workers: int
) -> tuple[int, str]:
    """
    How many worker start-ups the work left takes, and why: with warm workers one per
    (worker, configuration with work left), at most one per image; with cold jobs one
    per per-image job.
    """
    left = sum(total - n for n, total in done.values())
    if scenario.warm_workers:
        configs_left = sum(n < total for n, total in done.values())
        count = min(left, n_workers * configs_left)
        return (
            count,
            "upstream's figure; warm workers: one per worker and configuration",
        )
    return left, "upstream's figure; cold jobs: one per per-image job"


def pending_images(scenario: Scenario) -> list[tuple[tuple[str, str], int]]:
    """
    ((encoder, area), image index) of every image with a per-image file or a noise
    ceiling's second estimate not yet there, in the order (configuration, image) that
    shards follow (`multigeom_workflow.planning.shards`): both estimates of an image go
    to its shard.
    """
    missing = {
        (c.configuration, c.index)
        for c in scenario.computations()
        if not os.path.exists(scenario.layout.file_of(c))
    }
    order = {(c.encoder, c.area): k for k, c in enumerate(scenario.configurations)}
    return sorted(missing, key=lambda image: (order[image[0]], image[1]))


def modal_estimate(
    scenario: Scenario,
    done: dict[tuple[str, str], tuple[int, int]],
    timings,
    nodes: int | None,
    pending: list[tuple[tuple[str, str], int]] | None = None,
) -> CostEstimate:
    """
    The estimate of the work left (`done` from `progress`) on Modal GPUs of the
    config's ``modal.gpu``, seconds per image measured from `timings` (`read_timings`)
    on the same GPU type when there are some; `pending` as for `run_estimates`.
    """
    modal = scenario.modal
    prices = {**(modal_prices() or {}), **modal["prices_usd_per_s"]}
    gpu = modal["gpu"]
    left = sum(total - n for n, total in done.values())
    spi, source = (
        _seconds_per_image(scenario, timings, "modal", gpu)
        if left
        else (0.0, "nothing left")
    )
    containers = nodes or MODAL_STARTER_MAX_GPUS
    if scenario.warm_workers:
        # One container per shard (profiles/modal): the models of a configuration
        # load once in each shard that holds some of its images.
        if pending is None:
            pending = pending_images(scenario)
        shards = make_shards(pending, containers)
        containers = max(len(shards), 1)  # fewer images left than containers: fewer
        n_start = sum(len({config for config, _ in shard}) for shard in shards)
        startup_source = (
            f"upstream's figure; one per shard and configuration, {len(shards)} "
            "shard(s)"
        )
    else:
        n_start, startup_source = count_startups(scenario, done, containers)
    return estimate_cost(
        left,
        containers,
        spi,
        DEFAULT_STARTUP_S,
        startups=n_start,
        gpu=gpu,
        prices=prices,
        seconds_source=source,
        startup_source=startup_source,
    )


def estimate_lines(
    scenario: Scenario,
    done: dict[tuple[str, str], tuple[int, int]],
    ceiling: dict[tuple[str, str], tuple[int, int]],
    local: CostEstimate,
    modal: CostEstimate,
    workers_why: str,
) -> list[str]:
    """
    The text `snakemake -n` prints: progress per configuration (`done`, from
    `progress`) and of the noise ceiling (`ceiling`, from `ceiling_progress`), the
    local and the Modal estimate of every per-image computation left.
    """
    lines = ["Estimate of the per-image work left (multigeom-workflow):"]
    for (enc, area), (n, total) in done.items():
        lines.append(f"  {enc + '/' + area:<24} {n:>6} / {total} images done")
    if scenario.ceiling_images:
        n, total = (sum(counts) for counts in zip(*ceiling.values(), strict=True))
        lines.append(f"  {CEILING_ROW:<24} {n:>6} / {total} second estimates done")
    lines.append(f"  per-image computations left: {local.images_left}")
    if not local.images_left:
        return lines
    device = scenario.device
    lines += [
        f"  here ({device}): {local.workers} worker(s) ({workers_why}); "
        f"{local.seconds_per_image:.3g} s per image ({local.seconds_source})",
        f"    start-up {local.startup_s:g} s x {local.startups} "
        f"({local.startup_source})",
        f"    device-seconds {local.device_seconds:,.0f}; wall-clock "
        f"{format_duration(local.wall_seconds)}",
    ]
    if modal_prices() is None:  # a local or SLURM-only install
        return [*lines, f"  on Modal: {MODAL_PLUGIN_MISSING}"]
    price = modal.price_usd_per_s
    cost = "unknown price" if modal.cost_usd is None else f"{modal.cost_usd:.2f} USD"
    lines += [
        f"  on Modal ({modal.gpu}, "
        + (f"{price} USD/s" if price is not None else "price unknown")
        + f"): {modal.workers} container(s); {modal.seconds_per_image:.3g} s per image "
        f"({modal.seconds_source})",
        f"    start-up {modal.startup_s:g} s x {modal.startups} "
        f"({modal.startup_source})",
        f"    GPU-seconds {modal.device_seconds:,.0f}; wall-clock "
        f"{format_duration(modal.wall_seconds)}; cost {cost} (limit "
        f"modal.max_cost_usd = {scenario.modal['max_cost_usd']:.2f} USD)",
    ]
    problem = budget_problem(modal, scenario.modal["max_cost_usd"])
    if problem:
        lines.append(f"warning: {problem}: a run on Modal would refuse to start")
    return lines


def shards_at_once(
    limits_min: list[int],
    usd_per_s: float | None,
    max_cost_usd: float,
    startup_s: float = 120.0,
) -> tuple[int, list[float]]:
    """
    How many shards of a run on Modal start at once under the budget: the Modal
    plugin's budget guard starts a shard only if its worst case (the GPU's price x
    (its time limit + the start-up, ``--modal-startup-seconds``)) fits beside the
    worst cases of those running (`snakemake_executor_plugin_modal.calls.Ledger`,
    ``worst_case`` and ``admit``), in the order they are submitted.

    Parameters
    ----------
    limits_min : list of int
        Per shard, its time limit in minutes (the container's timeout).
    usd_per_s : float or None
        The GPU's price, USD per second; None: unknown (every shard counted).
    max_cost_usd : float
        Config key ``modal.max_cost_usd``.
    startup_s : float
        Seconds of start-up the budget holds beyond each timeout.

    Returns
    -------
    tuple of (int, list of float)
        The shards that start at once, and each shard's worst case in USD.
    """
    if usd_per_s is None:
        return len(limits_min), [0.0] * len(limits_min)
    worst = [usd_per_s * (60.0 * m + startup_s) for m in limits_min]
    held, n = 0.0, 0
    for w in worst:
        if held + w > max_cost_usd:
            break
        held, n = held + w, n + 1
    return n, worst


def concurrency_line(
    limits_min: list[int],
    usd_per_s: float | None,
    max_cost_usd: float,
    startup_s: float = 120.0,
) -> str | None:
    """
    One warning line when the budget does not let every shard start at once
    (`shards_at_once`): how many do, each shard's worst case, the sum that would
    let all start; None when all start.
    """
    n, worst = shards_at_once(limits_min, usd_per_s, max_cost_usd, startup_s)
    if n >= len(limits_min):
        return None
    return (
        f"warning: modal.max_cost_usd = {max_cost_usd:.2f} USD holds the worst case "
        f"of {n} of the {len(limits_min)} shards at once (each shard's GPU price x "
        f"(its time limit + {startup_s:g} s start-up): up to {max(worst):.2f} USD), "
        "so the others start only as running ones end and the wall-clock above is "
        f"longer; {sum(worst):.2f} USD lets every shard start at once (what a run "
        "spends is its cost above)"
    )


def plan_counts(
    scenario: Scenario, planned: Iterable[Computation]
) -> tuple[dict, dict, list]:
    """
    The plan as the estimate reads it: per configuration (first estimates not to be
    computed, n_images) and (second estimates not to be computed, ceiling_images),
    and the images to compute, ((encoder, area), index) in shard order (both
    estimates of an image are one image for the shards).

    Parameters
    ----------
    planned : iterable of Computation
        The per-image computations of Snakemake's plan
        (`multigeom_workflow.on_snakemake.estimate.planned_per_image`).
    """
    left = {(c.encoder, c.area): [0, 0] for c in scenario.configurations}
    images = {}
    for c in planned:
        if c.configuration not in left:
            continue
        left[c.configuration][c.ceiling] += 1
        images[(c.configuration, c.index)] = None
    done = {k: (scenario.n_images - n, scenario.n_images) for k, (n, _) in left.items()}
    ceiling = {
        k: (scenario.ceiling_images - m, scenario.ceiling_images)
        for k, (_, m) in left.items()
    }
    order = {(c.encoder, c.area): i for i, c in enumerate(scenario.configurations)}
    pending = sorted(images, key=lambda ci: (order[ci[0]], ci[1]))
    return done, ceiling, pending


def planned_files(
    scenario: Scenario, planned: Iterable[Computation]
) -> dict[str, list[str]]:
    """The planned per-image files by configuration ("encoder/area"), and the noise
    ceiling's second estimates in a row of their own (`settings.names.CEILING_ROW`), as
    the dry run's estimate and ``multigeom-workflow progress`` show them.
    """
    out = {f"{c.encoder}/{c.area}": [] for c in scenario.configurations}
    if scenario.ceiling_images:
        out[CEILING_ROW] = []
    for c in planned:
        row = CEILING_ROW if c.ceiling else f"{c.encoder}/{c.area}"
        out.setdefault(row, []).append(scenario.layout.file_of(c))
    return out
