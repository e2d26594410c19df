"""Rule train_demo_diffusion: upstream's train_diffusion on the crops and responses."""

import torch

from multigeom_workflow.inputs.demo.training import train_demo_diffusion
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    train_demo_diffusion(
        snakemake.params.diffusion,
        snakemake.input.encoder,
        torch.load(snakemake.input.crops),
        snakemake.output[0],
        encoder_name=snakemake.wildcards.encoder,
        area=snakemake.wildcards.area,
    )
