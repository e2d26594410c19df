"""
Rule align_ceiling: A_k between two estimates (two seeds) of the same images, and
the shared-draws control of the compared pairs.
"""

from multigeom_workflow.results.science import noise_ceiling
from multigeom_workflow.script_log import job_log

with job_log(snakemake.log[0]):
    noise_ceiling(
        snakemake.input.first,
        snakemake.input.second,
        snakemake.params.max_k,
        snakemake.output[0],
        pairs=getattr(snakemake.params, "pairs", ()),
    )
