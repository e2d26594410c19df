"""Rule cut_training_crops: the demo's training crops, (N, 1, 64, 64) in [-1, 1]."""

import torch

from multigeom_workflow.atomic import atomic_path
from multigeom_workflow.inputs.demo.data import cut_training_crops
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    params = snakemake.params
    crops = cut_training_crops(params.n_crops, params.seed)
    with atomic_path(snakemake.output[0]) as tmp:
        torch.save(crops, tmp)
    print(f"{len(crops)} crops, pixels in [{crops.min():.2f}, {crops.max():.2f}]")
