"""Rule area_fisher: the ground truth J_area(x) of a demo area at one test image."""

import torch

from multigeom_workflow.atomic import atomic_path
from multigeom_workflow.inputs.demo.truth import area_fisher
from multigeom_workflow.inputs.images import load_test_image
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    area = torch.load(snakemake.input.area, weights_only=False)
    image = load_test_image(snakemake.input.image).unsqueeze(0)
    truth = area_fisher(area, image, snakemake.params.top_k)
    truth["img_idx"] = int(snakemake.wildcards.index)
    with atomic_path(snakemake.output[0]) as tmp:
        torch.save(truth, tmp)
