"""Failure paths: a failing command, preemption, a timeout, Ctrl-C, the cost guard."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from snakemake_executor_plugin_modal.container import PART
from snakemake_executor_plugin_modal.staging import default_prefix

from .helpers import COPY, run_snakemake, spawned

SLOW = """
rule all:
    input: "out.txt"

rule slow:
    output: "out.txt"
    log: "slow.log"
    resources: gpu=1
    shell: "echo started > {log}; sleep {config[sleep]}; echo done > {output}"
"""


def calls(server):
    """The calls the local Modal server was asked to run (the ``modal_server``
    fixture's; ``helpers.spawned``)."""
    return spawned(server)


def cancels(server) -> list[str]:
    """The call ids whose ``FunctionCall.cancel`` the local Modal server took (a
    cancel failed by a fault is left out)."""
    return [
        c.requests[0].function_call_id
        for c in server.state.calls_of("FunctionCallCancel")
        if c.status == "OK"
    ]


def secret_keys(server, call_id: str) -> list[str]:
    """The environment variables the call's container got as Modal secrets."""
    state = server.state
    with state.lock:
        function = state.functions[state.function_calls[call_id].function_id]
        return sorted(
            k for s in function.definition.secret_ids for k in state.secrets[s]
        )


def stdout_of(server, call_id: str) -> str:
    """What the call's containers wrote to their output (Modal's logs)."""
    state = server.state
    return "".join(
        (state.containers[t].folder / "stdout.log").read_text(errors="replace")
        for t in state.function_calls[call_id].task_ids
    )


def test_failing_command_reports_log_tail_and_keeps_no_output(modal_server, tmp_path):
    snakefile = """
rule all:
    input: "out.txt"

rule fail:
    output: "out.txt"
    log: "fail.log"
    shell: "echo partial > {output}; echo 'the model diverged' > {log}; exit 3"
"""
    result = run_snakemake(tmp_path, snakefile)
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert (
        "exited with status 1" in text
    )  # Snakemake's own exit status in the container
    assert "the model diverged" in (tmp_path / "fail.log").read_text()  # log fetched
    assert not (tmp_path / "out.txt").exists()
    assert len(calls(modal_server)) == 1


SHARD = """
rule all:
    input: expand("img{i}.txt", i=range(2))

rule image:
    output: "img{i}.txt"
    group: "shard"
    params: setting=config.get("setting", 1)
    shell:
        "echo ran >> {config[counts]}/{wildcards.i}; "
        "sleep $(({wildcards.i}*{config[tt]})); "
        "test {wildcards.i} != {config[fail]}; echo {params.setting} > {output}"
"""

GROUP = ["--group-components", "shard=2"]  # both images in one container

# The shard for the preemption test, its order fixed whatever order the container's
# Snakemake runs a group's independent jobs in (it follows string hashes, which differ
# from one run and one temporary folder to the next): the image that starts first
# (it takes the folder `first` atomically) ends in a second; the other waits until the
# container is preempted (300 s, far past the preemption); a restarted image (its
# second start) ends at once. No race with the volume's commits: the CI run of
# 2026-12-02 saw both images of the earlier timed version committed before the
# preemption on a loaded machine.
PREEMPTED_SHARD = """
rule all:
    input: expand("img{i}.txt", i=range(2))

rule image:
    output: "img{i}.txt"
    group: "shard"
    shell:
        "echo ran >> {config[counts]}/{wildcards.i}; "
        "if [ $(wc -l < {config[counts]}/{wildcards.i}) -gt 1 ]; then :; "
        "elif mkdir {config[first]} 2>/dev/null; then "
        "echo {wildcards.i} > {config[first]}/image; sleep 1; "
        "else sleep 300; fi; "
        "echo 1 > {output}"
"""


def counts(folder):
    """How many times each image's command started (files written outside the
    container's scratch folder, so they survive a lost container)."""
    return {f.name: len(f.read_text().split()) for f in sorted(folder.iterdir())}


def test_preempted_input_is_restarted_and_reuses_committed_files(
    modal_server, tmp_path
):
    """Modal restarts a preempted input (same call) in a new container: the image
    finished and committed before the preemption is not computed again, and no
    partial file reaches the volume or the working directory. The server preempts
    as Modal does (``Preemption``: an interrupt, ``SIGINT``, once the image and its
    reuse record are committed; the container's client sends no output and commits
    at its exit; the input restarts once the container is gone)."""
    from .modal_server import Preemption

    ran = tmp_path / "ran"
    ran.mkdir()
    work = tmp_path / "wf"
    prefix = default_prefix(work)
    preemption = Preemption(
        volume="tests",
        when=(f"{prefix}/img*.txt", f"{prefix}/.snakemake/modal/done/img*.txt@*"),
        grace_s=10.0,  # the kill, should the interrupt not end the container
    )
    modal_server.faults.preemption = preemption
    config = [f"counts={ran}", f"first={tmp_path / 'first'}"]
    result = run_snakemake(
        work,
        PREEMPTED_SHARD,
        *GROUP,
        "--modal-sync-seconds",
        "1",
        "--config",
        *config,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(preemption.preempted) == 1, "the server did not preempt"
    (call,) = calls(modal_server)  # one call, its input restarted by Modal
    assert len(call["task_ids"]) == 2
    assert call["task_ids"][0] == preemption.preempted[0]
    assert call["status"] == "GENERIC_STATUS_SUCCESS"
    # the image the first container ran first was committed before the preemption,
    # the other was not: computed again in the second container, the first not
    first = (tmp_path / "first" / "image").read_text().strip()
    other = "1" if first == "0" else "0"
    assert counts(ran) == {first: 1, other: 2}
    assert (work / "img0.txt").read_text() == (work / "img1.txt").read_text() == "1\n"
    assert not list(work.rglob("*.modal-part"))
    volume = modal_server.state.volume("tests").folder
    # home and verified, the images left the volume (`VolumeStager.prune`)
    assert [f.read_text() for f in sorted(volume.rglob("img*.txt"))] == []
    assert not [f for f in volume.rglob("*") if PART in f.name]


def test_a_failing_image_spares_the_others_and_a_rerun_reuses_them(
    modal_server, tmp_path
):
    ran = tmp_path / "ran"
    ran.mkdir()
    work = tmp_path / "wf"
    base = [*GROUP, "--config", f"counts={ran}", "tt=1"]
    first = run_snakemake(work, SHARD, *base, "fail=0")
    assert first.returncode != 0
    assert counts(ran) == {"0": 1, "1": 1}  # keep-going inside the shard
    second = run_snakemake(work, SHARD, *base, "fail=-1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert counts(ran) == {"0": 2, "1": 1}  # img1 was committed: reused
    assert (work / "img1.txt").read_text() == "1\n"
    # other settings: a file made with the old ones is never taken
    third = run_snakemake(work, SHARD, *base, "fail=-1", "setting=2")
    assert third.returncode == 0, third.stderr[-3000:]
    assert counts(ran) == {"0": 3, "1": 2}
    assert (work / "img0.txt").read_text() == "2\n"


def test_transport_errors_while_polling_do_not_kill_the_job(modal_server, tmp_path):
    """
    ``FunctionGetOutputs`` unavailable: the client retries it 3 times itself
    (modal/_utils/grpc_utils.py), so each ``get`` that fails here took 4 failed
    calls and raises ``ServiceError`` (the fake raised ``ConnectionError``); 3 of
    them are taken as "status not readable" and the job finishes.
    """
    fault = modal_server.faults.fail_rpc("FunctionGetOutputs", times=12)
    result = run_snakemake(
        tmp_path,
        SLOW,
        "--envvars",
        "RUN_LABEL",
        "--config",
        "sleep=0",
        env={"RUN_LABEL": "label-xyz"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "status not readable (ServiceError: FunctionGetOutputs: UNAVAILABLE" in text
    assert text.count("status not readable (ServiceError") == 3
    assert fault.failed == 12
    assert len(calls(modal_server)) == 1
    # --envvars: a Modal secret of the container, not an argument of the call
    call = calls(modal_server)[0]
    assert secret_keys(modal_server, call["call_id"]) == ["RUN_LABEL"]
    assert "label-xyz" not in json.dumps(call["args"])
    assert (tmp_path / "out.txt").read_text() == "done\n"


def test_a_failed_submission_is_that_jobs_error_and_is_retried(modal_server, tmp_path):
    """``FunctionMap`` unavailable past the client's own 3 retries: ``spawn`` raises
    ``ServiceError`` (the fake raised ``ConnectionError``), that job's error; its
    retry is submitted."""
    modal_server.faults.fail_rpc("FunctionMap", times=4)
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0", "--retries", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert (
        "not submitted: ServiceError: FunctionMap: UNAVAILABLE (fault injected by "
        "the test)" in text
    )
    assert len(calls(modal_server)) == 1  # the retry's
    assert (tmp_path / "out.txt").read_text() == "done\n"


def test_an_image_build_failure_stops_the_run_before_any_job(modal_server, tmp_path):
    from .modal_server import BuildFault

    modal_server.faults.build = BuildFault(
        log="ERROR: No matching distribution for torch"
    )
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0")
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "ERROR: No matching distribution for torch" in text  # build output shown
    assert "the container image could not be built" in text
    assert "modal image logs im-" in text
    assert calls(modal_server) == []


def test_timeout_stops_the_container_and_its_log_comes_back(modal_server, tmp_path):
    started = time.monotonic()
    result = run_snakemake(
        tmp_path,
        SLOW,
        "--config",
        "sleep=60",
        "--modal-timeout",
        "20",  # s: the container's Snakemake takes ~8 s to print its first line here
        "--modal-sync-seconds",
        "1",
    )
    assert time.monotonic() - started < 55
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "ran past its timeout of 20 s" in text
    assert calls(modal_server)[0]["timeout"] == 20
    # the container's log, synced while it ran: its tail printed, the whole kept
    log = tmp_path / ".snakemake" / "modal" / "snakejob.slow.1.sh.log"
    assert f"whole log: {log}" in text
    assert "Building DAG of jobs" in log.read_text()
    # and streamed to the container's output (Modal's logs)
    call_id = calls(modal_server)[0]["call_id"]
    assert "Building DAG of jobs" in stdout_of(modal_server, call_id)


def test_runtime_resource_sets_the_timeout(modal_server, tmp_path):
    snakefile = SLOW.replace("resources: gpu=1", "resources: gpu=1, runtime=2")
    result = run_snakemake(tmp_path, snakefile, "--config", "sleep=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls(modal_server)[0]["timeout"] == 120


def test_ctrl_c_cancels_running_containers(modal_server, tmp_path):
    proc = run_snakemake(
        tmp_path,
        SLOW,
        "--config",
        "sleep=97",
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )
    deadline = time.monotonic() + 60
    while not _sleeping("sleep 97") and time.monotonic() < deadline:
        time.sleep(0.5)
    if not _sleeping("sleep 97"):
        proc.kill()
        pytest.fail(f"the container never started: {proc.communicate()[0][-3000:]}")
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # no Snakemake left behind the failed test
        proc.kill()
        raise
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while _sleeping("sleep 97") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _sleeping("sleep 97"), "a container outlived Ctrl-C"
    assert len(calls(modal_server)) == 1
    # stopped by the plugin's cancel, not only by the app's stop (each cancel that
    # reaches the server is recorded)
    assert cancels(modal_server) == [calls(modal_server)[0]["call_id"]]
    assert not (tmp_path / "out.txt").exists()


def _sleeping(pattern: str) -> bool:
    """Whether a process whose command line contains `pattern` is alive."""
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True)
    return any(
        pattern in line and not line.lstrip().startswith("Z")
        for line in out.stdout.splitlines()
        if "ps -eo" not in line
    )


def test_cost_guard_refuses_a_job_over_budget(modal_server, tmp_path):
    # 10 minutes of one T4 cost 0.0984 USD, more with its start-up: over 0.05 USD
    snakefile = SLOW.replace(
        "resources: gpu=1", "resources: gpu=1, runtime=10, mem_mb=1024"
    )
    result = run_snakemake(
        tmp_path, snakefile, "--config", "sleep=0", "--modal-max-cost-usd", "0.05"
    )
    assert result.returncode != 0
    text = result.stdout + result.stderr
    # worst case: (0.000164 + 0.0000131 + 0.00000222) USD/s (T4, 1 core, 1 GiB)
    # x (600 s + 120 s of start-up) = 0.1291104 USD
    assert "--modal-max-cost-usd 0.05" in text and "= 0.13 USD" in text
    assert calls(modal_server) == []


def test_cost_is_reported_at_the_end(modal_server, tmp_path):
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0")
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "Modal: 1 container(s)" in text and "USD spent" in text
    call = calls(modal_server)[0]
    assert call["gpus"] == ["T4:1"]
    # the plugin's mount path, below the test's folder (SNAKEMAKE_MODAL_TEST_MOUNT)
    assert call["volumes"] == {str(modal_server.mount): "tests"}


def test_missing_credentials_stop_the_run_with_one_message(modal_server, tmp_path):
    result = run_snakemake(
        tmp_path,
        SLOW,
        "--config",
        "sleep=0",
        env={"MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": ""},
    )
    assert result.returncode != 0
    assert "no Modal credentials: run `modal token new`" in result.stderr
    assert calls(modal_server) == []


def test_an_input_a_container_cannot_see_is_refused_before_any_job(
    modal_server, tmp_path
):
    (tmp_path / "outside.txt").write_text("x")
    snakefile = """
rule all:
    input: "out.txt"

rule copy:
    input: "../outside.txt"
    output: "out.txt"
    shell: "cp {input} {output}"
"""
    result = run_snakemake(tmp_path / "wf", snakefile)
    assert result.returncode != 0
    assert "job copy: ../outside.txt is outside the working directory" in result.stderr
    assert calls(modal_server) == []


def test_a_jobs_modal_gpu_and_budget_resources_win(modal_server, tmp_path):
    """A workflow hands each job its GPU (a fallback list too) and budget as
    resources (what its dry run reads); --modal-gpu T4 serves the other jobs."""
    snakefile = """
rule all:
    input: "a.txt", "b.txt", "c.txt"

rule on_h100:
    output: "a.txt"
    resources: gpu=1, modal_gpu="H100", modal_max_cost_usd="50"
    shell: "echo a > {output}"

rule with_fallback:
    output: "b.txt"
    resources: modal_gpu="A100-80GB,H100"
    shell: "echo b > {output}"

rule default_gpu:
    output: "c.txt"
    resources: gpu=1
    shell: "echo c > {output}"
"""
    result = run_snakemake(tmp_path, snakefile)
    assert result.returncode == 0, result.stderr[-3000:]
    by_rule = {c["args"][0]["members"][0]["outputs"][0]: c for c in calls(modal_server)}
    assert by_rule["a.txt"]["gpus"] == ["H100:1"]
    # its own function, the list as FunctionCreate carried it
    assert by_rule["b.txt"]["gpus"] == ["A100-80GB:1", "H100:1"]
    assert by_rule["b.txt"]["function"] == "run_job_gpu1"
    assert by_rule["c.txt"]["gpus"] == ["T4:1"]
    # a budget resource below what the job would cost refuses it, naming it
    over = snakefile.replace('modal_max_cost_usd="50"', 'modal_max_cost_usd="0.05"')
    over = over.replace("gpu=1, modal_gpu", "gpu=1, runtime=10, modal_gpu")
    (tmp_path / "a.txt").unlink()
    result = run_snakemake(tmp_path, over)
    assert result.returncode != 0
    assert "resource modal_max_cost_usd=0.05: 0.00 USD spent" in result.stderr


@pytest.mark.parametrize(
    ("status", "raised"),
    [
        # Modal's ConflictError, which Volume.commit raises as Python's RuntimeError
        # (modal/volume.py): the real client's, where the fake raised TimeoutError
        ("FAILED_PRECONDITION", "RuntimeError"),
        # a class the plugin takes for "status not readable" when the client's own
        # get raises it: raised in the container, it is the job's failure (the
        # fake's Modal ConnectionError; the real client retries UNAVAILABLE and
        # DEADLINE_EXCEEDED 90 times, about 90 s, before raising ServiceError)
        ("RESOURCE_EXHAUSTED", "ResourceExhaustedError"),
    ],
)
def test_an_error_raised_in_the_container_is_the_jobs_failure(
    modal_server, tmp_path, status, raised
):
    """Modal raises a container's exception again here with its own class: whatever
    the class, it is the job's failure, shown with its log's tail at once, never
    taken for "still running" or "Modal could not be reached". Every
    ``Volume.commit()`` of the container after its first (outputs and the log)
    fails (``CommitFault``): the last commit, tried 5 times, raises."""
    from .modal_server import CommitFault

    modal_server.faults.commit = CommitFault(mode="always", status=status, after=1)
    started = time.monotonic()
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0", timeout=120)
    assert time.monotonic() - started < 100
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        f"the container raised {raised}: commit of volume 'tests' failed (fault set "
        "by the test)" in text
    )
    assert modal_server.faults.commit.failed >= 5  # the last commit, tried 5 times
    assert "status not readable" not in text and "could not be reached" not in text
    assert "last lines of its log (whole log:" in text
    assert "Building DAG of jobs" in text  # the container's log tail


@pytest.mark.parametrize(
    ("after", "what"),
    [
        (0, "the last sync of finished outputs"),
        (1, "the last commit of the job's files"),
    ],
)
def test_a_final_commit_refused_once_still_lets_the_job_succeed(
    modal_server, tmp_path, after, what
):
    """The container's last sync (its outputs) or its last commit (logs and
    results) is refused once (``ConflictError``, raised as ``RuntimeError``): said
    in one line of the container's output, tried again, and the job succeeds with
    its output home (issue 47: one refused final commit failed a job whose command
    succeeded)."""
    from .modal_server import CommitFault

    fault = modal_server.faults.commit = CommitFault(mode="once", after=after)
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert fault.failed == 1
    assert (tmp_path / "out.txt").read_text() == "done\n"
    assert (tmp_path / "slow.log").read_text() == "started\n"
    (call,) = spawned(modal_server)
    said = stdout_of(modal_server, call["call_id"]).splitlines()
    lines = [x for x in said if x.startswith(f"modal: {what} failed")]
    assert len(lines) == 1, said[-40:]
    assert "(RuntimeError: " in lines[0] and "trying again in 1 s" in lines[0]


def test_a_failed_upload_is_sent_again_by_the_retry(modal_server, tmp_path):
    """The first batch upload fails at its end (``VolumePutFiles`` past the
    client's own 3 retries: ``ServiceError``, none of its files put; the fake
    raised ``ConnectionError``): that job's error, and its retry in the same run
    sends the files again (the container finds its input)."""
    fault = modal_server.faults.fail_rpc("VolumePutFiles", "DEADLINE_EXCEEDED", times=4)
    (tmp_path / "in.txt").write_text("staged\n")
    result = run_snakemake(tmp_path, COPY, "--retries", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "not submitted: ServiceError: VolumePutFiles: DEADLINE_EXCEEDED"
        in result.stderr
    )
    assert fault.failed == 4
    assert (tmp_path / "out.txt").read_text() == "staged\n"


def test_container_output_goes_to_the_jobs_log_not_the_terminal(modal_server, tmp_path):
    """The image build's output is shown here; the containers' output is not streamed
    to this terminal (modal.enable_output() around app.run() would, for the app's
    whole life): it is in the job's log file, and in Modal's logs (the dashboard)."""
    snakefile = SLOW.replace(
        "echo started > {log};", "echo started > {log}; echo container-says-hello;"
    )
    result = run_snakemake(tmp_path, snakefile, "--config", "sleep=0")
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "local Modal server: image im-" in text  # the build's output, shown
    assert "container-says-hello" not in text
    assert "Initialized. View run at" not in text  # no app log stream started
    log = tmp_path / ".snakemake" / "modal" / "snakejob.slow.1.sh.log"
    assert "container-says-hello" in log.read_text()
    call_id = calls(modal_server)[0]["call_id"]
    assert "container-says-hello" in stdout_of(modal_server, call_id)


@pytest.mark.parametrize(
    ("env", "build", "named"),
    [
        # the server refuses the token: AuthError at the first request
        ({"MODAL_TOKEN_SECRET": "as-revoked"}, None, "Modal refused the credentials"),
        ({}, "E: no torch", "image could not be built"),
    ],
)
def test_errors_at_app_start_are_named_for_what_they_are(
    modal_server, tmp_path, env, build, named
):
    from .modal_server import BuildFault

    if build:
        modal_server.faults.build = BuildFault(log=build)
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0", env=env)
    assert result.returncode != 0
    assert named in result.stderr and "nothing was submitted" in result.stderr
    if env:
        assert "image could not be built" not in result.stderr
        assert "modal token new" in result.stderr
    assert calls(modal_server) == []


def test_the_jobs_own_python_finds_the_local_packages(modal_server, tmp_path):
    """A local package copied into the image (--modal-local-packages) is importable
    by the job's own Python, which runs from a scratch folder, not from where Modal
    mounts the package."""
    pkgs = tmp_path / "pkgs"
    (pkgs / "mglocalpkg").mkdir(parents=True)
    (pkgs / "mglocalpkg" / "__init__.py").write_text("VALUE = 'from-the-image'\n")
    snakefile = """
rule all:
    input: "out.txt"

rule imp:
    output: "out.txt"
    shell: "python -c 'import mglocalpkg; print(mglocalpkg.VALUE)' > {output}"
"""
    result = run_snakemake(
        tmp_path / "wf",
        snakefile,
        "--modal-local-packages",
        "mglocalpkg",
        env={"PYTHONPATH": str(pkgs)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "wf" / "out.txt").read_text() == "from-the-image\n"


def test_what_a_run_would_refuse_is_refused_before_the_image_is_built(
    modal_server, tmp_path
):
    """An unknown GPU type (of --modal-gpu, or of a job's resource: Modal's server
    would reject it only after the build), a job over its budget and an input outside
    the working directory: all said at once, before any image is built."""
    (tmp_path / "outside.txt").write_text("x")
    snakefile = """
rule all:
    input: "a.txt", "b.txt", "c.txt"

rule on_new_gpu:
    output: "a.txt"
    resources: modal_gpu="B300"
    shell: "echo a > {output}"

rule over_budget:
    output: "b.txt"
    resources: gpu=1, runtime=600, modal_gpu="H100", modal_max_cost_usd="1"
    shell: "echo b > {output}"

rule copy:
    input: "../outside.txt"
    output: "c.txt"
    shell: "cp {input} {output}"
"""
    result = run_snakemake(tmp_path / "wf", snakefile)
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "the run would be refused, nothing was built or submitted" in text
    assert "job on_new_gpu: GPU = 'B300': GPU type 'B300' is not one" in text
    assert "allowed: A10, A100" in text
    assert "job over_budget: resource modal_max_cost_usd=1:" in text
    assert "job copy: ../outside.txt is outside the working directory" in text
    bad_default = run_snakemake(tmp_path / "wf2", SLOW, "--modal-gpu", "X9000")
    assert "--modal-gpu = 'X9000': GPU type 'X9000' is not one" in bad_default.stderr
    # no image was asked for, no app started
    assert modal_server.state.calls_of("ImageGetOrCreate") == []
    assert modal_server.state.calls_of("AppCreate") == []
    assert calls(modal_server) == []
