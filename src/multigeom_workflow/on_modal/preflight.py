"""
What a run on Modal would refuse, said before the container image is built: in a real
run it stops Snakemake while the workflow is read (the executor plugin builds the image
before Snakemake's ``onstart``), in a dry run it is printed as warnings.

The plugin's own refusals (no credentials, an unknown GPU type, a Python or a local
package its image cannot hold: ``snakemake_executor_plugin_modal.preflight``) are joined
with the workflow's: a folder of test images (a container holds only its shard's
images), the estimated cost of the work left above ``modal.max_cost_usd`` (or a GPU
without a price), and the entries a run may leave on the volume (a warning past the
50,000 under which Modal says a volume works best, a refusal from its 500,000 inodes).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from ..planning.cost import CostEstimate, budget_problem
from ..scenario import Scenario

__all__ = ["before_modal_run", "modal_run_problems", "volume_entries", "volume_problem"]


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
    estimate = modal_estimate()
    budget = budget_problem(estimate, scenario.modal["max_cost_usd"])
    if budget:
        problems.append(budget)
    volume = volume_problem(estimate)
    if volume and volume[0] == "refuse":
        problems.append(f"config error: {volume[1]}")
    return problems


def volume_entries(estimate: CostEstimate) -> int:
    """
    The most entries (files and folders) a run leaves on the Modal volume when its
    jobs fail (a finished shard's files leave it once home): each per-image file left
    and its reuse marker (2 per image), and a shard's log, container log and
    benchmark (3 per shard start); the few folders above them are not counted.
    """
    return 2 * estimate.images_left + 3 * estimate.startups


def volume_problem(estimate: CostEstimate) -> tuple[str, str] | None:
    """
    ``("warn", line)`` past the 50,000 entries under which Modal says a volume works
    best, ``("refuse", line)`` from its 500,000 inodes, else None: the plugin's
    ``volume_limits.volume_entries_problem`` on :func:`volume_entries`.
    """
    from snakemake_executor_plugin_modal.volume_limits import volume_entries_problem

    return volume_entries_problem(volume_entries(estimate))


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
    from snakemake_executor_plugin_modal.preflight import requested_settings

    modal_estimate = functools.cache(modal_estimate)  # made once, read twice
    problems = modal_run_problems(scenario, modal_estimate)
    if requested_settings() is not None:
        volume = volume_problem(modal_estimate())
        if volume and volume[0] == "warn":
            print(f"warning: {volume[1]}", file=sys.stderr)
    if not problems:
        return
    if dryrun:
        for line in problems:
            print(f"warning: a run on Modal would stop: {line}", file=sys.stderr)
        return
    sys.exit("\n".join(problems))
