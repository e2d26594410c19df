"""
How long a run's work outlives its client, through the installed ``modal`` client on
the local Modal server: a client killed mid-shard leaves no container running and its
next run computes only what was not committed; a client that stops heartbeating is
named in one line, its calls end at once, and a later run brings home what was
committed; a periodic sync that fails once does not end the later ones.

The server stops an ephemeral app whose client sent no heartbeat for
``app_heartbeat_timeout_s`` (its default 60 s; Modal's own limit is not published:
tests/modal_server/README.md, "Apps"); these tests set it to :data:`LIMIT_S` so that
they take seconds, with the client heartbeating every second (the fixture's
``client_env``; Modal's interval is 15 s, modal/config.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from snakemake_executor_plugin_modal.staging import default_prefix

from .helpers import run_snakemake, spawned, unlock
from .modal_server import CommitFault
from .modal_server.containers import APP_HEARTBEAT_TIMEOUT_S
from .test_failures import counts, stdout_of

#: Seconds without a heartbeat after which the server stops the run's app, here.
LIMIT_S = 6.0

#: A shard of three images. The container's Snakemake runs them one at a time (the
#: shard's container has one core), in an order that follows string hashes: the image
#: that starts first (it takes the folder ``<first>`` atomically, and writes its index
#: there) ends at once; the others wait for the file ``<gate>``, so the test decides
#: when, or whether, they end; with ``hang=1`` only the first of them to pass the gate
#: ends (it takes ``<second>``), the last never does. Each start is counted outside
#: the container (``<counts>/<i>``), and each output holds a fresh random id, so that
#: an output brought home is known for the one made.
SHARD = """
rule all:
    input: expand("img{i}.txt", i=range(3))

rule image:
    output: "img{i}.txt"
    group: "shard"
    shell:
        "echo ran >> {config[counts]}/{wildcards.i}; "
        "if mkdir {config[first]} 2>/dev/null; then "
        "echo {wildcards.i} > {config[first]}/image; "
        "else until [ -e {config[gate]} ]; do sleep 0.2; done; "
        "if [ {config[hang]} = 1 ] && ! mkdir {config[second]} 2>/dev/null; "
        "then sleep 300; fi; fi; "
        "cat /proc/sys/kernel/random/uuid > {output}"
"""


def _paths(tmp_path, hang: int = 0):
    work, ran, gate = tmp_path / "wf", tmp_path / "ran", tmp_path / "gate"
    ran.mkdir()
    args = ["--group-components", "shard=3", "--modal-sync-seconds", "1"]
    args += ["--config", f"counts={ran}", f"gate={gate}", f"hang={hang}"]
    args += [f"first={tmp_path / 'first'}", f"second={tmp_path / 'second'}"]
    return work, ran, gate, args


def _first(tmp_path) -> str | None:
    """The index of the image that started first, once it has said so."""
    text = (
        (tmp_path / "first" / "image").read_text().strip()
        if (tmp_path / "first" / "image").exists()
        else ""
    )
    return text or None


def _committed(server, work):
    """The run's folder on the volume as committed (containers see their own view)."""
    return server.state.root / "volumes" / "main" / "tests" / default_prefix(work)


