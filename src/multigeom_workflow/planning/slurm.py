"""
The shards of a remote run and their time limits (`ShardPlan`, `shard_plan`): on a
SLURM cluster (``profiles/slurm``: limits that fit the partition's MaxTime,
`plan_for_run`) and on Modal (`modal_plan`: each container's timeout and the budget's
worst case), planned on the submitting machine before Snakemake plans the jobs. What
a SLURM run checks and prepares beside it: `multigeom_workflow.planning.slurm_checks`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..scenario import Scenario
from ..settings.errors import ConfigError
from ..settings.names import ESTIMATE_RULE
from .cost import DEFAULT_STARTUP_S, run_timings
from .plan import _seconds_per_image, pending_images
from .shards import make_shards, num_shards, shard_name

__all__ = [
    "CAP_RESOURCE",
    "SHARD_RESOURCES",
    "DEFAULT_CAP_MIN",
    "MARGIN",
    "MODAL_CAP_MIN",
    "ShardPlan",
    "modal_plan",
    "partition_max_minutes",
    "plan_for_run",
    "plan_shards",
    "shard_minutes",
    "shard_plan",
    "slurm_time_minutes",
]

#: A shard's time limit is this many times its measured (or default) work: a node
#: loaded by other jobs, or a slower GPU of the partition, still finishes it.
MARGIN = 3.0
#: Seconds added once per allocation: Snakemake starting in the allocation, the
#: warm worker's imports, the files' latency on a shared file system.
ALLOCATION_S = 120.0
#: The most minutes one allocation asks for when neither the profile
#: (`CAP_RESOURCE`) nor the partition (its MaxTime) says: 24 h, the shortest common
#: limit of GPU partitions.
DEFAULT_CAP_MIN = 1440
#: The per-image rule's resource a profile sets the cap with (minutes).
CAP_RESOURCE = "shard_max_minutes"
#: What each per-image job of a SLURM shard asks for, declared in the per-image
#: rules (`multigeom_workflow.on_snakemake.resources.estimate_resources`): one GPU (the
#: plugin's ``--gpus=1``), the shard's host memory in MB and CPU cores (the CPU side of
#: the estimator: its models, its batch), and ``mpi=""``, which keeps the plugin from
#: starting each image in its own ``srun`` step (whose end would stop the warm
#: worker). A profile's or the command line's ``set-resources`` changes a value
#: (``estimate_image:mem_mb=32000``), never drops one.
SHARD_RESOURCES = {"gpu": 1, "mem_mb": 16000, "cpus_per_gpu": 4, "mpi": ""}


def shard_minutes(n_jobs: int, n_configs: int, seconds_per_image: float) -> int:
    """
    The time limit (minutes) of one allocation.

    Parameters
    ----------
    n_jobs : int
        Per-image computations of the shard (a noise ceiling's second estimate
        counts as one).
    n_configs : int
        Configurations of the shard (the models load once per configuration).
    seconds_per_image : float
        Measured (or default) seconds per image on the allocation's device.

    Returns
    -------
    int
        ``ceil((MARGIN x (n_jobs x seconds + n_configs x 15 s) + 120 s) / 60)``.
    """
    work = n_jobs * seconds_per_image + n_configs * DEFAULT_STARTUP_S
    return max(1, math.ceil((MARGIN * work + ALLOCATION_S) / 60))


def slurm_time_minutes(text: str) -> int | None:
    """
    A SLURM time (``sinfo -o %l``: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``) in whole minutes (seconds rounded down); None for ``infinite``,
    ``UNLIMITED`` or what is not a time.
    """
    text = text.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        return None
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        h, mi = (parts + [0, 0])[:2]
        return int(days) * 1440 + h * 60 + mi
    if len(parts) == 3:
        return parts[0] * 60 + parts[1]
    return parts[0]  # M or M:S


def partition_max_minutes(partition: str | None) -> tuple[int | None, str]:
    """
    The MaxTime of `partition` (default: the cluster's default partition) as
    ``sinfo`` reports it, in minutes, and the partition's name; None when ``sinfo``
    is not there, the partition is unknown, or it has no limit.
    """
    if shutil.which("sinfo") is None:
        return None, partition or ""
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P %l"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, partition or ""
    for line in out.stdout.splitlines():
        name, _, limit = line.partition(" ")
        default = name.endswith("*")
        if (partition and name.rstrip("*") == partition) or (not partition and default):
            return slurm_time_minutes(limit), name.rstrip("*")
    return None, partition or ""


@dataclass
class ShardPlan:
    """
    The shards of a SLURM run and what each allocation asks for.

    Attributes
    ----------
    shards : list of list
        Per shard, its ((encoder, area), image index) computations, in order.
    jobs : list of list of int
        Per shard, the per-image jobs of each of its computations (1, or 2 with the
        noise ceiling's second estimate).
    limits : list of int
        Per shard, its time limit in minutes (the sum of its jobs' `runtime`).
    seconds_per_image : float
    source : str
        Where the seconds per image come from.
    cap : int
        Most minutes per allocation; `cap_source` says whence.
    cap_source : str
    wanted : int
        Shards the run asked for (``--jobs`` or the config key ``shards``); more
        when the cap needs them.
    """

    shards: list
    jobs: list
    limits: list
    seconds_per_image: float
    source: str
    cap: int
    cap_source: str
    wanted: int

    def groups(self) -> dict:
        """Computation -> group name (``shard-00``, ...), as `shard_groups` names."""
        return {
            item: shard_name(i, len(self.shards))
            for i, shard in enumerate(self.shards)
            for item in shard
        }

    def replanned(self, planned: list) -> ShardPlan:
        """
        The shards of other computations with this plan's seconds per image, cap and
        shards wanted: the plan of Snakemake's jobs to run (the dry run's estimate),
        without reading the timings and the partition's MaxTime (``sinfo``) again. It
        equals `shard_plan` with ``planned`` where this plan had computations to shard
        (an empty plan read no MaxTime: plan that one anew).

        Parameters
        ----------
        planned : list of ((encoder, area), index, jobs)
            As for `shard_plan`.
        """
        pending = [(config, i) for config, i, _ in planned]
        jobs_of = [k for _, _, k in planned]
        shards, jobs, limits = plan_shards(
            pending, jobs_of, self.wanted, self.seconds_per_image, self.cap
        )
        return replace(self, shards=shards, jobs=jobs, limits=limits)

    def runtimes(self) -> dict:
        """
        Computation -> `runtime` (minutes) of each of its jobs: a shard's limit split
        over its jobs so that they add up to it (Snakemake sums a group's runtimes
        into the allocation's ``--time``; a job may get 0), never above it (a
        partition's MaxTime refuses a minute more): the same minutes each, one more
        for the first computations until the limit is reached (a computation with
        the noise ceiling's second estimate has two jobs of the same runtime: those
        first, the odd minute to a computation of one job; a shard of two-job
        computations alone with an odd remainder asks one minute less).
        """
        out = {}
        for shard, jobs, limit in zip(self.shards, self.jobs, self.limits, strict=True):
            base, left = divmod(limit, max(sum(jobs), 1))
            for item in shard:
                out[item] = base
            for k in (2, 1):  # pairs first, the odd minute to a single job
                for item, n in zip(shard, jobs, strict=True):
                    if n == k and left >= k:
                        out[item] += 1
                        left -= k
        return out

    def asked_minutes(self) -> list[int]:
        """Per shard, the ``--time`` its allocation asks (the sum of its jobs'
        `runtimes`: its limit, or one minute less).
        """
        runtimes = self.runtimes()
        return [
            sum(runtimes[item] * k for item, k in zip(shard, jobs, strict=True))
            for shard, jobs in zip(self.shards, self.jobs, strict=True)
        ]

    def single_minutes(self) -> int:
        """The time limit of one image alone (a job outside the planned shards)."""
        return shard_minutes(1, 1, self.seconds_per_image)

    def over_cap(self) -> list[str]:
        """One line per shard whose limit exceeds the cap (one image too long)."""
        return [
            f"{shard_name(i, len(self.shards))} asks {limit} min, above the cap of "
            f"{self.cap} min "
            f"({self.cap_source}): its images take longer than the cap allows even "
            "one at a time; raise the cap or use a partition with a longer MaxTime"
            for i, limit in enumerate(self.limits)
            if limit > self.cap
        ]

    def lines(self, asks: dict | None = None) -> list[str]:
        """
        The dry run's lines for SLURM: allocations and what each asks for (`asks`:
        the per-image rule's resources in force, name -> value), time limits,
        GPU-hours.
        """
        if not self.shards:
            return []
        asks = dict(asks or {})
        asked = self.asked_minutes()
        hours = [
            (sum(jobs) * self.seconds_per_image + DEFAULT_STARTUP_S * configs) / 3600
            for jobs, configs in zip(self.jobs, self._configs(), strict=True)
        ]
        low, high = f"{min(hours):.3g}", f"{max(hours):.3g}"
        split = (
            f"; {len(self.shards)} shards instead of {self.wanted}, so that each fits "
            "the cap"
            if len(self.shards) > self.wanted
            else ""
        )
        lines = [
            f"  on SLURM (--executor slurm): {len(self.shards)} allocation(s), one per "
            f"shard, each asking {allocation_request(asks)}; "
            f"{self.seconds_per_image:.3g} s per image ({self.source})",
            f"    time limit per shard: {min(asked)} to {max(asked)} min "
            f"({MARGIN:g} x the work + {ALLOCATION_S:g} s), cap {self.cap} min "
            f"({self.cap_source}){split}",
            f"    GPU-hours per shard: {low}"
            + (f" to {high}" if high != low else "")
            + f" ({sum(hours):.3g} in all)",
        ]
        for i, (jobs, configs, limit, h) in enumerate(
            zip(self.jobs, self._configs(), asked, hours, strict=True)
        ):
            lines.append(
                f"    {shard_name(i, len(self.shards))}: {sum(jobs)} image(s) of "
                f"{configs} "
                f"configuration(s), {h:.3g} GPU-hours, time limit {limit} min"
            )
        if len(lines) > 40:  # thousands of shards: the first and the last
            lines = [*lines[:22], "    ...", *lines[-15:]]
        return lines + [f"  warning: {line}" for line in self.over_cap()]

    def _configs(self) -> list[int]:
        return [len({config for config, _ in shard}) for shard in self.shards]


def allocation_request(asks: dict) -> str:
    """
    What one allocation asks SLURM for, in words, from the per-image rule's
    resources in force (name -> value as a string): ``"1 GPU, 4 CPU cores per GPU,
    16000 MB, partition gpu, account local"``; what is not set is the cluster's
    default ("the default partition").
    """
    gpus = str(asks.get("gpu", "0"))
    model = asks.get("gpu_model")
    parts = [
        "no GPU"
        if gpus in ("0", "", "None")
        else f"{gpus} {model + ' ' if model else ''}GPU{'s' * (gpus != '1')}"
    ]
    cores = asks.get("cpus_per_gpu") if gpus not in ("0", "", "None") else None
    if cores:
        parts.append(f"{cores} CPU core{'s' * (cores != '1')} per GPU")
    elif asks.get("cpus_per_task"):
        cores = asks["cpus_per_task"]
        parts.append(f"{cores} CPU core{'s' * (cores != '1')}")
    if asks.get("mem_mb"):
        parts.append(f"{asks['mem_mb']} MB")
    for name, what in (("slurm_partition", "partition"), ("slurm_account", "account")):
        given = asks.get(name)
        parts.append(f"{what} {given}" if given else f"the default {what}")
    for name in ("constraint", "qos", "slurm_extra"):
        if asks.get(name):
            parts.append(f"{name} {asks[name]}")
    return ", ".join(parts)


def plan_shards(
    pending: Sequence,
    jobs_of: Sequence[int],
    wanted: int,
    seconds_per_image: float,
    cap: int,
) -> tuple[list, list, list]:
    """
    Split the computations left into at least `wanted` balanced shards
    (`make_shards`), more where a shard's time limit (`shard_minutes`) would exceed
    `cap` minutes.

    Parameters
    ----------
    pending : sequence
        The computations left, in order.
    jobs_of : sequence of int
        Per computation, its per-image jobs (1 or 2).
    wanted : int
        Shards asked for (at least 1).
    seconds_per_image : float
    cap : int
        Most minutes per allocation.

    Returns
    -------
    shards, jobs, limits : lists
        As `ShardPlan`'s attributes.
    """
    jobs_by = dict(zip(pending, jobs_of, strict=True))
    n = max(1, wanted)
    while True:
        shards = make_shards(pending, n)
        jobs = [[jobs_by[item] for item in shard] for shard in shards]
        limits = [
            shard_minutes(sum(j), len({c for c, _ in shard}), seconds_per_image)
            for shard, j in zip(shards, jobs, strict=True)
        ]
        if not limits or max(limits) <= cap or n >= len(pending):
            return shards, jobs, limits
        n = min(len(pending), max(n + 1, math.ceil(n * max(limits) / cap)))


def shard_plan(
    scenario: Scenario,
    timings,
    wanted: int,
    partition: str | None = None,
    profile_cap: int | None = None,
    planned: list | None = None,
    cluster: bool = True,
    modal_gpu: str | None = None,
) -> ShardPlan:
    """
    The shards of a SLURM run of `scenario` and their time limits.

    Parameters
    ----------
    scenario : Scenario
    timings
        Earlier per-image files' timings (`read_timings`), for the seconds per image
        measured on the allocations' kind of device.
    wanted : int
        Shards asked for (``--jobs``, or the config key ``shards``).
    partition : str, optional
        The partition the per-image jobs ask for (``slurm_partition``); its MaxTime
        (``sinfo``) caps an allocation when it is readable.
    profile_cap : int, optional
        The profile's cap in minutes (`CAP_RESOURCE`), else `DEFAULT_CAP_MIN`.
    planned : list of ((encoder, area), index, jobs), optional
        The computations of Snakemake's plan and the per-image jobs of each (1, or 2
        with the noise ceiling's second estimate); default: the files missing now.
    cluster : bool
        Read the partition's MaxTime (``sinfo``); False for a run elsewhere
        (`modal_plan`).
    modal_gpu : str, optional
        For a run on Modal: its GPU type (``modal.gpu``), whose seconds per image
        are those the dry run's Modal estimate uses (measured on that type, else the
        default on an A100).

    Returns
    -------
    ShardPlan
    """
    # the allocations' device, not this machine's: a login node without a GPU falls
    # back to the CPU here, while the shards compute on their GPUs
    kind = "cpu" if scenario.device_asked == "cpu" else "gpu"
    if modal_gpu is not None:
        spi, source = _seconds_per_image(scenario, timings, "modal", modal_gpu)
    else:
        spi, source = _seconds_per_image(scenario, timings, kind)
    if planned is not None:
        pending = [(config, i) for config, i, _ in planned]
        jobs_of = [k for _, _, k in planned]
    else:
        pending = pending_images(scenario)
        jobs_of = [
            int(not os.path.exists(scenario.per_image_file(*config, i)))
            + int(
                i < scenario.ceiling_images
                and not os.path.exists(scenario.ceiling_file(*config, i))
            )
            for config, i in pending
        ]
    cap, cap_source = (
        (int(profile_cap), f"set-resources {CAP_RESOURCE}")
        if profile_cap
        else (DEFAULT_CAP_MIN, "the default: 24 h")
    )
    maxtime, name = (
        partition_max_minutes(partition) if pending and cluster else (None, "")
    )
    if maxtime is not None and maxtime < cap:
        cap, cap_source = maxtime, f"MaxTime of partition {name}"
    shards, jobs, limits = plan_shards(pending, jobs_of, wanted, spi, cap)
    return ShardPlan(shards, jobs, limits, spi, source, cap, cap_source, wanted)


#: Modal's longest function timeout, minutes (24 h: ``timeout`` of ``App.function``).
MODAL_CAP_MIN = 1440


def modal_plan(
    scenario: Scenario, wanted: int, timings: list | None = None
) -> ShardPlan:
    """
    The shards of a run on Modal and their time limits, as for SLURM (`shard_plan`:
    `MARGIN` x the work + `ALLOCATION_S`, the seconds per image those of the dry
    run's Modal estimate on ``modal.gpu``), capped at Modal's 24 h: each per-image
    job's share of its shard's limit is its ``runtime``, which Snakemake sums into
    the shard's (the profile's ``gpu=1`` of local scope puts one job in each of the
    group's layers), and the Modal plugin makes that sum the container's timeout and
    the worst case its budget guard holds aside (instead of the profile's
    ``modal-timeout`` of 6 h for every shard).

    Parameters
    ----------
    scenario : Scenario
    wanted : int
        Shards asked for (``--jobs``, or the config key ``shards``).
    timings : list, optional
        The run's measured timings (`run_timings`, read here when not given).
    """
    return shard_plan(
        scenario,
        run_timings(scenario) if timings is None else timings,
        wanted,
        profile_cap=MODAL_CAP_MIN,
        cluster=False,
        modal_gpu=scenario.modal["gpu"],
    )


def plan_for_run(
    scenario: Scenario,
    given,
    nodes: int | None,
    shards_setting,
    remote_exec: bool,
    planned: list | None = None,
    executor: str = "slurm",
    timings: list | None = None,
) -> ShardPlan | None:
    """
    The `ShardPlan` of a run for SLURM, or None for any other run: one whose executor
    is ``slurm`` (`multigeom_workflow.on_snakemake.run.executor_in_use`, the one
    answer), planned on the login node (inside an allocation, nothing is planned).

    Parameters
    ----------
    scenario : Scenario
    given : multigeom_workflow.snakemake_adapter.GivenResources
        The resources a profile or the command line gave, as written.
    nodes : int or None
        ``--jobs`` of a remote executor.
    shards_setting : int or str
        The config key ``shards``.
    remote_exec : bool
        Snakemake's ``workflow.remote_exec`` (True inside an allocation).
    planned : list, optional
        As for `shard_plan`: Snakemake's plan (the dry run's estimate).
    executor : str
        The executor in use (`multigeom_workflow.on_snakemake.run.executor_in_use`).
    timings : list, optional
        The run's measured timings (`run_timings`, read here when not given).
    """
    if remote_exec or executor != "slurm":
        return None
    cap = given.of_rule(ESTIMATE_RULE, CAP_RESOURCE)
    try:
        cap_min = int(float(cap)) if cap else None
    except ValueError:
        cap_min = None
    if cap is not None and (cap_min is None or cap_min < 1):
        raise ConfigError(
            f"profile entry set-resources estimate_image:{CAP_RESOURCE}={cap}: "
            "allowed: a whole number of minutes, at least 1 (the most one allocation "
            "asks for)"
        )
    return shard_plan(
        scenario,
        run_timings(scenario) if timings is None else timings,
        num_shards(shards_setting, nodes),
        partition=given.of_rule(ESTIMATE_RULE, "slurm_partition"),
        profile_cap=cap_min,
        planned=planned,
    )
