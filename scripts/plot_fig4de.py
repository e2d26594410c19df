"""Rule plot_fig4de: Fig. 4D-E from Stage 5's metrics."""

import json
from pathlib import Path

from multigeom_workflow.figure import plot_fig4de, save_figure
from multigeom_workflow.jobs import job_log

with job_log(snakemake.log[0]):
    metrics = json.loads(Path(snakemake.input.metrics).read_text())
    fig = plot_fig4de(metrics)
    save_figure(fig, snakemake.output.png, snakemake.output.pdf)
