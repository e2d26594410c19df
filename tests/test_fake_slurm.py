"""
The fake SLURM commands (tests/fake_slurm) behave as SLURM does where the plugin
relies on it: sbatch's output and refusals, the states sacct and squeue report, a time
limit, scancel, srun only inside an allocation.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from test_slurm import slurm_env


@pytest.fixture
def cluster(tmp_path):
    env = slurm_env(tmp_path)

    def run(*argv, stdin=None):
        return subprocess.run(
            list(argv),
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    return run, tmp_path


def wait_state(run, job_id, states, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = run(
            "sacct",
            "-X",
            "--parsable2",
            "--noheader",
            "-j",
            job_id,
            "--format=JobIdRaw,State",
        ).stdout.strip()
        if out and out.split("|")[1].split()[0] in states:
            return out
        time.sleep(0.2)
    pytest.fail(f"job {job_id} not in {states}: {out!r}")


def test_a_job_runs_and_completes(cluster):
    run, tmp = cluster
    sub = run(
        "sbatch",
        "--parsable",
        "--job-name",
        "run1",
        "-A",
        "lab",
        "-p",
        "gpu",
        "-D",
        str(tmp),
        "--output",
        str(tmp / "%j.log"),
        "--wrap=echo hello $SLURM_JOB_ID",
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert job_id.isdigit()
    assert wait_state(run, job_id, {"COMPLETED"}) == f"{job_id}|COMPLETED"
    assert (tmp / f"{job_id}.log").read_text() == f"hello {job_id}\n"
    squeue = run(
        "squeue", "--format=%i|%T", "--states=all", "--noheader", "--name", "run1"
    )
    assert squeue.stdout == f"{job_id}|COMPLETED\n"
    plain = run("sbatch", "-D", str(tmp), "--wrap=true")
    assert plain.stdout.startswith("Submitted batch job ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus", "--wrap=true"], "sbatch: unrecognized option '--bogus'"),
        (["-p", "nope", "--wrap=true"], "Invalid partition name specified"),
        (["-A", "other", "--wrap=true"], "Invalid account"),
        (["--wrap=true", "script.sh"], "script arguments not permitted with --wrap"),
    ],
)
def test_sbatch_refuses_as_slurm_does(cluster, args, message):
    run, _ = cluster
    result = run("sbatch", "--parsable", *args)
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stdout == ""


def test_time_limit_scancel_and_srun(cluster):
    run, tmp = cluster
    slow = run("sbatch", "--parsable", "-t", "0:01", "-D", str(tmp), "--wrap=sleep 30")
    assert wait_state(run, slow.stdout.strip(), {"TIMEOUT"}, timeout=30)
    job = run("sbatch", "--parsable", "-D", str(tmp), "--wrap=sleep 30").stdout.strip()
    wait_state(run, job, {"RUNNING"})
    assert run("scancel", job).returncode == 0
    assert wait_state(run, job, {"CANCELLED"}).startswith(f"{job}|CANCELLED by ")
    unknown = run("scancel", "999999")
    assert unknown.returncode == 1 and "Invalid job id specified" in unknown.stderr
    outside = run("srun", "-n1", "true")
    assert outside.returncode == 1 and outside.stderr.startswith("srun: error:")
