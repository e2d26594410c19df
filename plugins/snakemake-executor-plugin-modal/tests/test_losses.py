"""
A lost container, and a call whose status never comes, on the local Modal server:
what the installed ``modal`` client raises for each way Modal loses a container
(``ContainerLoss``: OOM-killed, its entrypoint killed, its worker lost) and for an
app stopped with ``modal app stop``, read with the app's state that Modal reports
(``App.info(refresh=True)``); and, through the plugin, that a lost container fails
its own job only (retried; the other shard runs on) while a stopped app ends the run,
and that a call never answered fails by its deadline.
"""

from __future__ import annotations

import time

import pytest

from .modal_server import ContainerLoss, Faults, Unanswered, serve
from .test_modal_server import _ERROR, run_client

#: A function that sleeps in a container (a child process beside it, as the job's
#: Snakemake is), and one that returns at once; then what the test's case asks.
_CASES = (
    _ERROR
    + """
import os, subprocess
app = modal.App("losses")
vol = modal.Volume.from_name("data", create_if_missing=True)
options = dict(
    volumes={arg["mount"]: vol},
    serialized=True,
    single_use_containers=True,
    timeout=60,
)
def sleeper():
    child = subprocess.Popen(["sleep", "60"])
    child.wait()
def quick(x):
    return x
sleeper = app.function(**options, name="sleeper")(sleeper)
quick = app.function(**options, name="quick")(quick)
def state():
    return app.info(refresh=True).lifecycle.state.value
with app.run():
    out["app_id"] = app.app_id
    if arg["case"] == "unanswered":
        out["first"] = error(lambda: quick.spawn(1).get(timeout=3))
        out["second"] = quick.spawn(2).get(timeout=30)
    else:
        call = sleeper.spawn()
        if arg["case"] == "stop":
            time.sleep(2)
            subprocess.run(
                [sys.executable, "-m", "modal", "app", "stop", app.app_id, "--yes"],
                check=True,
                timeout=60,
            )
        out["error"] = error(lambda: call.get(timeout=30))
    out["state"] = state()
"""
)


@pytest.mark.modal_server
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "raised", "status"),
    [
        ("oom", "RemoteError", "GENERIC_STATUS_KERNEL_OOM_KILL"),
        ("entrypoint", "RemoteError", "GENERIC_STATUS_TERMINATED"),
        ("worker", "InternalFailure", "GENERIC_STATUS_INTERNAL_FAILURE"),
    ],
)
def test_a_lost_container_ends_its_input_as_modal_says_and_the_app_runs_on(
    tmp_path, how, raised, status
):
    """
    Each loss ends the input with Modal's status for it (modal_proto/api.proto), which
    the client raises (``_process_result``, modal/_utils/function_utils.py):
    ``RemoteError`` itself for an OOM kill and a killed entrypoint (the error a
    stopped app's inputs raise too), ``InternalFailure`` for a lost worker; the
    container is gone, killed (``SIGKILL``), and Modal says the app still runs
    (``App.info``: ephemeral).
    """
    loss = ContainerLoss(how=how, after_s=1.0)
    with serve(tmp_path / "server", faults=Faults(loss=loss)) as server:
        out = run_client(server, _CASES, {"mount": str(tmp_path / "mnt"), "case": how})
        state = server.state
        (container,) = state.containers.values()
        assert loss.lost == [container.task_id]
        assert container.end_reason == loss.end_reason
        assert container.returncode == -9
        assert not state.running_containers()
        (call,) = state.function_calls.values()
        assert call.status_name == status
        assert out["error"] == [
            raised,
            f"container {container.task_id}: {loss.end_reason} (local Modal "
            "server's fault)",
        ]
        assert out["state"] == "ephemeral"
        # stopped only when the client left, by its disconnect
        assert state.apps[out["app_id"]].stop_reason == "disconnect"