def _wait(predicate, timeout_s: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the run ended before {what}:\n{out[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def _first_committed(server, work) -> bool:
    """Whether the first image and its reuse marker are committed, and a second
    image has started (it waits for the gate)."""
    first = _first(work.parent)
    if first is None:
        return False
    root = _committed(server, work)
    done = root / ".snakemake" / "modal" / "done"
    return (
        (root / f"img{first}.txt").exists()
        and bool(list(done.glob(f"img{first}.txt@*")))
        and len(list((work.parent / "ran").iterdir())) == 2
    )


def _run_apps(server) -> list[str]:
    """The ids of the runs' apps (``snakemake-<prefix>``; not the image build's)."""
    apps = server.state.apps.values()
    return [a.app_id for a in apps if a.description.startswith("snakemake-")]


def _start_mid_shard(server, tmp_path):
    """
    Start a run of SHARD; return once the first image is committed and a second one
    waits: the run, its working directory, the count folder, the gate, its
    arguments, and the first image's name and content as committed.
    """
    work, ran, gate, args = _paths(tmp_path)
    server.state.app_heartbeat_timeout_s = LIMIT_S
    proc = run_snakemake(
        work,
        SHARD,
        *args,
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )
    _wait(
        lambda: _first_committed(server, work), 120, "the first image committed", proc
    )
    name = f"img{_first(tmp_path)}.txt"
    made = (_committed(server, work) / name).read_text()
    return proc, work, ran, gate, args, name, made


def _rerun(work, gate, args):
    """Open the gate, release the stopped run's lock, run again."""
    gate.touch()
    unlock(work)
    return run_snakemake(work, SHARD, *args, "--rerun-incomplete", timeout=180)


def _computed_once_more(before: dict, after: dict, reused: str) -> None:
    """The rerun started every image but `reused` (the one committed) once."""
    assert after[reused[3]] == 1, after
    assert {i: after[i] - before.get(i, 0) for i in after} == {
        str(i): int(str(i) != reused[3]) for i in range(3)
    }


def test_a_killed_client_leaves_no_container_and_the_rerun_computes_the_rest(
    modal_server, tmp_path
):
    """
    Snakemake killed (SIGKILL: no disconnect, no cancel) while its shard runs: the
    server stops the app once no heartbeat came for its limit and kills the
    container, at most the limit after the kill (its last heartbeat came before the
    kill; 5 s allowed for a loaded machine); the next run computes the two images not
    committed and brings the first home as committed. The limit is `LIMIT_S` here to
    keep the test short; the server's default, `APP_HEARTBEAT_TIMEOUT_S`, is a
    minute, so a client killed under it leaves no container running a minute on.
    """
    assert APP_HEARTBEAT_TIMEOUT_S == 60
    proc, work, ran, gate, args, name, made = _start_mid_shard(modal_server, tmp_path)
    (app_id,) = _run_apps(modal_server)
    proc.kill()
    proc.communicate(timeout=30)
    killed_at = time.monotonic()
    _wait(lambda: not modal_server.state.running_containers(), 60, "no container")
    gone_s = time.monotonic() - killed_at
    assert gone_s < LIMIT_S + 5, gone_s
    app = modal_server.state.apps[app_id]
    assert (app.state_name, app.stop_reason) == (
        "APP_STATE_STOPPED",
        "heartbeat timeout",
    )
    (container,) = modal_server.state.containers.values()
    assert container.end_reason == "app stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(container.pid, 0)
    before = counts(ran)
    assert sorted(before.values()) == [1, 1] and name[3] in before

    second = _rerun(work, gate, args)
    assert second.returncode == 0, second.stderr[-3000:]
    _computed_once_more(before, counts(ran), name)
    assert (work / name).read_text() == made
    assert len(spawned(modal_server)) == 2


def test_a_client_that_stops_heartbeating_is_named_and_its_calls_end(
    modal_server, tmp_path
):
    """
    Snakemake stopped (SIGSTOP) past the server's heartbeat limit, then continued:
    the server has stopped the app and its container. The run says so in one line,
    fails the shard at its next status check (its call is not taken as running),
    brings the committed image home; a later run computes only the two others.
    """
    proc, work, ran, gate, args, name, made = _start_mid_shard(modal_server, tmp_path)
    (app_id,) = _run_apps(modal_server)
    app = modal_server.state.apps[app_id]
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        _wait(lambda: app.state_name == "APP_STATE_STOPPED", 30, "the app stopped")
        time.sleep(1.0)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    continued_at = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    ended_s = time.monotonic() - continued_at
    assert proc.returncode != 0
    assert app.stop_reason == "heartbeat timeout"
    named = [x for x in out.splitlines() if "heartbeat" in x and app_id in x]
    assert len(named) == 1, out[-4000:]
    assert "Modal ended the call without a cancel from this run" in named[0]
    paused_s = float(named[0].split("did not run for ")[1].split()[0])
    assert LIMIT_S <= paused_s < 60, named[0]  # the SIGSTOP, measured by the plugin
    assert "still taken as running" not in out
    assert ended_s < 30, out[-3000:]  # the next status checks, not a 600 s grace
    assert "1 output(s) its container finished are brought home" in out
    assert (work / name).read_text() == made
    assert sorted(p.name for p in work.glob("img*.txt")) == [name]
    assert len(spawned(modal_server)) == 1  # nothing spawned into the stopped app

    before = counts(ran)
    second = _rerun(work, gate, args)
    assert second.returncode == 0, second.stderr[-3000:]
    _computed_once_more(before, counts(ran), name)
    assert (work / name).read_text() == made


def test_a_sync_that_fails_once_is_retried_and_a_timeout_keeps_what_it_synced(
    modal_server, tmp_path
):
    """
    The first commit after the first image's fails (``ConflictError``, which
    ``commit()`` raises as ``RuntimeError``); the container says so in one line and
    the next syncs go on: the second image, finished after the failure, is
    committed; the third never ends and the container is stopped at its timeout.
    The failed shard brings the two finished images home.
    """
    work, ran, gate, args = _paths(tmp_path, hang=1)
    proc = run_snakemake(
        work,
        SHARD,
        *args,
        "--modal-timeout",
        "30",
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )
    _wait(lambda: _first_committed(modal_server, work), 120, "a first image", proc)
    fault = modal_server.faults.commit = CommitFault(mode="once")
    _wait(lambda: fault.failed == 1, 30, "a commit failed", proc)
    volume = _committed(modal_server, work)
    assert len(list(volume.glob("img*.txt"))) == 1
    gate.touch()
    _wait(
        lambda: len(list(volume.glob("img*.txt"))) == 2,
        30,
        "a second image committed after the failed commit",
        proc,
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert fault.failed == 1 and fault.seen >= 2
    (call,) = spawned(modal_server)
    assert call["status"] == "GENERIC_STATUS_TIMEOUT", out[-3000:]
    said = stdout_of(modal_server, call["call_id"])
    lines = [x for x in said.splitlines() if "periodic sync" in x]
    assert len(lines) == 1, said[-3000:]
    assert "failed (RuntimeError" in lines[0]
    assert "ran past its timeout of 30 s" in out
    assert "2 output(s) its container finished are brought home" in out
    synced = sorted(p.name for p in volume.glob("img*.txt"))
    assert sorted(p.name for p in work.glob("img*.txt")) == synced
    for name in synced:
        assert (work / name).read_text() == (volume / name).read_text()
