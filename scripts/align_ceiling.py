"""Rule align_ceiling: A_k between two estimates (two seeds) of the same images."""

from multigeom_workflow.jobs import job_log
from multigeom_workflow.results.science import noise_ceiling

with job_log(snakemake.log[0]):
    noise_ceiling(
        snakemake.input.first,
        snakemake.input.second,
        snakemake.params.max_k,
        snakemake.output[0],
    )
