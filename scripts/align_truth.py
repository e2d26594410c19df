"""Rule align_truth: A_k of every configuration's G and J with its area's truth."""

from multigeom_workflow.jobs import job_log
from multigeom_workflow.results.science import truth_alignment

with job_log(snakemake.log[0]):
    truth_alignment(
        snakemake.input.per_image,
        snakemake.input.truth,
        snakemake.params.max_k,
        snakemake.output[0],
    )
