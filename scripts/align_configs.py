"""Rule align_configs: Stage 5, upstream's alignment on the checked per-image files."""

from multigeom_workflow.results.alignment import align_configs
from multigeom_workflow.results.verify import checked_files
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    align_configs(
        checked_files(snakemake.input.checked),
        snakemake.output[0],
        snakemake.params.max_k,
        n_images=snakemake.params.n_images,
    )
