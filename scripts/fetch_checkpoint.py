"""Rules fetch_encoder, fetch_diffusion: a published checkpoint from the Hub."""

from multigeom_workflow.inputs.fetch import fetch_checkpoint
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    out = fetch_checkpoint(
        snakemake.params.kind,
        snakemake.wildcards.encoder,
        snakemake.wildcards.area,
        snakemake.output[0],
        repo_id=snakemake.params.repo_id,
        revision=snakemake.params.revision,
    )
    print(f"{snakemake.params.repo_id}: {snakemake.params.kind} -> {out}")
