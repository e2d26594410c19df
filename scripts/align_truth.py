"""Rule align_truth: A_k of every configuration's G and J with its area's truth."""

from multigeom_workflow.results.science import truth_alignment
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    truth_alignment(
        snakemake.input.per_image,
        snakemake.input.truth,
        snakemake.params.max_k,
        snakemake.output[0],
    )
