"""Rule plot_ground_truth: A_k of each configuration's G and J with its area's truth."""

import json
from pathlib import Path

from multigeom_workflow.results.figure import plot_ground_truth, save_figure
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    truth = json.loads(Path(snakemake.input.truth).read_text())
    fig = plot_ground_truth(truth)
    save_figure(fig, snakemake.output.png, snakemake.output.pdf)
