"""
The per-image job of rule estimate_image, run from its ``shell:`` command: build the
`EstimateRequest` from what the rule knows (inputs, output) and the
run's settings (its rule's estimator and diffusion settings among them), hold a
slot (a GPU, or one of the run's CPU shares), and hand the request to the slot's warm
worker (``workers: warm``), or compute it here (``workers: cold``).

What every job of the run shares (device, GPU ids, CPU shares, seed, engine,
precision, provenance files) comes resolved from the Snakemake process in
``MULTIGEOM_RUN`` (`RunSettings`); the warm path imports only the standard library, so
the job itself costs milliseconds. Output goes to the job's log (the rule redirects
it).

Usage (as the rule writes it: its input image, encoder and diffusion checkpoints, in
that order, and its output, whose path names the rule, the configuration and the
image: `multigeom_workflow.settings.layout`)::

    python -m multigeom_workflow.compute.client \
        --input IMG ENCODER_CKPT DIFFUSION_CKPT \
        --output runs/per_image/onoff/V1/img0005.pt --threads 1

A short command with few, short fields: Snakemake formats it several times per job,
also in a dry run. The estimator and diffusion settings (the rule's params) come in
``MULTIGEOM_RUN`` (`RunSettings.estimator_of`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..settings.layout import is_ceiling_file, parse_image_file
from ..settings.names import CEILING_RULE, ESTIMATE_RULE
from .gpus import (
    allocation_cpus,
    compute_lock,
    gpu_index,
    hold_cpu,
    hold_gpu,
    slot_file_name,
    stop_gpu,
)
from .hook import estimator_hook, record
from .kept import keep_finished, take_kept
from .request import EstimateRequest, RunSettings

__all__ = ["main", "parse_args"]


def parse_args(argv=None) -> tuple[EstimateRequest, int]:
    """
    The request and the thread count of a per-image job, from its command line and the
    run's settings (``MULTIGEOM_RUN``: its rule's estimator settings for the
    configuration, `RunSettings.estimator_of`, and the diffusion settings).

    Raises
    ------
    SystemExit
        If an argument is missing or malformed (argparse's message).
    """
    p = argparse.ArgumentParser(prog="python -m multigeom_workflow.compute.client")
    p.add_argument("--input", nargs=3, required=True, metavar=("IMAGE", "ENC", "DIFF"))
    p.add_argument("--output", required=True, help="the per-image file")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    # the output names the job: its rule by its folder, its wildcards by the layout
    try:
        key = parse_image_file(args.output)
    except ValueError as err:
        p.error(str(err))
    rule = CEILING_RULE if is_ceiling_file(args.output) else ESTIMATE_RULE
    image, encoder_ckpt, diffusion_ckpt = args.input
    run = RunSettings.from_env()
    estimator = run.estimator_of(rule, key.encoder, key.area)
    request = EstimateRequest(
        image=os.path.abspath(image),
        index=key.index,
        out=os.path.abspath(args.output),
        estimator=estimator,
        encoder_name=key.encoder,
        area=key.area,
        encoder_ckpt=os.path.abspath(encoder_ckpt),
        diffusion_ckpt=os.path.abspath(diffusion_ckpt),
        diffusion=run.diffusion_of(key.encoder, key.area),
        settings_files=run.settings_files_of(key.encoder, key.area),
        # the seed the draws are made from (a noise-ceiling estimate has its own)
        seed=int(estimator["seed"]),  # the run's, or its configuration's
        engine=run.engine,
        precision=run.precision,
        architecture=run.architecture_of(key.encoder, key.area),
    )
    return request, args.threads


def _hold(run: RunSettings):
    """Hold the job's slot: a GPU of the run (``cuda:N``: that one) or a CPU share."""
    if run.device.startswith("cuda"):
        want = gpu_index(run.device)
        return hold_gpu(run.gpu_ids, want=want, run_id=run.run_id)
    return hold_cpu(run.cpu_slots, run_id=run.run_id)


def ask_warm_worker(run: RunSettings, slot, request: EstimateRequest, threads: int):
    """
    Hand `request` to the warm worker of `slot`; if the worker's CUDA context failed
    (`multigeom_workflow.compute.workers.ContextLost`: it has ended), once more to a
    fresh worker (a new process, a new context). A second failure on the GPU stops
    that GPU for the run (`multigeom_workflow.compute.gpus.stop_gpu`: no later job
    holds it; the other GPUs go on) and fails this job with one line naming the GPU
    and the error.

    Returns
    -------
    dict
        The worker's answer (``{"ok": True, "seconds": ...}``).

    Raises
    ------
    SystemExit
        With the line, when the GPU is stopped.
    RuntimeError
        When the estimate failed otherwise (`request_estimate`).
    """
    from .workers import ContextLost, request_estimate, slot_spec

    spec = slot_spec(
        slot.kind, slot.slot_id, slot.device, threads, run.run_id, slot.environment()
    )
    name = slot_file_name(slot.kind, slot.slot_id)
    log = Path("logs", "workers", f"{name}.log").resolve()
    try:
        return request_estimate(spec, request, log=log)
    except ContextLost as err:
        first = str(err).splitlines()[0]
        print(
            f"{first}; {Path(request.out).name} again in a fresh worker on "
            f"{slot.kind} {slot.slot_id} (a new process, a new CUDA context)",
            flush=True,
        )
    try:
        return request_estimate(spec, request, log=log)
    except ContextLost as err:
        second = str(err).splitlines()[0].split(": ", 1)[-1]
        if slot.kind != "gpu":
            raise
    line = (
        f"GPU {slot.slot_id} ({slot.device}) stopped for this run: its CUDA context "
        f"failed in two workers in a row ({second}); the run's other GPUs go on, and "
        f"this job fails ({Path(request.out).name}: a retry runs it on another GPU)"
    )
    stop_gpu(run.run_id, slot.slot_id, line)  # said again when the run ends
    with open(log, "a") as out:
        print(line, file=out, flush=True)
    print(line, flush=True)
    raise SystemExit(line)


def compute_cold(
    request: EstimateRequest,
    kind: str,
    slot_id: str,
    device: str,
    threads: int,
    run_id: str,
    env: dict | None = None,
) -> None:
    """
    Compute `request` in this process, holding the slot's compute lock; `env` (a
    GPU slice's `multigeom_workflow.compute.gpus.Slot.environment`) is set before
    CUDA starts, so that `device` (``cuda:0``) is the slice.
    """
    os.environ.update(env or {})  # CUDA reads CUDA_VISIBLE_DEVICES when it starts
    hook = estimator_hook()  # a test's or benchmark's stand-in, else None
    with compute_lock(kind, slot_id, run_id):
        if hook is not None:
            hook.estimate(request, f"{kind}{slot_id}")
            return
        import torch

        from .estimate import estimate_request, load_models

        torch.set_num_threads(threads)
        models = load_models(
            request.encoder_ckpt, request.diffusion_ckpt, request.diffusion, device
        )
        estimate_request(models, request)


def main(argv=None) -> None:
    """Run one per-image job (see the module's docstring)."""
    start = time.time()
    request, threads = parse_args(argv)
    run = RunSettings.from_env()
    # in a SLURM allocation, one job at a time computes with all the CPUs it was given
    threads = allocation_cpus() or threads
    # in a SLURM allocation: an image another allocation of the run finished before
    # it ended early comes back (`multigeom_workflow.compute.kept`)
    kept = take_kept(request.out)
    if kept is not None:
        print(f"{request.out}: taken back from {kept} (finished there)", flush=True)
        record(what="job", out=request.out, start=start, end=time.time())
        return
    with _hold(run) as slot:
        print(f"holding {slot.kind} {slot.slot_id} ({slot.device})", flush=True)
        if run.warm:
            reply = ask_warm_worker(run, slot, request, threads)
            print(f"done by the warm worker in {reply['seconds']:.2f} s", flush=True)
        else:
            compute_cold(
                request, slot.kind, slot.slot_id, slot.device, threads, run.run_id,
                slot.environment(),
            )  # fmt: skip
    keep_finished(request.out)  # in a SLURM allocation: kept if it ends early
    record(what="job", out=request.out, start=start, end=time.time())


if __name__ == "__main__":
    main()
