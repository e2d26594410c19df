"""
What a run on Modal would refuse, said before the container image is built: in a real
run it stops Snakemake while the workflow is read (the executor plugin builds the image
before Snakemake's ``onstart``), in a dry run it is printed as warnings.

The plugin's own refusals (no credentials, an unknown GPU type, a Python or a local
package its image cannot hold: ``snakemake_executor_plugin_modal.preflight``) are joined
with the workflow's: a folder of test images (a container holds only its shard's
images), and the estimated cost of the work left above ``modal.max_cost_usd`` (or a GPU
without a price).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..planning.cost import CostEstimate, budget_problem
from ..scenario import Scenario

__all__ = ["before_modal_run", "modal_run_problems"]


def modal_run_problems(
    scenario: Scenario, modal_estimate: Callable[[], CostEstimate], settings=None
) -> list[str]:
    """
    One line per thing a run with ``--executor modal`` would refuse.

    Parameters
    ----------
    scenario : Scenario
        The validated run.
    modal_estimate : callable
        Returns the Modal estimate of the work left (called only when needed).
    settings : ExecutorSettings, optional
        The plugin's settings; default: those Snakemake made in this process
        (``requested_settings``), none when the run is not for Modal.

    Returns
    -------
    list of str
        Empty when the run is not for Modal or nothing would be refused.
    """
    from snakemake_executor_plugin_modal import preflight
    from snakemake_executor_plugin_modal.prices import give_prices

    settings = settings if settings is not None else preflight.requested_settings()
    if settings is None:
        return []
    # the config's prices (modal.prices_usd_per_s) price the run's budget guard as
    # they price the estimate: a GPU type priced there is not refused
    give_prices(scenario.modal.get("prices_usd_per_s") or {})
    problems = preflight.settings_problems(settings)
    gpu = preflight.gpu_problem(str(scenario.modal["gpu"]), "config key 'modal.gpu'")
    if gpu:
        problems.append(f"config error: {gpu}")
    if scenario.test_source == "folder":
        problems.append(
            "config error: config key 'test_images.source' = 'folder': not supported "
            "on Modal (a container holds only its shard's images, so the folder's "
            "order cannot be read there); use tinyimagenet or demo, or run locally"
        )
    budget = budget_problem(modal_estimate(), scenario.modal["max_cost_usd"])
    if budget:
        problems.append(budget)
    return problems


def before_modal_run(
    scenario: Scenario,
    modal_estimate: Callable[[], CostEstimate],
    *,
    remote: bool,
    dryrun: bool,
) -> None:
    """
    While Snakemake reads the workflow: for a run with ``--executor modal`` (a
    profile's ``executor: modal`` too), stop a real run that would be refused, before
    the plugin builds the image; print the same lines as warnings in a dry run.
    Nothing in a container (`remote`) or for another executor.

    Parameters
    ----------
    scenario : Scenario
    modal_estimate : callable
        See :func:`modal_run_problems`.
    remote : bool
        Snakemake runs a job's own workflow (in a container, an allocation).
    dryrun : bool
        A dry run (``snakemake -n``): warnings only.

    Raises
    ------
    SystemExit
        In a real run, with every problem, one per line.
    """
    if remote:
        return
    problems = modal_run_problems(scenario, modal_estimate)
    if not problems:
        return
    if dryrun:
        for line in problems:
            print(f"warning: a run on Modal would stop: {line}", file=sys.stderr)
        return
    sys.exit("\n".join(problems))
