"""Rule verify_per_image_files: every per-image file checked before Stage 5 reads it."""

from multigeom_workflow.results.verify import Expected, verify_for_stage5
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    verify_for_stage5(
        snakemake.input,
        snakemake.params.image_files,
        Expected(**snakemake.params.expected),
        snakemake.output[0],
    )
