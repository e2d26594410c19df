"""Rule extract_test_image: one TinyImageNet validation image out of the archive."""

from multigeom_workflow.inputs.fetch import extract_member
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    member = f"tiny-imagenet-200/val/images/{snakemake.wildcards.name}.JPEG"
    extract_member(snakemake.input.archive, member, snakemake.output[0])
