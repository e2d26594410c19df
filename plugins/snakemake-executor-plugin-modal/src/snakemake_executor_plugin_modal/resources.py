"""
What a job asks of its container, read from its resources (a group job's from its
jobs): the GPU request (`gpu_request`), its budget (`job_budget`), its timeout
(`runtime_seconds`), CPUs and memory, and all that the container requests, which
prices its seconds (`container_request`). See README.md, "Which setting wins".
"""

from __future__ import annotations

import math
from dataclasses import replace

from snakemake_interface_common.exceptions import WorkflowError

from .prices import ContainerRequest, GpuRequest, parse_gpu

__all__ = [
    "benchmarks",
    "container_request",
    "cpus",
    "gpu_request",
    "job_budget",
    "members",
    "memory_mb",
    "runtime_seconds",
]


def members(job) -> list:
    """The jobs of a group job, or the job itself."""
    return list(job.jobs) if job.is_group() else [job]


def runtime_seconds(job) -> float | None:
    """The job's ``runtime`` resource (minutes) in seconds, or None if unset."""
    runtime = job.resources.get("runtime")
    if runtime is None or (isinstance(runtime, float) and math.isnan(runtime)):
        return None
    return float(runtime) * 60


def cpus(job) -> float:
    """CPUs of the job's container: the largest ``threads`` of its jobs."""
    return float(max(j.threads for j in members(job)))


def memory_mb(job) -> int | None:
    """The job's ``mem_mb`` resource (a group's total), MiB; None if unset."""
    mem = job.resources.get("mem_mb")
    if mem is None or (isinstance(mem, float) and math.isnan(mem)):
        return None
    return int(mem)


def container_request(job, gpu: GpuRequest | None) -> ContainerRequest:
    """
    What the job's container requests of Modal, as the executor spawns it
    (``Function.with_options(cpu=, memory=, gpu=)``: `RunApp.bound`): `gpu`, its
    CPUs (:func:`cpus`, physical cores) and its memory (:func:`memory_mb`, MiB;
    Modal's default where unset). Its price per second prices the job in the budget.
    """
    return ContainerRequest(gpu, cpus(job), memory_mb(job))


def benchmarks(jobs) -> list[str]:
    """Benchmark files of jobs."""
    return [str(j.benchmark) for j in jobs if j.benchmark]


def gpu_request(job, default_gpu: GpuRequest | None, name: str) -> GpuRequest | None:
    """
    The container's GPUs. Type: the job's ``modal_gpu`` resource (a Modal GPU
    specification: ``"H100"``, ``"H100:2"``, a fallback list ``"A100-80GB,H100"``),
    else its ``gpu_model`` resource (the name other executors read), else
    ``--modal-gpu``. Count: the largest of the ``gpu`` resource and the
    specification's count. A job with either resource gets a GPU even without a
    ``gpu`` resource. For a group job, the largest request of its jobs (they share
    the container's GPUs).

    Parameters
    ----------
    job : snakemake job
        A job, or a group job.
    default_gpu : GpuRequest or None
        ``--modal-gpu``.
    name : str
        The job's name, for the messages.

    Returns
    -------
    GpuRequest or None
        None: a CPU container.

    Raises
    ------
    WorkflowError
        If a job requests GPUs but no type is known, a specification is malformed,
        or group members request different types.
    """
    counts, specs = [], set()
    for j in members(job):
        res = j.resources
        count = int(res.get("gpu", 0) or 0)
        spec = res.get("modal_gpu") or res.get("gpu_model")
        if count or spec:
            counts.append(max(count, 1))
            if spec:
                specs.add(str(spec))
    if not counts:
        return None
    if len(specs) > 1:
        raise WorkflowError(
            f"group job {name}: its jobs request different GPUs {sorted(specs)} "
            "('modal_gpu' or 'gpu_model' resources); one container has one type"
        )
    if specs:
        spec = specs.pop()
        try:
            base = parse_gpu(spec)
        except ValueError as e:
            raise WorkflowError(
                f"job {name}: resource 'modal_gpu' or 'gpu_model': {e}"
            ) from None
    elif default_gpu is None:
        raise WorkflowError(
            f"job {name} requests a GPU but has no 'modal_gpu' or 'gpu_model' "
            "resource and no --modal-gpu is set; set --modal-gpu (e.g. A100)"
        )
    else:
        base = default_gpu
    count = max(max(counts), base.count)
    return base if count == base.count else replace(base, count=count)


def job_budget(job, max_cost_usd: float | None, name: str) -> tuple[float, str] | None:
    """
    The budget that applies to a job: the lowest of ``--modal-max-cost-usd`` and
    its jobs' ``modal_max_cost_usd`` resources (USD; a number, or a string such as
    ``"12.5"``: Snakemake rounds a float resource to an integer), with where it
    comes from.

    Parameters
    ----------
    job : snakemake job
        A job, or a group job.
    max_cost_usd : float or None
        ``--modal-max-cost-usd``.
    name : str
        The job's name, for the message.

    Returns
    -------
    (float, str) or None
        USD and where it comes from; None if neither is set.

    Raises
    ------
    WorkflowError
        If a ``modal_max_cost_usd`` resource is not a number >= 0.
    """
    found = []
    if max_cost_usd is not None:
        found.append((float(max_cost_usd), "--modal-max-cost-usd"))
    for j in members(job):
        value = j.resources.get("modal_max_cost_usd")
        if value is None or value == "":
            continue
        try:
            usd = float(value)
        except (TypeError, ValueError):
            usd = math.nan
        if not usd >= 0:
            raise WorkflowError(
                f"job {name}: resource modal_max_cost_usd={value!r}: a budget in "
                "USD, a number >= 0 (e.g. '12.5')"
            )
        found.append((usd, "resource modal_max_cost_usd"))
    return min(found, key=lambda b: b[0]) if found else None
