"""
Every internal checked, every failure loud (multigeom_workflow.snakemake_adapter,
internals.py): a wrapped method of Snakemake that changed (made synchronous, missing,
another signature) is left as Snakemake has it with one line naming it; the command
line not found while Snakemake's command line parses the Snakefile stops the run with
one line; and in a real Snakemake run with such internals replaced, the run says so
in one line and plans with Snakemake's own behaviour.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import planned_jobs, python_path, run_snakemake

from multigeom_workflow import snakemake_adapter as adapter
from multigeom_workflow.planning.before_planning import PlanningView
from multigeom_workflow.snakemake_adapter import acting, internals


@pytest.fixture(autouse=True)
def _fresh_lines(monkeypatch):
    """Each test sees only its own switched-off lines; the file class's originals
    are put back after it."""
    from snakemake.io import _IOFile

    monkeypatch.setattr(internals, "_SWITCHED_OFF", {})
    monkeypatch.setattr(internals, "_SAID", set())
    monkeypatch.setattr(acting, "_ORIGINAL_FILE_METHODS", {})
    for name in acting.FILE_METHODS:
        monkeypatch.setattr(_IOFile, name, getattr(_IOFile, name))


def _view(tmp_path: Path) -> PlanningView:
    view = PlanningView()
    view.missing.add(str(tmp_path / "gone.pt"))
    return view


@pytest.mark.parametrize(
    "name, replacement, problem",
    [
        ("size_local", lambda self: 3, "is not a coroutine function"),
        ("is_fifo", None, "is missing"),
        ("exists_local", "signature", "takes (file), not (self)"),
    ],
)
def test_a_changed_file_method_is_left_alone_with_one_line(
    tmp_path, monkeypatch, name, replacement, problem
):
    from snakemake.io import _IOFile

    if replacement is None:
        monkeypatch.setattr(_IOFile, name, None)
    elif replacement == "signature":

        async def changed(file):
            return True

        monkeypatch.setattr(_IOFile, name, changed)
    else:
        monkeypatch.setattr(_IOFile, name, replacement)
    before = {n: getattr(_IOFile, n) for n in acting.FILE_METHODS}
    assert adapter.show_snakemake(_view(tmp_path)) is False
    assert {n: getattr(_IOFile, n) for n in acting.FILE_METHODS} == before
    lines = adapter.switched_off_lines()
    assert len(lines) == 1
    assert f"snakemake.io._IOFile.{name} {problem}" in lines[0]
    assert lines[0].startswith(f"Snakemake {internals.snakemake_version()}: ")
    assert "9.27.0 to 9.27.1" in lines[0] and "count may differ" in lines[0]
    assert adapter.switched_off_lines() == []  # each line once


def test_the_file_methods_as_written_for_are_wrapped(tmp_path):
    from snakemake.io import _IOFile

    original = _IOFile.exists_local
    assert adapter.show_snakemake(_view(tmp_path)) is True
    assert _IOFile.exists_local is not original
    assert adapter.switched_off_lines() == []


def test_no_command_line_in_snakemake_s_command_line_stops_the_run(monkeypatch):
    # outside Snakemake's command line (its Python API, these tests): no command line
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert adapter.inspection_only() is False
    assert adapter.executor_from_command_line() is None
    # in it, without args_to_api's args on the stack: one line, not "a real run"
    monkeypatch.setattr(sys, "argv", ["/opt/env/bin/snakemake", "--summary"])
    with pytest.raises(adapter.InternalChanged, match=r"^Snakemake 9\.\S+: snakemake"):
        adapter.inspection_only()
    with pytest.raises(adapter.InternalChanged, match="9.27.0 to 9.27.1"):
        adapter.executor_from_command_line()


def test_start_turns_an_internal_that_changed_into_one_line(monkeypatch):
    import importlib

    start_module = importlib.import_module("multigeom_workflow.on_snakemake.start")

    def changed(workflow, config):
        raise adapter.InternalChanged("Snakemake 9.99.0: x changed")

    monkeypatch.setattr(start_module, "_start", changed)
    with pytest.raises(SystemExit) as ended:
        start_module.start(None, {})
    assert ended.value.code == "error: Snakemake 9.99.0: x changed"


#: Put in the environment of a real Snakemake run: every Snakemake internal the
#: adapter wraps, replaced as a later release might have it, before the Snakefile is
#: parsed (Python imports sitecustomize at start).
SITECUSTOMIZE = """
import snakemake.io, snakemake.persistence