@pytest.mark.modal_server
@pytest.mark.timeout(120)
def test_an_app_stopped_with_modal_app_stop_says_so(tmp_path):
    """
    ``modal app stop <app id> --yes`` (the CLI reads the app's lifecycle first,
    ``AppGetLifecycle``, then ``AppStop``): the running input ends terminated, its
    ``get`` raises ``RemoteError`` itself, as a lost container's does, and only the
    app's state tells them apart: Modal says it is stopped.
    """
    with serve(tmp_path / "server") as server:
        arg = {"mount": str(tmp_path / "mnt"), "case": "stop"}
        out = run_client(server, _CASES, arg)
        app = server.state.apps[out["app_id"]]
        assert (app.state_name, app.stop_reason) == ("APP_STATE_STOPPED", "stop")
        assert out["error"] == ["RemoteError", "the app was stopped"]
        assert out["state"] == "stopped"
        assert [c.method for c in server.state.calls if c.method.startswith("AppGet")][
            :1
        ] == ["AppGetLifecycle"]


@pytest.mark.modal_server
@pytest.mark.timeout(120)
def test_an_unanswered_call_never_gives_its_output(tmp_path):
    """
    ``Unanswered``: the first call's output never comes, though its container
    returned: ``get`` raises the builtin ``TimeoutError`` (``poll_function``,
    modal/_functions.py) after its timeout; the next call is answered.
    """
    unanswered = Unanswered(times=1)
    with serve(tmp_path / "server", faults=Faults(unanswered=unanswered)) as server:
        arg = {"mount": str(tmp_path / "mnt"), "case": "unanswered"}
        out = run_client(server, _CASES, arg)
        state = server.state
        first = state.function_calls[unanswered.call_ids[0]]
        assert first.status_name == "GENERIC_STATUS_SUCCESS"  # it ran, unanswered
        assert out["first"] == ["TimeoutError", ""]
        assert out["second"] == 2
        assert len(unanswered.call_ids) == 1 and unanswered.seen == 2


class _Ended:
    """A ``FunctionCall`` whose ``get`` raises ``error`` (each time); its cancels."""

    object_id = "fc-ended"

    def __init__(self, error: BaseException):
        self.error = error
        self.cancels: list[bool] = []

    def get(self, timeout=None):
        raise self.error

    def cancel(self, terminate_containers=False):
        self.cancels.append(terminate_containers)


