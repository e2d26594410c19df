# What is left and what it will take: every dry run prints the estimate before its job
# list; a real run with the Modal executor refuses to start over budget.

from multigeom_workflow.cost import budget_problem
from multigeom_workflow.plan import estimate_lines, progress, run_estimates


def _estimates(done, modal_gpu=None):
    """The local and the Modal estimate of the work left, with this run's settings."""
    settings = workflow.resource_settings
    resources = {
        name: getattr(value, "value", value)
        for name, value in dict(settings.resources).items()
        if not name.startswith("_")
    }
    return run_estimates(
        SCENARIO, done, settings.cores, settings.nodes, resources, modal_gpu
    )


if workflow.output_settings.dryrun:
    _done = progress(SCENARIO)
    print("\n".join(estimate_lines(SCENARIO, _done, *_estimates(_done))), file=sys.stderr)


onstart:
    # Before any job. Local runs need torchvision's weights here; on Modal the
    # container image holds them, and the executor's --modal-gpu prices the run.
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
        gpu = getattr(workflow.executor_settings, "gpu", None)
        modal = _estimates(progress(SCENARIO), gpu)[1]
        problem = budget_problem(modal, SCENARIO.modal["max_cost_usd"])
        if problem:
            sys.exit(problem)
