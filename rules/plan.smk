# What is left and what it will take: every dry run prints the estimate before its job
# list; a real run with the Modal executor refuses to start over budget.

from multigeom_workflow.cost import budget_problem
from multigeom_workflow.cost import read_timings
from multigeom_workflow.progress_view import set_plan
from multigeom_workflow.plan import (
    estimate_lines,
    progress,
    run_estimates,
    slurm_estimate,
    slurm_lines,
    slurm_runtime_minutes,
)


def _estimates(done):
    """The local and the Modal estimate of the work left, with this run's settings."""
    settings = workflow.resource_settings
    resources = {
        name: getattr(value, "value", value)
        for name, value in dict(settings.resources).items()
        if not name.startswith("_")
    }
    return run_estimates(SCENARIO, done, settings.cores, settings.nodes, resources)


# A run for SLURM (profiles/slurm asks SLURM resources of the per-image jobs): the
# dry run adds GPU-hours per shard, and a per-image job's `runtime` (minutes; a shard's
# time limit is their sum) follows the seconds per image of the estimate. Elsewhere,
# and inside an allocation, `runtime` is not used: no per-image file is read for it.
SLURM_RUN = any(
    name.startswith("slurm_")
    for resources in (
        workflow.resource_settings.overwrite_resources.get("estimate_image", {}),
        workflow.resource_settings.default_resources or {},
    )
    for name in resources
) and not workflow.remote_exec
_slurm = (
    slurm_estimate(
        SCENARIO,
        read_timings(SCENARIO.per_image_files(), engine=SCENARIO.engine),
        workflow.resource_settings.nodes,
    )
    if SLURM_RUN
    else None
)
ESTIMATE_RUNTIME_MIN = slurm_runtime_minutes(_slurm[1]) if _slurm and _slurm[0] else None

if not workflow.output_settings.dryrun and not workflow.remote_exec:
    # the per-image files of the run, for the live view (--logger multigeom)
    set_plan(
        {
            f"{c.encoder}/{c.area}": SCENARIO.per_image_files(c)
            for c in SCENARIO.configurations
        }
    )

if workflow.output_settings.dryrun:
    _done = progress(SCENARIO)
    _lines = estimate_lines(SCENARIO, _done, *_estimates(_done))
    if _slurm:
        _lines += slurm_lines(*_slurm)
    print("\n".join(_lines), file=sys.stderr)


onstart:
    # Before any job. Local runs need torchvision's weights here; on Modal the
    # container image holds them, and the config's modal.gpu prices the run (the
    # GPU the per-image jobs ask the plugin for: get_estimate_resources).
    prepare_estimate_jobs()  # rules/common.smk
    plugin = workflow.executor_plugin
    if getattr(plugin, "name", None) != "modal":
        for problem in SCENARIO.blockers:
            sys.exit(f"config error: {problem}")
    else:
        if SCENARIO.test_source == "folder":
            sys.exit(
                "config error: config key 'test_images.source' = 'folder': not "
                "supported on Modal (a container holds only its shard's images, so "
                "the folder's order cannot be read there); use tinyimagenet or demo, "
                "or run locally"
            )
        modal = _estimates(progress(SCENARIO))[1]
        problem = budget_problem(modal, SCENARIO.modal["max_cost_usd"])
        if problem:
            sys.exit(problem)
