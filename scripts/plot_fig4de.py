"""Rule plot_fig4de: Fig. 4D-E from Stage 5's metrics (and the noise ceiling)."""

import json
from pathlib import Path

from multigeom_workflow.results.figure import plot_fig4de, save_figure
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    metrics = json.loads(Path(snakemake.input.metrics).read_text())
    ceiling = None
    if "ceiling" in snakemake.input.keys():
        ceiling = json.loads(Path(snakemake.input.ceiling).read_text())
    fig = plot_fig4de(metrics, ceiling=ceiling, seeds=snakemake.params.seeds)
    save_figure(fig, snakemake.output.png, snakemake.output.pdf)
