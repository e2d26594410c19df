"""
A killed run's spend found: the app of an earlier run of the same workflow (the same
volume folder, by default the same working directory) that still runs when a run
starts is stopped before the run's first submission, or, with
``--modal-earlier-apps count``, left and held in the budget; one line names it.
Through the installed ``modal`` client on the local Modal server, whose heartbeat
limit is set long here (:data:`LONG_S`), as Modal's is unknown: the killed run's app
still runs when the rerun starts.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from snakemake_executor_plugin_modal.earlier import (
    EarlierApp,
    EarlierHold,
    earlier_line,
    run_app_name,
)
from snakemake_executor_plugin_modal.prices import ContainerRequest, GpuRequest
from snakemake_executor_plugin_modal.staging import default_prefix

from .helpers import run_snakemake, unlock
from .test_failures import counts
from .test_lifetime import SHARD, _first, _first_committed, _paths, _wait

#: Seconds without a heartbeat after which the server stops an app, here: longer
#: than each test, so that a killed client's app runs on as on Modal until it
#: notices.
LONG_S = 600.0

#: One job of 2 cores and 2 GiB (runtime 5 min) that waits for the file <gate>;
#: each start is counted in <counts>/0.
GATED = """
rule all:
    input: "out.txt"

rule wait:
    output: "out.txt"
    threads: 2
    resources: mem_mb=2048, runtime=5
    shell:
        "echo ran >> {config[counts]}/0; "
        "until [ -e {config[gate]} ]; do sleep 0.2; done; echo done > {output}"
"""


def _popen(work, snakefile, *args):
    return run_snakemake(
        work,
        snakefile,
        *args,
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )


def _app_stops(server, app_id: str) -> list[int]:
    """Where in the server's record of RPCs each ``AppStop`` of `app_id` came."""
    with server.state.lock:
        return [
            i
            for i, c in enumerate(server.state.calls)
            if c.method == "AppStop" and c.requests and c.requests[0].app_id == app_id
        ]


def _first_of(server, method: str, since: int) -> int | None:
    """Where the first `method` RPC from record `since` on came, None if none."""
    with server.state.lock:
        calls = list(server.state.calls)
    return next(
        (i for i in range(since, len(calls)) if calls[i].method == method), None
    )


def _run_apps(server) -> list:
    """The runs' apps (``snakemake-<prefix>``; not the image build's)."""
    with server.state.lock:
        apps = list(server.state.apps.values())
    return [a for a in apps if a.description.startswith("snakemake-")]


def _kill(proc) -> None:
    proc.kill()
    proc.communicate(timeout=30)


@pytest.mark.timeout(400)
def test_a_killed_runs_app_is_stopped_before_the_reruns_first_submission(
    modal_server, tmp_path
):
    """
    Snakemake killed (SIGKILL) mid-shard, its container waiting; Modal has not
    noticed (the server's heartbeat limit is long): the app runs on. The rerun lists
    the apps (``AppList``), stops the killed run's (``AppStop``) and waits for its
    container to be gone before its own first ``FunctionMap``; one line names the
    app; the rerun computes the two images the killed run had not committed.
    """
    modal_server.state.app_heartbeat_timeout_s = LONG_S
    work, ran, gate, args = _paths(tmp_path)
    proc = _popen(work, SHARD, *args)
    _wait(lambda: _first_committed(modal_server, work), 120, "an image committed", proc)
    name = f"img{_first(tmp_path)}.txt"
    (old,) = _run_apps(modal_server)
    assert old.description == run_app_name(default_prefix(work))
    _kill(proc)
    (container,) = modal_server.state.running_containers()  # Modal has not noticed
    killed_at = len(modal_server.state.calls)
    before = counts(ran)

    unlock(work)
    rerun = _popen(work, SHARD, *args)
    _wait(
        lambda: _app_stops(modal_server, old.app_id), 120, "the old app stopped", rerun
    )
    gate.touch()  # the rerun's own shard may end now
    out, _ = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, out[-3000:]

    (stop,) = _app_stops(modal_server, old.app_id)
    listed = _first_of(modal_server, "AppList", killed_at)
    first_map = _first_of(modal_server, "FunctionMap", killed_at)
    assert listed is not None and first_map is not None
    assert killed_at <= listed < stop < first_map  # stopped before any submission
    assert (old.state_name, old.stop_reason) == ("APP_STATE_STOPPED", "stop")
    assert container.end_reason == "app stopped"
    assert container.ended_at <= modal_server.state.calls[first_map].at
    lines = [x for x in out.splitlines() if "earlier run of this workflow" in x]
    assert len(lines) == 1, out[-3000:]
    assert (
        f"Modal: 1 app(s) of an earlier run of this workflow (same volume folder) "
        f"still running: {old.app_id} (1 container(s), started "
    ) in lines[0]
    assert lines[0].endswith("stopped before any job, their containers gone")
    # the rerun started the two images not committed once each, not the first
    after = counts(ran)
    assert {i: after[i] - before.get(i, 0) for i in after} == {
        str(i): int(str(i) != name[3]) for i in range(3)
    }
    assert sorted(p.name for p in work.glob("img*.txt")) == [
        f"img{i}.txt" for i in range(3)
    ]


