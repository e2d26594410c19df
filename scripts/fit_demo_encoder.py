"""Rule fit_demo_encoder: fit a demo encoder's readout to a synthetic area."""

import torch

from multigeom_workflow.demo import fit_demo_encoder
from multigeom_workflow.jobs import job_log

with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    crops = torch.load(snakemake.input.crops)
    area = torch.load(snakemake.input.area, weights_only=False)
    metadata = fit_demo_encoder(
        snakemake.wildcards.encoder,
        area,
        crops,
        epochs=snakemake.params.epochs,
        lr=snakemake.params.lr,
        seed=snakemake.params.seed,
        out=snakemake.output[0],
    )
    print(metadata)
