"""
The test tiers (README.md, "Run the tests"): ``python -m pytest`` runs every test;
``python -m pytest -m "not slow"`` the fast tier, for a developer's edit-test loop.

A test is slow when it starts processes: it uses a fixture that runs the workflow,
the SLURM cluster or the fake Modal (`SLOW_FIXTURES`), or its own code starts one
(`STARTS_A_PROCESS`: Snakemake, the CLI, a worker). Marked here at collection, so that
a new test lands in the right tier without a marker written by hand.
"""

from __future__ import annotations

import inspect

import pytest

#: Fixtures whose setup runs the workflow, a cluster or a fake backend.
SLOW_FIXTURES = {
    "tiny_run",
    "tiny_copy",
    "slurm_cluster",
    "slurm_run",
    "modal_run",
    "fake_modal",
}
#: What a test's own code calls to start a process.
STARTS_A_PROCESS = ("run_snakemake(", "subprocess.", "Popen(", "run_workflow(", "cli(")


def _starts_a_process(item) -> bool:
    func = getattr(item, "function", None)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    return any(call in source for call in STARTS_A_PROCESS)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: starts processes (the workflow, a cluster, a fake backend)"
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or _starts_a_process(
            item
        ):
            item.add_marker(pytest.mark.slow)
