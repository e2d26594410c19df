"""Rule check_conditioning: does the diffusion model's prediction depend on r?"""

import json

import torch

from multigeom_workflow.atomic import atomic_path
from multigeom_workflow.compute.estimate import load_models
from multigeom_workflow.inputs.demo.diagnostics import conditioning_sensitivity
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    models = load_models(
        snakemake.input.encoder,
        snakemake.input.diffusion,
        snakemake.params.diffusion,
        "cpu",
    )
    crops = torch.load(snakemake.input.crops)
    result = conditioning_sensitivity(
        models.encoder,
        models.unet,
        models.alphas_cumprod,
        crops[-snakemake.params.n_images :],
        snakemake.params.timesteps,
        float(snakemake.params.sigma),
    )
    result |= {"encoder": snakemake.wildcards.encoder, "area": snakemake.wildcards.area}
    with atomic_path(snakemake.output[0]) as tmp:
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
    print(result)
