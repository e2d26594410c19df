"""
The live progress view (`multigeom_workflow.planning.live_view`) and the logger plugin
that draws it (``--logger multigeom``): images done per configuration, images per
minute, time left; plain lines when the output is not a terminal.
"""

from __future__ import annotations

import io
import logging
import sys
from types import SimpleNamespace

import pytest

from multigeom_workflow.planning import live_view
from multigeom_workflow.planning.cost import format_duration_short
from multigeom_workflow.planning.live_view import ProgressState
from snakemake_logger_plugin_multigeom import LogHandler, LogHandlerSettings


def make_plan(tmp_path, done: dict[str, int], total: int = 4) -> dict[str, list[str]]:
    plan = {}
    for config, n in done.items():
        files = [
            str(tmp_path / config.replace("/", "_") / f"img{i}.pt")
            for i in range(total)
        ]
        for f in files[:n]:
            (tmp_path / config.replace("/", "_")).mkdir(exist_ok=True)
            open(f, "w").close()
        plan[config] = files
    return plan


def test_rate_and_time_left(tmp_path):
    plan = make_plan(tmp_path, {"a/V1": 1, "b/V1": 0})
    state = ProgressState(plan, started=100.0)
    assert state.totals() == (1, 8, 0)
    assert state.rate_per_min(now=160.0) is None  # files there before do not count
    for f in plan["b/V1"][:3]:
        (tmp_path / "b_V1").mkdir(exist_ok=True)
        open(f, "w").close()
    assert state.refresh() is True
    assert state.refresh() is False
    # 3 new images in 90 s: 2 images/min; 4 left: 2 minutes
    assert state.rate_per_min(now=190.0) == pytest.approx(2.0)
    assert state.seconds_left(now=190.0) == pytest.approx(120.0)
    line = state.line(now=190.0)
    state.restart_clock()  # the first per-image job starts: the rate counts from now
    assert state.totals() == (4, 8, 0) and state.rate_per_min() is None
    assert line == (
        "progress: 4/8 per-image computations (a/V1 1/4, b/V1 3/4); 2 per min; "
        "about 2 min left"
    )


def test_durations_are_short():
    assert [format_duration_short(s) for s in (45, 720, 12240)] == [
        "45 s",
        "12 min",
        "3.4 h",
    ]


def test_plain_lines_when_not_a_terminal(tmp_path, monkeypatch):
    plan = make_plan(tmp_path, {"a/V1": 0})
    monkeypatch.setattr(live_view, "PLAN", plan)
    out = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", out)
    common = SimpleNamespace(stdout=False, dryrun=False)
    handler = LogHandler(common, LogHandlerSettings(interval=3600))
    handler.setFormatter(logging.Formatter("%(message)s"))
    try:
        handler.emit(logging.makeLogRecord({"msg": "Building DAG of jobs..."}))
        (tmp_path / "a_V1").mkdir()
        open(plan["a/V1"][0], "w").close()
        handler.emit(
            logging.makeLogRecord(
                {"msg": "Finished jobid: 3", "event": "job_finished", "job_id": 3}
            )
        )
    finally:
        handler.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "progress: 0/4 per-image computations (a/V1 0/4); rate not known yet"
    )
    assert lines[1] == "Building DAG of jobs..."
    assert lines[2] == "Finished jobid: 3"
    assert lines[3].startswith("progress: 1/4 per-image computations (a/V1 1/4); ")
    assert " per min; about" in lines[3]


def test_no_view_in_a_dry_run(tmp_path, monkeypatch):
    """A dry run has no view, and Snakemake's own stream handler writes its messages
    (the plugin says it does not write to the stream, and writes nothing)."""
    monkeypatch.setattr(live_view, "PLAN", make_plan(tmp_path, {"a/V1": 0}))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    handler = LogHandler(SimpleNamespace(stdout=False, dryrun=True), None)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.emit(logging.makeLogRecord({"msg": "Job stats:"}))
    handler.close()
    assert out.getvalue() == ""
    assert handler.writes_to_stream is False
    real = LogHandler(SimpleNamespace(stdout=False, dryrun=False), None)
    assert real.writes_to_stream is True
    real.close()


@pytest.mark.workflow
def test_a_dry_run_prints_the_same_with_and_without_the_plugin(tmp_path):
    """`snakemake -n --logger multigeom` prints the lines `snakemake -n` prints (times,
    the workflow's id and command apart; Snakemake orders a job's missing files and
    the jobs themselves as its sets do): Snakemake's own handler writes both."""
    import re

    from conftest import run_snakemake

    outs = []
    for extra in ([], ["--logger", "multigeom"]):
        done = run_snakemake(tmp_path, "-n", *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        text = done.stdout + done.stderr
        text = re.sub(r"\d\d:\d\d:\d\d", "hh:mm:ss", text)  # the dates
        text = re.sub(r"Workflow ID: \S+", "Workflow ID: -", text)
        lines = [
            " ".join(sorted(re.split(r"[,;]?\s+", line))) if "reason:" in line else line
            for line in text.splitlines()
            if "Command:" not in line
        ]
        outs.append(sorted(lines))
    assert "rule estimate_image:" in outs[0]
    assert len(outs[0]) > 100
    assert outs[1] == outs[0]


def test_the_noise_ceilings_estimates_have_a_row_of_their_own(tmp_path, monkeypatch):
    """The view's rows are those of the dry run's estimate and of `progress`: per
    configuration its images, the noise ceiling's second estimates in one row."""
    import yaml
    from conftest import REPO, TINY_CONFIG

    from multigeom_workflow.planning.plan import planned_files as _planned_files
    from multigeom_workflow.scenario import validated_scenario
    from multigeom_workflow.settings.layout import Computation

    monkeypatch.chdir(tmp_path)
    scenario = validated_scenario(yaml.safe_load(TINY_CONFIG.read_text()), REPO)
    planned = [
        Computation("onoff", "complex", 0),
        Computation("onoff", "complex", 1),
        Computation("onoff", "complex", 0, ceiling=True),
        Computation("smallcnn", "simple", 0, ceiling=True),
    ]
    rows = _planned_files(scenario, planned)
    assert list(rows) == [
        "onoff/complex",
        "smallcnn/complex",
        "onoff/simple",
        "smallcnn/simple",
        "noise ceiling",
    ]
    assert rows["onoff/complex"] == [
        scenario.per_image_file("onoff", "complex", 0),
        scenario.per_image_file("onoff", "complex", 1),
    ]
    assert rows["noise ceiling"] == [
        scenario.ceiling_file("onoff", "complex", 0),
        scenario.ceiling_file("smallcnn", "simple", 0),
    ]
    assert ProgressState(rows).line() == (
        "progress: 0/4 per-image computations (onoff/complex 0/2, smallcnn/complex "
        "0/0, onoff/simple 0/0, smallcnn/simple 0/0, noise ceiling 0/2); rate not "
        "known yet"
    )