def _asks(*answers):
    """An ``app_stopped`` that gives (or raises) each of `answers` in turn; the
    questions asked are counted in its ``asked``."""

    def ask() -> bool:
        ask.asked += 1
        answer = answers[min(ask.asked, len(answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    ask.asked = 0
    return ask


def test_modal_ending_a_call_is_the_runs_end_only_where_modal_says_the_app_ended():
    """
    ``RemoteError`` itself (a lost container's call and a stopped app's raise it
    alike): Modal is asked for the app's state; stopped, the call is
    ``ended_by_modal`` (the run's end); running, it is ``lost`` (its job's failure);
    the state unreadable (a transport error), running for now and asked again,
    given up after the grace; never cancelled again (its input has ended).
    """
    import modal.exception

    from snakemake_executor_plugin_modal.calls import ContainerCall

    gone = modal.exception.RemoteError("container ta-1: oom killed")
    stopped = ContainerCall(_Ended(gone), None, 60, app_stopped=_asks(True)).poll()
    assert stopped.ended_by_modal and not stopped.lost and not stopped.ok
    assert stopped.message == (
        "Modal ended the call without a cancel from this run (RemoteError: "
        "container ta-1: oom killed)"
    )

    ask = _asks(False)
    call = ContainerCall(_Ended(gone), None, 60, app_stopped=ask)
    lost = call.poll()
    assert lost.lost and not lost.ended_by_modal and not lost.ok
    assert lost.message.startswith(
        "its container was lost (RemoteError: container ta-1: oom killed): Modal "
        "ended the call without a cancel from this run while the run's app runs on"
    )
    assert lost.message.endswith(
        "; this job fails (and is retried where its retries allow), the others run on"
    )
    assert ask.asked == 1 and call.call.cancels == [] and call.ended is not None

    unreachable = modal.exception.ServiceError("AppGetInfo: UNAVAILABLE")
    warnings: list[str] = []
    ask = _asks(unreachable, False)
    call = ContainerCall(
        _Ended(gone), None, 60, app_stopped=ask, warn=warnings.append, grace_s=600
    )
    assert call.poll() is None  # the state not read: running for now
    assert len(warnings) == 1 and "AppGetInfo: UNAVAILABLE" in warnings[0]
    assert call.poll().lost and ask.asked == 2  # asked again at the next check
    given_up = ContainerCall(
        _Ended(gone), None, 60, app_stopped=_asks(unreachable), grace_s=0
    ).poll()
    assert given_up.given_up and not given_up.lost

    refused = modal.exception.AuthError("token revoked")
    unknown = ContainerCall(_Ended(gone), None, 60, app_stopped=_asks(refused)).poll()
    assert unknown.lost  # only an app Modal says has ended ends the run
    assert "(the app's state could not be read: AuthError: token revoked)" in (
        unknown.message
    )


def test_a_lost_worker_is_its_jobs_failure():
    """``InternalFailure`` (a lost worker, ``GENERIC_STATUS_INTERNAL_FAILURE``): the
    job's failure, the call cancelled (it may run on), the app not asked."""
    import modal.exception

    from snakemake_executor_plugin_modal.calls import ContainerCall

    ask = _asks(True)
    handle = _Ended(modal.exception.InternalFailure("container ta-2: worker lost"))
    outcome = ContainerCall(handle, None, 60, app_stopped=ask).poll()
    assert not outcome.ok and not outcome.ended_by_modal and not outcome.lost
    assert outcome.message == (
        "the Modal call failed: InternalFailure: container ta-2: worker lost"
    )
    assert handle.cancels == [True] and ask.asked == 0


def test_a_call_without_output_past_its_deadline_is_cancelled():
    """
    No output yet (``TimeoutError()``, ``poll_function``): running until the
    deadline, timeout + start-up + margin seconds after the spawn; past it, a
    failure marked ``past_deadline`` naming the three, and the call cancelled.
    """
    from snakemake_executor_plugin_modal import calls
    from snakemake_executor_plugin_modal.limits import DEADLINE_MARGIN_S

    handle = _Ended(TimeoutError())
    call = calls.ContainerCall(handle, None, 60, startup_s=30, margin_s=10)
    assert call.deadline_s == 100.0
    assert calls.ContainerCall(handle, None, 60).deadline_s == 60 + 120 + (
        DEADLINE_MARGIN_S
    )
    call.started = time.monotonic() - 99.0  # spawned 99 s ago
    assert call.poll() is None and handle.cancels == []
    call.started = time.monotonic() - 101.0
    outcome = call.poll()
    assert outcome.past_deadline and not outcome.ok
    assert outcome.message == (
        "no output from Modal within the call's deadline of 100 s after its spawn "
        "(its timeout 60 s + start-up 30 s + margin 10 s, "
        "--modal-deadline-margin-seconds); the call is cancelled"
    )
    assert handle.cancels == [True] and call.cancelled
    call.set_deadline(startup_s=120, margin_s=900)
    assert call.deadline_s == 1080.0


# -- through the plugin ----------------------------------------------------------------

#: Four images in two shards (two group jobs of two images, one container each, run
#: one at a time there: one core). Each image's first run takes `sleep` seconds,
#: a second run (the retry's) none; each start is counted outside the containers
#: (``<counts>/<i>``), and each output holds a fresh random id, so that an output
#: brought home is known for the one made.
TWO_SHARDS = """
rule all:
    input: expand("img{i}.txt", i=range(4))

rule image:
    output: "img{i}.txt"
    group: "shard"
    shell:
        "echo ran >> {config[counts]}/{wildcards.i}; "
        "if [ $(wc -l < {config[counts]}/{wildcards.i}) -eq 1 ]; then "
        "sleep {config[sleep]}; fi; "
        "cat /proc/sys/kernel/random/uuid > {output}"
"""


def _counts(folder) -> dict[str, int]:
    """Image index -> how many times it started."""
    return {f.name: len(f.read_text().split()) for f in sorted(folder.iterdir())}


def _images(spec: dict) -> list[str]:
    """The image indexes of a job's spec (its outputs ``img<i>.txt``)."""
    return sorted(o[3] for o in spec["job_outputs"])


@pytest.mark.modal_server
@pytest.mark.timeout(300)
def test_a_container_lost_mid_shard_fails_its_job_only_and_the_retry_completes_it(
    modal_server, tmp_path
):
    """
    Two shards; once a first image is committed, the first shard's container is
    OOM-killed (``ContainerLoss``: ``GENERIC_STATUS_KERNEL_OOM_KILL``, which the
    client raises as ``RemoteError`` itself, as it does a stopped app's calls).
    Modal says the app runs on, so the plugin fails that job only: the other shard
    runs on and its files come home, Snakemake's ``--retries 1`` resubmits the lost
    shard, whose retry reuses what was committed and computes the rest, and the run
    ends 0 with no line of an ended app.
    """
    from snakemake_executor_plugin_modal.staging import default_prefix

    from .helpers import run_snakemake, spawned

    work, ran = tmp_path / "wf", tmp_path / "ran"
    ran.mkdir()
    prefix = default_prefix(work)
    loss = ContainerLoss(how="oom", volume="tests", when=(f"{prefix}/img*.txt",))
    modal_server.faults.loss = loss
    result = run_snakemake(
        work,
        TWO_SHARDS,
        "--group-components",
        "shard=2",
        "--modal-sync-seconds",
        "1",
        "--retries",
        "1",
        # the files stay on the volume once home, so that what each container
        # committed is compared with what came home (tests/test_volume_size.py:
        # by default they leave it)
        "--modal-keep-on-volume",
        "--config",
        f"counts={ran}",
        "sleep=12",
        timeout=240,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    state = modal_server.state
    (lost_task,) = loss.lost
    assert state.containers[lost_task].end_reason == "oom killed"
    calls = spawned(modal_server)
    assert len(calls) == 3, calls
    (lost,) = [c for c in calls if lost_task in c["task_ids"]]
    assert lost["status"] == "GENERIC_STATUS_KERNEL_OOM_KILL"
    assert not lost["cancelled"]  # its input had ended: nothing to cancel
    shard = _images(lost["args"][0])
    others = [c for c in calls if c is not lost]
    (retry,) = [c for c in others if _images(c["args"][0]) == shard]
    (other,) = [c for c in others if c is not retry]
    assert retry["status"] == other["status"] == "GENERIC_STATUS_SUCCESS"
    assert len(other["task_ids"]) == 1 and not other["cancelled"]
    assert sorted(shard + _images(other["args"][0])) == ["0", "1", "2", "3"]
    # the other shard ran on, once; the lost one's image killed mid-run ran again
    counts = _counts(ran)
    assert {i: counts[i] for i in _images(other["args"][0])} == dict.fromkeys(
        _images(other["args"][0]), 1
    )
    assert sorted(counts[i] for i in shard) in ([1, 2], [2, 2])
    # every image home, as its container committed it
    committed = state.root / "volumes" / "main" / "tests" / prefix
    for i in range(4):
        made = (work / f"img{i}.txt").read_text()
        assert made == (committed / f"img{i}.txt").read_text() and len(made) == 37
    # one line for the lost container, none of an ended app
    said = (
        f"its container was lost (RemoteError: container {lost_task}: oom killed "
        "(local Modal server's fault)): Modal ended the call without a cancel from "
        "this run while the run's app runs on"
    )
    assert said in text
    assert "has ended" not in text and "ended with the run's app" not in text
    assert len(state.calls_of("AppGetInfo")) == 1  # asked once, for that call


#: One quick job.
QUICK = """
rule all:
    input: "out.txt"

rule quick:
    output: "out.txt"
    shell: "echo done > {output}"
"""


@pytest.mark.modal_server
@pytest.mark.timeout(240)
def test_a_call_never_answered_fails_by_its_deadline_and_is_retried(
    modal_server, tmp_path
):
    """
    The server never answers the first call (``Unanswered``: its container runs
    and ends, its output never comes): the plugin cancels it at its deadline, its
    timeout (20 s) + start-up bound (20 s) + margin (5 s) after its spawn, within
    the status checks' interval (2 s here) and a loaded machine's slack; its job
    fails with one line naming the three, and ``--retries 1`` completes it.
    """
    from .helpers import run_snakemake, spawned

    unanswered = Unanswered(times=1)
    modal_server.faults.unanswered = unanswered
    result = run_snakemake(
        tmp_path,
        QUICK,
        "--modal-timeout",
        "20",
        "--modal-startup-seconds",
        "20",
        "--modal-deadline-margin-seconds",
        "5",
        "--retries",
        "1",
        timeout=200,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    first, retry = spawned(modal_server)
    assert unanswered.call_ids == [first["call_id"]]
    assert first["timeout"] == retry["timeout"] == 20
    assert first["startup_timeout"] == 20
    assert first["cancelled"] and not retry["cancelled"]
    assert retry["status"] == "GENERIC_STATUS_SUCCESS"
    state = modal_server.state
    (spawn, _) = state.calls_of("FunctionMap")
    (cancel,) = state.calls_of("FunctionCallCancel")
    assert cancel.requests[0].function_call_id == first["call_id"]
    assert 45.0 <= cancel.at - spawn.at < 45.0 + 2.0 + 10.0
    assert (
        f"Modal call {first['call_id']}: no output from Modal within the call's "
        "deadline of 45 s after its spawn (its timeout 20 s + start-up 20 s + "
        "margin 5 s, --modal-deadline-margin-seconds); the call is cancelled"
    ) in text
    assert (tmp_path / "out.txt").read_text() == "done\n"


@pytest.mark.modal_server
@pytest.mark.timeout(300)
def test_an_app_stopped_with_modal_app_stop_ends_the_run_in_one_line(
    modal_server, tmp_path
):
    """
    ``modal app stop <app id> --yes`` mid-shard: the shard's call raises
    ``RemoteError`` itself, as a lost container's does, but Modal says the app is
    stopped, so the run ends: one line names the app and why, the shard fails at
    once and brings its committed image home, and nothing is retried or spawned
    into the stopped app.
    """
    import os
    import subprocess
    import sys

    from .helpers import spawned
    from .test_lifetime import _run_apps, _start_mid_shard

    proc, work, ran, gate, args, name, made = _start_mid_shard(modal_server, tmp_path)
    (app_id,) = _run_apps(modal_server)
    stop = subprocess.run(
        [sys.executable, "-m", "modal", "app", "stop", app_id, "--yes"],
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stop.returncode == 0, stop.stderr[-2000:]
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    app = modal_server.state.apps[app_id]
    assert (app.state_name, app.stop_reason) == ("APP_STATE_STOPPED", "stop")
    named = [x for x in out.splitlines() if f"the run's app {app_id} has ended" in x]
    assert len(named) == 1, out[-4000:]
    assert (
        "Modal ended the call without a cancel from this run (RemoteError: the "
        in (named[0])
    )
    assert "the app was stopped (`modal app stop`, Modal's dashboard)" in named[0]
    assert "its container was lost" not in out
    assert modal_server.state.calls_of("AppGetInfo")  # Modal was asked
    assert "1 output(s) its container finished are brought home" in out
    assert (work / name).read_text() == made
    assert len(spawned(modal_server)) == 1  # nothing spawned into the stopped app
