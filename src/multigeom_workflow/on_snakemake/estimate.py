"""
The estimate of what is left, read from Snakemake's own plan.

What is left is what Snakemake will run: the dry run's estimate, the Modal budget
check, the SLURM lines, the live view and ``multigeom-workflow progress`` count the
per-image jobs of Snakemake's own plan (its jobs to run, after its rerun triggers and
metadata: `planned_per_image`), read once the plan is built
(`adapter.when_plan_built`: the dry run's estimate, the live view's files, the plan
file of ``progress``) and, for the Modal budget, at ``onstart``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import snakemake_adapter as adapter
from ..planning.live_view import set_plan
from ..planning.plan import (
    add_progress,
    concurrency_line,
    estimate_lines,
    plan_counts,
    planned_files,
    progress,
    run_estimates,
)
from ..planning.shards import num_shards
from ..planning.slurm import modal_plan, plan_for_run
from ..planning.slurm_checks import shard_request
from ..settings.layout import Computation
from ..settings.names import ESTIMATE_RULE, PER_IMAGE_RULES
from .run import Run, modal_startup_seconds, say

__all__ = [
    "PLAN_FILE_ENV",
    "estimate_text",
    "estimates_of_plan",
    "install",
    "modal_estimate_now",
    "planned_per_image",
    "the_plan",
    "write_plan_file",
]

#: Where `multigeom-workflow progress` asks a dry run to write its plan (JSON).
PLAN_FILE_ENV = "MULTIGEOM_PLAN_FILE"


def planned_per_image(workflow) -> list[Computation]:
    """
    The per-image computations Snakemake will run, once its plan is built: one
    `Computation` for every job of `PER_IMAGE_RULES` among its jobs to run
    (`adapter.planned_jobs`), the run's estimates first, then by configuration and
    image.
    """
    out = [
        Computation.of_job(rule, wildcards)
        for rule, wildcards in adapter.planned_jobs(workflow, PER_IMAGE_RULES)
    ]
    return sorted(out, key=lambda c: (c.ceiling, c.configuration, c.index))


def the_plan(workflow, run: Run) -> list[Computation]:
    """
    Snakemake's plan as per-image computations, read once per process
    (`planned_per_image`, kept in `Run.planned` for every later reader: the
    estimate, the live view, the budget check at ``onstart``).
    """
    if run.planned is None:
        run.planned = planned_per_image(workflow)
    return run.planned


def estimates_of_plan(run: Run, planned):
    """The local and Modal estimates (`run_estimates`) of the planned jobs."""
    done, ceiling, pending = plan_counts(run.scenario, planned)
    local, modal, why = run_estimates(
        run.scenario,
        add_progress(done, ceiling),
        run.facts.cores,
        run.facts.nodes,
        run.given.limits,
        pending=pending,
        timings=run.timings,
    )
    return done, ceiling, pending, local, modal, why


def modal_estimate_now(run: Run):
    """The Modal estimate of the per-image files missing now (before the plan)."""
    return run_estimates(
        run.scenario,
        progress(run.scenario, with_ceiling=True),
        run.facts.cores,
        run.facts.nodes,
        run.given.limits,
        timings=run.timings,
    )[1]


def estimate_text(workflow, run: Run, planned) -> list[str]:
    """The lines a dry run prints: the estimate of the plan, and SLURM's."""
    done, ceiling, pending, local, modal, why = estimates_of_plan(run, planned)
    lines = estimate_lines(run.scenario, done, ceiling, local, modal, why)
    jobs = {}
    for c in planned:
        jobs[(c.configuration, c.index)] = jobs.get((c.configuration, c.index), 0) + 1
    computations = [(config, i, jobs[(config, i)]) for config, i in pending]
    if run.on_modal and computations:  # the shards of Snakemake's plan, at once?
        wanted = num_shards(run.shards_setting, run.facts.nodes)
        shards = modal_plan(run.scenario, wanted, run.timings).replanned(computations)
        line = concurrency_line(
            shards.limits,
            modal.price_usd_per_s,
            float(run.scenario.modal["max_cost_usd"]),
            modal_startup_seconds(),
        )
        if line:
            lines.append(line)
    if run.slurm:  # the shards of Snakemake's plan
        if run.slurm.shards:  # its timings and MaxTime read once, at parse
            slurm = run.slurm.replanned(computations)
        else:
            slurm = plan_for_run(
                run.scenario,
                run.given,
                run.facts.nodes,
                run.shards_setting,
                False,
                planned=computations,
                executor=run.executor,
                timings=run.timings,
            )
        asked = shard_request(adapter.resources_in_force(workflow, ESTIMATE_RULE))
        lines += slurm.lines(asked)
    return lines


def write_plan_file(path: str, run: Run, planned) -> None:
    """The plan as `multigeom-workflow progress` reads it (JSON, `PLAN_FILE_ENV`)."""
    done, ceiling, _ = plan_counts(run.scenario, planned)
    files = planned_files(run.scenario, planned)
    Path(path).write_text(
        json.dumps(
            {
                "per_image": [[*k, *v] for k, v in done.items()],
                "ceiling": [[*k, *v] for k, v in ceiling.items()],
                "planned": [f for fs in files.values() for f in fs],
            }
        )
    )


def install(workflow, run: Run) -> None:
    """
    Once Snakemake's plan is built (`adapter.when_plan_built`, in a dry run and in a
    real run): the plan file ``progress`` asked for (`PLAN_FILE_ENV`), and the dry
    run's estimate or, in a real run, the planned per-image files for the live view;
    the budget check runs at ``onstart``. An error here is one warning line, never a
    stop of Snakemake.
    """

    def on_plan(planned_any: bool) -> None:
        try:
            if not planned_any:
                run.planned = []
            planned = the_plan(workflow, run)
            if os.environ.get(PLAN_FILE_ENV):
                write_plan_file(os.environ[PLAN_FILE_ENV], run, planned)
            if run.facts.dryrun:
                say("\n".join(estimate_text(workflow, run, planned)))
            else:
                set_plan(planned_files(run.scenario, planned))
        except Exception as err:  # never let the estimate stop Snakemake
            say(f"warning: the estimate failed: {type(err).__name__}: {err}")

    adapter.when_plan_built(on_plan)
