"""
Rule estimate_image: G(x) and J(x) of one test image, by upstream's estimator, on the
slot (GPU or CPU share) the job holds: through a warm worker (`workers: warm`) or in
this process (`workers: cold`).
"""

import os
from pathlib import Path

from multigeom_workflow.gpus import hold_cpu, hold_gpu, resolve_device
from multigeom_workflow.jobs import job_log
from multigeom_workflow.scenario import resolve_settings_file

with job_log(snakemake.log[0]):
    config, wildcards = snakemake.config, snakemake.wildcards
    workflow_dir = Path(snakemake.scriptdir).parent
    files = {
        key: str(resolve_settings_file(config[key], key, workflow_dir))
        for key in ("estimator", "diffusion")
    }
    device = resolve_device(config["device"])
    if device.startswith("cuda"):  # one GPU per job, held until the job ends
        want = int(device.split(":")[1]) if ":" in device else None
        slot_held = hold_gpu(want=want)
    else:  # one share of the CPU per job running at once
        slot_held = hold_cpu(int(os.environ.get("MULTIGEOM_CPU_SLOTS", "1")))
    request = {
        "image": str(Path(snakemake.input.image).resolve()),
        "index": int(wildcards.index),
        "out": str(Path(snakemake.output[0]).resolve()),
        "estimator": snakemake.params.estimator,
        "encoder_name": wildcards.encoder,
        "area": wildcards.area,
        "settings_files": files,
        "seed": int(config["seed"]),
        "engine": config.get("engine", "fast"),
        "precision": config.get("precision", "fp32"),
    }
    with slot_held as slot:
        print(f"holding {slot.kind} {slot.slot_id} ({slot.device})", flush=True)
        if config["workers"] == "warm":
            from multigeom_workflow.workers import (
                model_spec,
                request_estimate,
                slot_spec,
            )

            name = f"{slot.kind}{slot.slot_id}"
            reply = request_estimate(
                slot_spec(name, slot.device, snakemake.threads),
                model_spec(
                    snakemake.input.encoder,
                    snakemake.input.diffusion,
                    snakemake.params.diffusion,
                ),
                request,
                log=Path("logs/workers", f"{name}.log").resolve(),
                watch_pid=int(os.environ.get("MULTIGEOM_SNAKEMAKE_PID", os.getppid())),
            )
            print(f"done by the warm worker in {reply['seconds']:.2f} s")
        else:
            import torch

            from multigeom_workflow.estimate import estimate_request, load_models

            torch.set_num_threads(snakemake.threads)
            models = load_models(
                snakemake.input.encoder,
                snakemake.input.diffusion,
                snakemake.params.diffusion,
                slot.device,
            )
            estimate_request(models, request)
