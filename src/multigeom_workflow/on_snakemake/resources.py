"""
The resources of the per-image jobs, in one place: what each executor reads of a job
(`estimate_resources`, called from rules/estimate.smk), and the noise ceiling's rule
sharing the per-image rule's ``set-resources`` (`settle_per_image_rules`, from
rules/science.smk).
"""

from __future__ import annotations

from .. import snakemake_adapter as adapter
from ..planning.slurm import CAP_RESOURCE, SHARD_RESOURCES
from ..settings.names import CEILING_RULE, ESTIMATE_RULE, PER_IMAGE_RULES
from .run import Run

__all__ = ["estimate_resources", "settle_per_image_rules"]


def estimate_resources(run: Run) -> dict:
    """
    The resources of a per-image job (rules estimate_image, estimate_image_ceiling),
    in one place: `gpu`, 1 when it computes on this machine's GPU (remote profiles set
    their own count); `runtime`, its time limit in minutes on SLURM and Modal (a
    function of the job's wildcards, its share of its shard's limit); and for a run
    with the Modal executor plugin, one GPU (``gpu=1``: the Modal profile's limit of
    local scope runs a shard's jobs one per layer, so that Snakemake sums their
    runtimes into the shard's timeout), the GPU type and the budget of the config's
    `modal` section
    (`modal_gpu`, `modal_max_cost_usd`: the plugin reads a job's own values before its
    --modal-gpu and --modal-max-cost-usd), so that the dry run's estimate and the run
    on Modal use one GPU type and one budget (the budget as a string: Snakemake rounds
    a float resource to an integer). Another executor reads neither: a job carries
    none of what its executor does not read (Snakemake formats every resource of each
    of 40,000 jobs in a dry run). On SLURM (on the login node and in a shard's
    allocation) also what a shard needs (`SHARD_RESOURCES`: one GPU, its memory and
    CPU cores, ``mpi=""``), declared here so that a value a profile or the command
    line gives replaces that value only (``--set-resources`` on the command line
    replaces a profile's whole list).
    """
    s = run.scenario
    out = {"gpu": 1 if s.uses_gpu else 0, "runtime": None}
    if run.on_slurm:  # what a shard needs, whatever set-resources replaces
        out.update(SHARD_RESOURCES)
    if (run.slurm or run.modal) and (run.slurm or run.modal).shards:

        def runtime(wildcards) -> int:
            return run.runtime_of(wildcards)

        adapter.record_signature(runtime)  # Snakemake reads it at each job otherwise
        out["runtime"] = runtime
    if run.on_modal:  # --executor modal (a profile's too)
        out["gpu"] = 1  # its container's one GPU (the profile's gpu=1, local scope)
        out["modal_gpu"] = s.modal["gpu"]
        out["modal_max_cost_usd"] = str(float(s.modal["max_cost_usd"]))
    return out


def settle_per_image_rules(workflow, name: str = CEILING_RULE) -> None:
    """
    Once both per-image rules are defined: give the rule `name` (the noise ceiling's,
    estimate_image_ceiling) the resources that a profile or the command line sets for
    estimate_image (`set-resources`), except those set for `name` itself: a profile
    names the per-image rule once (`adapter.share_resources`; the planner's own
    setting `CAP_RESOURCE` dropped from both, not a resource a job asks its executor
    for). Then, with the speed patches on, what Snakemake would otherwise work out
    again for each of their 40,000 jobs (`adapter.settle_rules`).
    """
    adapter.share_resources(workflow, name, ESTIMATE_RULE, drop=[CAP_RESOURCE])
    adapter.settle_rules(workflow, PER_IMAGE_RULES)
