"""Rule download_tinyimagenet: the archive, its size and zip structure checked."""

from multigeom_workflow.inputs.fetch import download_tinyimagenet_archive
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    download_tinyimagenet_archive(
        snakemake.output[0],
        urls=snakemake.params.urls,
        expected_bytes=snakemake.params.expected_bytes,
    )
