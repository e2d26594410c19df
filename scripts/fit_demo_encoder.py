"""Rule fit_demo_encoder: fit a demo encoder to a synthetic area; warn if it is poor."""

import json
import sys

import torch

from multigeom_workflow.atomic import atomic_path
from multigeom_workflow.inputs.demo.diagnostics import encoder_warnings
from multigeom_workflow.inputs.demo.training import fit_demo_encoder
from multigeom_workflow.inputs.images import load_test_image
from multigeom_workflow.script_log import job_log

params, wildcards = snakemake.params, snakemake.wildcards
with job_log(snakemake.log[0]):
    torch.set_num_threads(snakemake.threads)
    crops = torch.load(snakemake.input.crops)
    area = torch.load(snakemake.input.area, weights_only=False)
    tests = torch.stack([load_test_image(f) for f in snakemake.input.test_images])
    metadata = fit_demo_encoder(
        wildcards.encoder,
        area,
        crops,
        epochs=params.epochs,
        lr=params.lr,
        seed=params.seed,
        out=snakemake.output.encoder,
        backbone_epochs=params.backbone_epochs,
        backbone_lr=params.backbone_lr,
        backbone_batch_size=params.backbone_batch_size,
        backbone_readout_lr=params.backbone_readout_lr,
        test_images=tests,
    )
    with atomic_path(snakemake.output.report) as tmp:
        with open(tmp, "w") as f:
            json.dump(metadata, f, indent=1)
    print(metadata)
# Outside the log: the run's own output shows it. The threshold and the figures' names
# are not params: changing them must not refit the encoder (and recompute what follows).
results = snakemake.config["results_dir"].rstrip("/")
for line in encoder_warnings(
    f"{wildcards.encoder}/{wildcards.area}",
    metadata,
    snakemake.config["demo"]["min_val_corr"],
    f"{results}/fig4de.png and {results}/ground_truth.png",
):
    print(line, file=sys.stderr)
