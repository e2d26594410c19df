"""Failure paths: a failing command, preemption, a timeout, Ctrl-C, the cost guard."""

from __future__ import annotations

import signal
import subprocess
import time

from .helpers import run_snakemake

SLOW = """
rule all:
    input: "out.txt"

rule slow:
    output: "out.txt"
    log: "slow.log"
    resources: gpu=1
    shell: "echo started > {log}; sleep {config[sleep]}; echo done > {output}"
"""


def calls(fake_modal):
    return fake_modal.fake_calls()


def test_failing_command_reports_log_tail_and_keeps_no_output(fake_modal, tmp_path):
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
    assert len(calls(fake_modal)) == 1


def test_preempted_container_is_retried_without_partial_file(fake_modal, tmp_path):
    once = tmp_path / "preempted-once"
    env = {"FAKE_MODAL_PREEMPT_AFTER_S": "4", "FAKE_MODAL_PREEMPT_ONCE_FILE": str(once)}
    work = tmp_path / "wf"
    result = run_snakemake(work, SLOW, "--config", "sleep=8", "--retries", "1", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert once.exists(), "the fake did not preempt"
    assert len(calls(fake_modal)) == 2  # the preempted call and its retry
    assert (work / "out.txt").read_text() == "done\n"
    assert "preempt" in (result.stdout + result.stderr).lower()
    assert not list(work.rglob("*.modal-part"))


def test_preempted_container_leaves_nothing_on_the_volume(fake_modal, tmp_path):
    once = tmp_path / "preempted-once"
    env = {"FAKE_MODAL_PREEMPT_AFTER_S": "3", "FAKE_MODAL_PREEMPT_ONCE_FILE": str(once)}
    work = tmp_path / "wf"
    result = run_snakemake(
        work, SLOW, "--config", "sleep=8", "--modal-sync-seconds", "1", env=env
    )
    assert result.returncode != 0
    volume = fake_modal_volume(tmp_path)
    assert not list(volume.rglob("out.txt"))
    assert not (work / "out.txt").exists()


def fake_modal_volume(tmp_path):
    return tmp_path / "fake-modal" / "volumes" / "tests"


def test_timeout_stops_the_container(fake_modal, tmp_path):
    started = time.monotonic()
    result = run_snakemake(
        tmp_path, SLOW, "--config", "sleep=60", "--modal-timeout", "3"
    )
    assert time.monotonic() - started < 45
    assert result.returncode != 0
    assert "ran past its timeout of 3 s" in result.stdout + result.stderr
    assert calls(fake_modal)[0]["timeout"] == 3


def test_runtime_resource_sets_the_timeout(fake_modal, tmp_path):
    snakefile = SLOW.replace("resources: gpu=1", "resources: gpu=1, runtime=2")
    result = run_snakemake(tmp_path, snakefile, "--config", "sleep=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls(fake_modal)[0]["timeout"] == 120


def test_ctrl_c_cancels_running_containers(fake_modal, tmp_path):
    proc = run_snakemake(
        tmp_path,
        SLOW,
        "--config",
        "sleep=97",
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )
    calls_file = tmp_path / "fake-modal" / "calls.jsonl"
    deadline = time.monotonic() + 60
    while not _sleeping("sleep 97") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _sleeping("sleep 97"), "the container never started"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while _sleeping("sleep 97") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _sleeping("sleep 97"), "a container outlived Ctrl-C"
    assert len(calls_file.read_text().splitlines()) == 1
    assert not (tmp_path / "out.txt").exists()


def _sleeping(pattern: str) -> bool:
    """Whether a process whose command line contains `pattern` is alive."""
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True)
    return any(
        pattern in line and not line.lstrip().startswith("Z")
        for line in out.stdout.splitlines()
        if "ps -eo" not in line
    )


def test_cost_guard_refuses_a_job_over_budget(fake_modal, tmp_path):
    # 10 minutes of one T4 cost 0.0984 USD: over a 0.05 USD budget before it starts
    snakefile = SLOW.replace("resources: gpu=1", "resources: gpu=1, runtime=10")
    result = run_snakemake(
        tmp_path, snakefile, "--config", "sleep=0", "--modal-max-cost-usd", "0.05"
    )
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "--modal-max-cost-usd 0.05" in text and "0.10 USD" in text
    assert calls(fake_modal) == []


def test_cost_is_reported_at_the_end(fake_modal, tmp_path):
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=0")
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "Modal: 1 container(s)" in text and "USD spent" in text
    call = calls(fake_modal)[0]
    assert call["gpu"] == "T4"
    assert call["volumes"] == {"/snakemake-volume": "tests"}


def test_missing_credentials_stop_the_run_with_one_message(fake_modal, tmp_path):
    result = run_snakemake(
        tmp_path, SLOW, "--config", "sleep=0", env={"FAKE_MODAL_NO_TOKEN": "1"}
    )
    assert result.returncode != 0
    assert "no Modal credentials: run `modal token new`" in result.stderr
    assert calls(fake_modal) == []
