"""Rule simulate_area: a synthetic area (GaborTeacher), its responses to the crops."""

import torch

from multigeom_workflow.atomic import atomic_path
from multigeom_workflow.inputs.demo.data import simulate_area
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    crops = torch.load(snakemake.input.crops)
    params = snakemake.params
    area = simulate_area(
        snakemake.wildcards.area, crops, params.seed, params.noise_sigma
    )
    with atomic_path(snakemake.output[0]) as tmp:
        torch.save(area, tmp)
    print(f"area {area['area']}: teacher {area['teacher_kwargs']}")
