"""
One answer to "which executor" (multigeom_workflow.on_snakemake.run.executor_in_use),
read once at parse time, and a workflow that needs the Modal plugin only on Modal
(the reduced demo and the SLURM run of the tests run without it: tests/conftest.py
`WITHOUT_MODAL`).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from multigeom_workflow.on_snakemake import run as run_module
from multigeom_workflow.on_snakemake.run import executor_in_use, modal_requested
from multigeom_workflow.snakemake_adapter import GivenResources


def _given(per_rule=None, default=None) -> GivenResources:
    return GivenResources(per_rule=per_rule or {}, default=default or {})


@pytest.mark.parametrize("named", ["slurm", "modal", "local", "slurm-jobstep", "k8s"])
def test_the_command_line_s_executor_is_the_answer(named):
    slurm_asked = _given({"estimate_image": {"slurm_partition": "gpu"}})
    assert executor_in_use(named, slurm_asked) == named


def test_where_the_command_line_does_not_say(monkeypatch):
    command_line = None  # Snakemake's Python API, or no --executor
    monkeypatch.delitem(sys.modules, run_module.MODAL_PREFLIGHT, raising=False)
    assert executor_in_use(command_line, _given()) == "local"
    slurm = _given({"estimate_image": {"slurm_partition": "gpu"}})
    assert executor_in_use(command_line, slurm) == "slurm"
    assert executor_in_use(command_line, _given(default={"slurm_account": "a"})) == (
        "slurm"
    )
    # the Modal plugin made its settings (--executor modal, a profile's too)
    made = SimpleNamespace(requested_settings=lambda: object())
    monkeypatch.setitem(sys.modules, run_module.MODAL_PREFLIGHT, made)
    assert modal_requested()
    assert executor_in_use(command_line, slurm) == "modal"
    idle = SimpleNamespace(requested_settings=lambda: None)
    monkeypatch.setitem(sys.modules, run_module.MODAL_PREFLIGHT, idle)
    assert not modal_requested()
    assert executor_in_use(command_line, _given()) == "local"


def test_without_the_modal_plugin_the_estimate_says_so(monkeypatch):
    from multigeom_workflow.planning import plan
    from multigeom_workflow.planning.cost import MODAL_PLUGIN_MISSING, estimate_cost

    monkeypatch.setattr(plan, "modal_prices", lambda: None)
    scenario = SimpleNamespace(
        device="cpu", ceiling_images=0, modal={"max_cost_usd": 30.0}
    )
    local = estimate_cost(8, 2, 10.0, 15.0)
    lines = plan.estimate_lines(
        scenario, {("a", "V1"): (0, 8)}, {}, local, local, "2 cores"
    )
    assert lines[-1] == f"  on Modal: {MODAL_PLUGIN_MISSING}"
    assert not any("USD" in line or "warning" in line for line in lines)