@pytest.mark.timeout(400)
def test_counted_earlier_apps_are_left_and_held_in_the_budget(modal_server, tmp_path):
    """
    The same with ``--modal-earlier-apps count``: the killed run's app is not
    stopped, its container still runs when the rerun spawns, and the line holds it
    in the budget as the rerun's dearest job: 2 cores and 2 GiB at Modal's rates
    (2 x 0.0000131 + 2 x 0.00000222 = 0.00003064 USD/s) for its 300 s timeout and
    120 s of start-up, 0.0128688 USD; with a budget of 0.03 USD the rerun's job
    (0.0128688 USD at worst) fits beside it and starts.
    """
    modal_server.state.app_heartbeat_timeout_s = LONG_S
    work, ran, gate = tmp_path / "wf", tmp_path / "ran", tmp_path / "gate"
    ran.mkdir()
    args = ["--config", f"counts={ran}", f"gate={gate}"]
    proc = _popen(work, GATED, *args)
    _wait(lambda: (ran / "0").exists(), 120, "the job started", proc)
    (old,) = _run_apps(modal_server)
    _kill(proc)
    (container,) = modal_server.state.running_containers()
    killed_at = len(modal_server.state.calls)

    unlock(work)
    rerun = _popen(
        work,
        GATED,
        *args,
        "--modal-earlier-apps",
        "count",
        "--modal-max-cost-usd",
        "0.03",
    )
    try:
        _wait(
            lambda: _first_of(modal_server, "FunctionMap", killed_at) is not None,
            120,
            "the rerun's job spawned",
            rerun,
        )
    except BaseException:
        rerun.kill()
        print(rerun.communicate(timeout=30)[0][-4000:])  # what the run said
        raise
    assert container.running  # left running
    gate.touch()
    out, _ = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, out[-3000:]
    assert _app_stops(modal_server, old.app_id) == []
    lines = [x for x in out.splitlines() if "earlier run of this workflow" in x]
    assert len(lines) == 1, out[-3000:]
    assert f"still running: {old.app_id} (1 container(s), started " in lines[0]
    assert lines[0].endswith(
        "left running (--modal-earlier-apps count); 1 container(s) held in the "
        "budget as this run's dearest job, 3.064e-05 USD/s each for up to 420 s: "
        "0.0129 USD"
    )
    assert (work / "out.txt").read_text().strip() == "done"


def test_a_hold_reads_as_a_running_call_until_its_bound():
    """
    An earlier app of 3 containers, each taken as one H100 with 4 cores and 16 GiB
    (0.001097 + 4 x 0.0000131 + 16 x 0.00000222 = 0.00118492 USD/s) for at most
    1,000 s: 3.55476 USD held aside; its cost grows with the seconds since it was
    found, and ends at the bound or when its app is stopped.
    """
    request = ContainerRequest(GpuRequest("H100"), 4.0, 16384)
    app = EarlierApp("ap-0123456789abcdefghijkl", "APP_STATE_EPHEMERAL", 0.0, 3)
    stopped = []
    hold = EarlierHold(app, request, 1000.0, stop=stopped.append)
    assert hold.reserved_usd(120.0) == pytest.approx(3 * 0.00118492 * 1000)
    assert hold.usd_per_second == pytest.approx(3 * 0.00118492)
    hold.started -= 10.0  # found 10 s ago
    assert hold.cost_usd == pytest.approx(3 * 0.00118492 * 10.0, rel=1e-3)
    assert not hold.expired
    assert hold.cancel() and stopped == [app.app_id] and hold.expired
    assert hold.usd_per_second == 0.0
    late = EarlierHold(app, request, 5.0, stop=stopped.append)
    late.started = time.monotonic() - 6.0
    assert late.expired and late.seconds == 5.0
    line = earlier_line([app], "stop", [hold], [app])
    assert "stopped before any job; ap-0123456789abcdefghijkl (3 container(s)" in line
    assert "still had containers after 60 s" in line
    assert line.endswith("0.00118492 USD/s each for up to 1000 s: 3.5548 USD")


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("wf-1a2b3c4d", "snakemake-wf-1a2b3c4d"),
        (
            "x" * 60 + "-1a2b3c4d",
            # SHA-256 of the prefix, its first 8 hex digits, keep two long names apart
            "snakemake-" + "x" * 45 + "-",
        ),
    ],
)
def test_the_apps_name_is_the_volume_folder_within_64_characters(prefix, expected):
    name = run_app_name(prefix)
    assert len(name) <= 64 and name.startswith(expected)
    assert run_app_name(prefix) != run_app_name(prefix[:-1] + "e")


def test_the_client_names_it_reaches_past_exist():
    """
    What `earlier` uses of the client beyond its public names (modal 1.6.4 has no
    public call that gives an app's running containers), as ``modal app list`` and
    ``modal app stop`` use them (modal/cli/app.py): each is there, with the fields
    read.
    """
    import inspect

    from modal._object import _get_environment_name
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client
    from modal_proto import api_pb2

    assert callable(synchronizer.create_blocking) and callable(_Client.from_env)
    assert "_stub" in dir(_Client)
    assert list(inspect.signature(_get_environment_name).parameters) == [
        "environment_name"
    ]
    assert api_pb2.AppListRequest(environment_name="main").environment_name == "main"
    item = api_pb2.AppListResponse.AppListItem(
        app_id="ap-1", description="d", state=api_pb2.APP_STATE_EPHEMERAL
    )
    assert (item.created_at, item.n_running_tasks) == (0.0, 0)
    stop = api_pb2.AppStopRequest(
        app_id="ap-1", source=api_pb2.APP_STOP_SOURCE_PYTHON_CLIENT
    )
    assert stop.app_id == "ap-1"
    for state in ("DETACHED", "DETACHED_DISCONNECTED", "INITIALIZING", "STOPPED"):
        assert api_pb2.AppState.Value(f"APP_STATE_{state}") >= 0
