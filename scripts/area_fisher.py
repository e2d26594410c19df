"""Rule area_fisher: the ground truth J_area(x) of a demo area at each test image."""

import torch

from multigeom_workflow.inputs.demo.truth import write_area_fisher
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    write_area_fisher(
        snakemake.input.area,
        snakemake.input.images,
        snakemake.output,
        snakemake.params.top_k,
    )
