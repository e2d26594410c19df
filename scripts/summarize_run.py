"""Rule summarize_run: the report's tables (Stage 5's metrics, progress, settings)."""

import json
from pathlib import Path

from multigeom_workflow.results.report import (
    metrics_table,
    progress_table,
    settings_table,
    write_html_table,
)
from multigeom_workflow.results.verify import checked_files, checked_seconds
from multigeom_workflow.script_log import job_log
from multigeom_workflow.settings.layout import parse_image_file

with job_log(snakemake.log[0]):
    metrics = metrics_table(json.loads(Path(snakemake.input.metrics).read_text()))
    metrics.to_csv(snakemake.output.metrics_csv, index=False)
    write_html_table(
        [(f"{metric}(x)", t) for metric, t in metrics.groupby("metric", sort=True)],
        snakemake.output.metrics,
        "Stage 5: subspace alignment A_k between configurations",
    )
    configurations = [tuple(c) for c in snakemake.params.configurations]
    files = {c: [] for c in configurations}  # the per-image files, by configuration
    for f in checked_files(snakemake.input.checked):
        encoder, area, _ = parse_image_file(f)
        files[(encoder, area)].append(f)
    seconds = checked_seconds(snakemake.input.checked)
    progress = progress_table(configurations, files, seconds)
    write_html_table(
        [("per configuration", progress)],
        snakemake.output.progress,
        "Progress and seconds per image",
    )
    settings = settings_table(snakemake.config, snakemake.params.settings_files)
    write_html_table([("settings", settings)], snakemake.output.settings, "Settings")