recorded = snakemake.persistence.PersistenceBase.params
exists = snakemake.io._IOFile.exists_local

def params(self, path, cached=True):  # a parameter more
    return recorded(self, path)

async def exists_local(file):  # its first parameter renamed
    return await exists(file)

snakemake.persistence.PersistenceBase.params = params
snakemake.io._IOFile.exists_local = exists_local
"""


def test_a_run_with_changed_internals_says_so_and_plans_as_snakemake_does(
    tiny_copy, tmp_path
):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # a touched input: a real run gives its recorded date back, so the dry run
    # would show it with that date (show_snakemake)
    image = sorted((tiny_copy / "runs").rglob("*.png"))[0]
    image.touch()

    env = {"PYTHONPATH": python_path(shim)}
    result = run_snakemake(tiny_copy, "-n", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    said = [line for line in text.splitlines() if "so the workflow leaves it" in line]
    names = sorted(re.search(r"Snakemake \S+: (\S+) ", line)[1] for line in said)
    assert all(line.startswith("warning: Snakemake ") for line in said), said
    assert names == [
        "snakemake.io._IOFile.exists_local",
        "snakemake.persistence.PersistenceBase.params",
    ], said
    assert "takes (self, path, cached), not (self, path)" in text
    # and the count is right: what the same dry run plans with the internals as the
    # workflow was written for (none of them left alone)
    reference = run_snakemake(tiny_copy, "-n")
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert planned_jobs(result) == planned_jobs(reference), (text, reference.stdout)
    assert ("Nothing to be done" in text) == (
        "Nothing to be done" in reference.stdout + reference.stderr
    )


def test_the_slurm_plugin_s_parts_are_checked_before_a_layer_goes_over_them(
    monkeypatch,
):
    """The SLURM plugin's status query, status check and submissions go under the
    workflow's layers only as written for (snakemake_adapter.SLURM_PLUGIN_PARTS);
    a part that changed is left as the plugin has it, with one line each."""
    import snakemake_executor_plugin_slurm as plugin

    from multigeom_workflow.on_slurm import status, submit

    for part in adapter.SLURM_PLUGIN_PARTS:
        assert acting.slurm_plugin_part_problem(part) is None, part
    # restored after the test
    monkeypatch.setattr(plugin, "query_job_status", plugin.query_job_status)
    monkeypatch.setattr(plugin, "subprocess", vars(plugin)["subprocess"])
    monkeypatch.setattr(
        plugin.Executor, "check_active_jobs", plugin.Executor.check_active_jobs
    )

    def query_job_status(command, logger):  # made synchronous
        return {}

    async def check_active_jobs(self, jobs):  # a coroutine, not a generator
        return None

    monkeypatch.setattr(plugin, "query_job_status", query_job_status)
    monkeypatch.setattr(plugin.Executor, "check_active_jobs", check_active_jobs)
    monkeypatch.setattr(plugin, "subprocess", object())
    status.install()
    assert plugin.query_job_status is query_job_status
    assert plugin.Executor.check_active_jobs is check_active_jobs
    assert submit.install() is None
    lines = adapter.switched_off_lines()
    assert all(x.startswith("snakemake-executor-plugin-slurm 2.8.0: ") for x in lines)
    assert [re.search(r"slurm \S+: (\S+) ", x)[1] for x in lines] == [
        "snakemake_executor_plugin_slurm.query_job_status",
        "snakemake_executor_plugin_slurm.Executor.check_active_jobs",
        "snakemake_executor_plugin_slurm.subprocess",
    ]
    assert "is not a coroutine function" in lines[0]
    assert "is not an async generator" in lines[1]
    assert "has no Popen" in lines[2]
