"""Rule plot_eigenvectors: the top eigenvectors of G and J as images, per test image."""

from multigeom_workflow.results.eigenvectors import (
    plot_eigenvectors,
    read_per_image_files,
)
from multigeom_workflow.results.figure import save_figure
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    first = read_per_image_files(snakemake.input.first)
    second = []
    if "second" in snakemake.input.keys():
        second = read_per_image_files(snakemake.input.second)
    fig = plot_eigenvectors(first, second, n_vectors=snakemake.params.n_vectors)
    save_figure(fig, snakemake.output.png, snakemake.output.pdf)
