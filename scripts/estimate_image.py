"""Rule estimate_image: G(x) and J(x) of one test image, by upstream's estimator."""

import contextlib
from pathlib import Path

import torch
from multigeom.utils import provenance

from multigeom_workflow.estimate import (
    device_provenance,
    estimate_to_file,
    load_models,
)
from multigeom_workflow.gpus import hold_gpu, resolve_device
from multigeom_workflow.jobs import job_log
from multigeom_workflow.scenario import resolve_settings_file

with job_log(snakemake.log[0]):
    config, wildcards = snakemake.config, snakemake.wildcards
    torch.set_num_threads(snakemake.threads)
    workflow_dir = Path(snakemake.scriptdir).parent
    files = {
        key: resolve_settings_file(config[key], key, workflow_dir)
        for key in ("estimator", "diffusion")
    }
    device = resolve_device(config["device"])
    with contextlib.ExitStack() as stack:
        if device.startswith("cuda"):  # one GPU per job, held until the job ends
            want = int(device.split(":")[1]) if ":" in device else None
            slot = stack.enter_context(hold_gpu(want=want))
            device = slot.device
            print(f"holding GPU {slot.gpu_id} as {device}")
        models = load_models(
            snakemake.input.encoder,
            snakemake.input.diffusion,
            snakemake.params.diffusion,
            device,
        )
        estimate_to_file(
            models,
            snakemake.input.image,
            int(wildcards.index),
            snakemake.output[0],
            snakemake.params.estimator,
            encoder_name=wildcards.encoder,
            area=wildcards.area,
            provenance_record=provenance(files, seed=int(config["seed"]))
            | device_provenance(models.device),
        )
