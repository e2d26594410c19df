"""Rule check_conditioning: does each diffusion model's prediction depend on r?"""

import torch

from multigeom_workflow.compute.estimate import load_models
from multigeom_workflow.inputs.demo.diagnostics import write_conditioning_reports
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    params = snakemake.params
    for result in write_conditioning_reports(
        params.configurations,
        snakemake.input.encoders,
        snakemake.input.diffusions,
        snakemake.output,
        torch.load(snakemake.input.crops)[-params.n_images :],
        params.diffusion,
        params.timesteps,
        float(params.sigma),
        load_models=load_models,
        per_configuration=getattr(params, "per_configuration", None),
    ):
        print(result)
