"""
The parsed run as the rule files and the modules of `multigeom_workflow.on_snakemake`
see it (`Run`), and the one way they write a line to the run's output (`say`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cached_property

from ..planning.cost import run_timings
from ..planning.shards import SHARD_GROUP, shard_name
from ..planning.slurm import ShardPlan
from ..scenario import Scenario
from ..settings.layout import Computation
from ..settings.names import ESTIMATE_RULE
from ..snakemake_adapter import Facts, GivenResources

__all__ = [
    "SLURM_JOBSTEP",
    "Run",
    "executor_in_use",
    "modal_requested",
    "modal_startup_seconds",
    "say",
]

#: The executor a SLURM allocation's own Snakemake runs its jobs with.
SLURM_JOBSTEP = "slurm-jobstep"
#: The Modal executor plugin's module that records ``--executor modal``.
MODAL_PREFLIGHT = "snakemake_executor_plugin_modal.preflight"


def modal_requested() -> bool:
    """
    Whether Snakemake made the Modal executor's settings in this process
    (``--executor modal``, a profile's too: the plugin's
    ``preflight.requested_settings``). Never imports the plugin: Snakemake imported it
    if it made its settings, and a local or SLURM-only install has none.
    """
    preflight = sys.modules.get(MODAL_PREFLIGHT)
    return preflight is not None and preflight.requested_settings() is not None


def modal_startup_seconds() -> float:
    """The start-up the Modal plugin's budget holds beyond each timeout
    (``--modal-startup-seconds`` as Snakemake made its settings; 120 s, the
    plugin's default, where it made none).
    """
    preflight = sys.modules.get(MODAL_PREFLIGHT)
    settings = preflight.requested_settings() if preflight is not None else None
    return float(getattr(settings, "startup_seconds", None) or 120)


def executor_in_use(command_line: str | None, given: GivenResources) -> str:
    """
    The one answer to "which executor runs this workflow", read once at parse time:
    ``slurm``, ``modal``, ``slurm-jobstep`` (inside an allocation), ``local``, or the
    name another executor plugin gives.

    Parameters
    ----------
    command_line : str or None
        ``--executor`` as Snakemake's command line parsed it
        (`multigeom_workflow.snakemake_adapter.executor_from_command_line`). Where it
        does not name the executor (None: Snakemake's Python API, or no
        ``--executor``), the run is for Modal when Snakemake made the Modal
        executor's settings (`modal_requested`), for SLURM when its per-image jobs ask
        SLURM resources (``slurm_*`` in a profile's ``set-resources`` for
        estimate_image or in ``default-resources``), and local otherwise.
    given : GivenResources
        The resources a profile or the command line gave, as written.
    """
    if command_line is not None:
        return command_line
    if modal_requested():
        return "modal"
    asked = [*given.per_rule.get(ESTIMATE_RULE, {}), *given.default]
    if any(name.startswith("slurm_") for name in asked):
        return "slurm"
    return "local"


def say(line: str) -> None:
    """
    Write one line to the run's output (stderr, where Snakemake writes its own), in
    one write: ``print`` writes the text and its newline apart, and a line of
    Snakemake's logger from another thread between the two (its timestamp) ended up
    on ours (seen 2026-12-03, tests/test_orchestration.py).
    """
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


@dataclass
class Run:
    """
    The parsed run as the rules see it.

    Attributes
    ----------
    scenario : Scenario
        The validated configuration.
    shards : dict
        ((encoder, area), index) -> group name, for remote executors (empty locally).
    sharded : bool
        The per-image jobs are grouped into shards (a remote executor).
    n_shards : int
        The number of shards (`num_shards`); 0 when not sharded.
    slurm : ShardPlan or None
        The shards and time limits of a run for SLURM
        (`multigeom_workflow.planning.slurm`), None for any other run.
    runtimes : dict
        ((encoder, area), index) -> the `runtime` of its jobs on SLURM or Modal
        (`ShardPlan.runtimes`, computed once); empty elsewhere.
    shards_setting : int or str
        The config key ``shards``.
    executor : str
        The executor in use, read once at parse time (`executor_in_use`: ``slurm``,
        ``modal``, ``slurm-jobstep``, ``local``, ...).
    modal : ShardPlan or None
        The shards and time limits of a sharded run on Modal
        (`multigeom_workflow.planning.slurm.modal_plan`), None for any other run.
    facts : Facts or None
        What the running Snakemake is (`multigeom_workflow.snakemake_adapter.facts`),
        read once at parse time.
    given : GivenResources
        The resources a profile or the command line gave, as written.
    refused_dates : list of str
        Inputs whose recorded date this run could not set back
        (`multigeom_workflow.planning.before_planning`): their registry entries stay
        as recorded at the run's end.
    planned : list of Computation or None
        Snakemake's plan as per-image computations, read once it is built
        (`multigeom_workflow.on_snakemake.estimate.the_plan`); None before.
    """

    scenario: Scenario
    shards: dict = field(default_factory=dict)
    sharded: bool = False
    n_shards: int = 0
    slurm: ShardPlan | None = None
    runtimes: dict = field(default_factory=dict)
    shards_setting: int | str = "auto"
    executor: str = "local"
    modal: ShardPlan | None = None
    facts: Facts | None = None
    given: GivenResources = field(default_factory=GivenResources)
    refused_dates: list[str] = field(default_factory=list)
    planned: list[Computation] | None = None

    @cached_property
    def timings(self) -> list[tuple[str, str, float]]:
        """
        The run's measured timings, (device, device name, seconds) of its newest
        per-image files in its engine and precision (`run_timings`), read once per
        process: the shards' time limits at parse, the estimates and the Modal
        budget once the plan is built (a dry run read them twice before).
        """
        return run_timings(self.scenario)

    @property
    def on_slurm(self) -> bool:
        """A run for SLURM: planned on the login node, or a shard in its allocation
        (whose Snakemake runs the jobs with the executor `SLURM_JOBSTEP`).
        """
        return self.slurm is not None or self.executor == SLURM_JOBSTEP

    @property
    def on_modal(self) -> bool:
        """A run with ``--executor modal`` (a profile's too), on the machine that
        submits (a container's own Snakemake runs its jobs locally).
        """
        return self.executor == "modal"

    def runtime_of(self, wildcards) -> int:
        """
        A per-image job's `runtime` (minutes) on SLURM or Modal: its share of its
        shard's time limit (`ShardPlan.runtimes`: Snakemake sums a group's runtimes
        into the allocation's --time, or the container's timeout); a job outside the
        planned shards, one image's limit.
        """
        key = ((wildcards.encoder, wildcards.area), int(wildcards.index))
        return self.runtimes.get(key, (self.slurm or self.modal).single_minutes())

    def shard_of(self, encoder: str, area: str, index: int) -> str:
        """
        The group (shard) of a per-image job. A job planned that was not missing when
        the run was parsed (recomputed after a change of settings) goes to shard
        ``index mod n_shards``, so that such jobs spread over the shards too.
        """
        key = ((encoder, area), int(index))
        if key in self.shards:
            return self.shards[key]
        if not self.n_shards:
            return SHARD_GROUP
        return shard_name(int(index) % self.n_shards, self.n_shards)
