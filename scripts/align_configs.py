"""Rule align_configs: Stage 5, upstream's alignment on the run's per-image files."""

from multigeom_workflow.results.alignment import align_configs
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    align_configs(
        snakemake.input.per_image,
        snakemake.output[0],
        snakemake.params.max_k,
        n_images=snakemake.params.n_images,
    )
