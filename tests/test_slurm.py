"""
The workflow on a SLURM cluster through the real ``snakemake-executor-plugin-slurm``
and ``profiles/slurm``, against fake SLURM commands on PATH (tests/fake_slurm: batch
jobs run on this machine, their states reported as sbatch, squeue, sacct and scancel
report them): the reduced demo's per-image jobs, 2 shards of 4 images.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CONFIGURATIONS, REPO, TINY_CONFIG

from multigeom_workflow.planning.plan import slurm_lines, slurm_runtime_minutes

FAKE_BIN = REPO / "tests" / "fake_slurm" / "bin"
TENSORS = ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues", "J_eigenvectors")


def user_profile(dest: Path) -> Path:
    """profiles/slurm as a user edits it: the values marked SET filled in."""
    dest.mkdir(parents=True)
    text = (REPO / "profiles" / "slurm" / "profile.yaml").read_text()
    marked = [line for line in text.splitlines() if "# SET" in line]
    assert any("slurm_account=" in line for line in marked)
    assert any("slurm_partition=" in line for line in marked)
    text = text.replace("slurm_account=SET-your-account", "slurm_account=lab")
    text = text.replace("slurm_partition=SET-your-gpu-partition", "slurm_partition=gpu")
    assert "SET-" not in text
    (dest / "profile.yaml").write_text(text)
    return dest


def slurm_env(root: Path) -> dict:
    state = root / "cluster"
    state.mkdir()
    return {
        **os.environ,
        "PATH": os.pathsep.join(
            [str(FAKE_BIN), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
        "FAKE_SLURM_DIR": str(state),
        "FAKE_SLURM_ACCOUNTS": "lab",
        "FAKE_SLURM_PYTHON": sys.executable,
        "FAKE_SLURM_KILL_WAIT": "2",
    }


def workdir_with_assets(tiny_run: Path, dest: Path) -> Path:
    """The reduced demo's assets (models, test images), no per-image file yet."""
    shutil.copytree(tiny_run / "runs", dest / "runs", symlinks=True)
    shutil.rmtree(dest / "runs" / "per_image")
    shutil.rmtree(dest / "runs" / "metrics", ignore_errors=True)
    return dest


def slurm_command(work: Path, profile: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(work), "--profile", str(profile)]
    cmd += ["--configfile", str(TINY_CONFIG), "--cores", "1", "--jobs", "2"]
    cmd += ["--slurm-init-seconds-before-status-checks", "1"]
    cmd += ["--seconds-between-status-checks", "1", "--latency-wait", "5"]
    return [*cmd, *extra]


def jobs(env: dict) -> list[dict]:
    folder = Path(env["FAKE_SLURM_DIR"], "jobs")
    return [json.loads(p.read_text()) for p in sorted(folder.glob("[0-9]*.json"))]


@pytest.fixture(scope="module")
def slurm_run(tiny_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    work = workdir_with_assets(tiny_run, root / "work")
    profile = user_profile(root / "profile")
    env = slurm_env(root)
    dry = subprocess.run(
        slurm_command(work, profile, "-n"), env=env, capture_output=True, text=True
    )
    result = subprocess.run(
        slurm_command(work, profile), env=env, capture_output=True, text=True
    )
    return work, env, dry, result


def test_slurm_profile_runs_the_demo(slurm_run, tiny_run):
    work, _, _, result = slurm_run
    assert result.returncode == 0, result.stderr[-5000:]
    assert (work / "results" / "fig4de.png").exists()
    for enc, area in CONFIGURATIONS:
        for i in range(2):
            rel = Path("runs", "per_image", enc, area, f"img{i:04d}.pt")
            slurm = torch.load(work / rel, weights_only=False)
            local = torch.load(tiny_run / rel, weights_only=False)
            for key in TENSORS:  # same seed per image: the same numbers as locally
                assert torch.equal(slurm[key], local[key]), (rel, key)


def test_one_allocation_per_shard_with_one_gpu(slurm_run):
    work, env, _, result = slurm_run
    assert result.returncode == 0, result.stderr[-5000:]
    submitted = jobs(env)
    # 8 per-image jobs in --jobs 2 shards of 4; every other rule ran here
    assert len(submitted) == 2
    assert {j["state"] for j in submitted} == {"COMPLETED"}
    assert {j["gpus"] for j in submitted} == {"1"}
    assert {(j["account"], j["partition"], j["mem"]) for j in submitted} == {
        ("lab", "gpu", "16000")
    }
    # the time limit: 4 images x the per-image runtime of the estimate (1 minute)
    assert {j["time_limit_min"] for j in submitted} == {4.0}
    shards = sorted(re.search(r"shard-\d+", j["comment"]).group() for j in submitted)
    assert shards == ["shard-00", "shard-01"]
    # one warm worker per allocation served its 4 images (models loaded once per
    # configuration of the shard), not one per image
    starts = sum(
        f.read_text().count("worker started")
        for f in (work / "logs" / "workers").glob("*.log")
    )
    assert starts == 2, starts


def test_dry_run_prints_gpu_hours_per_shard(slurm_run):
    _, _, dry, _ = slurm_run
    assert dry.returncode == 0, dry.stderr[-3000:]
    text = dry.stderr
    assert "on SLURM (profiles/slurm): 2 allocation(s)" in text
    shard_lines = re.findall(r"shard-0\d: 4 image\(s\) of 2 configuration\(s\)", text)
    assert len(shard_lines) == 2
    assert re.search(r"GPU-hours per shard: [0-9.e-]+ \(", text)
    slurm_block = text.split("on SLURM", 1)[1].split("\n\n", 1)[0]
    assert "USD" not in slurm_block


def test_a_cancelled_run_leaves_nothing_that_looks_finished(tiny_run, tmp_path):
    work = workdir_with_assets(tiny_run, tmp_path / "work")
    profile = user_profile(tmp_path / "profile")
    env = slurm_env(tmp_path)
    proc = subprocess.Popen(
        slurm_command(work, profile),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C reaches Snakemake even when the tests run in the background (where
        # the shell ignores SIGINT for its children)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if len(jobs(env)) == 2 and all(j["state"] == "RUNNING" for j in jobs(env)):
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the 2 shards were not submitted and running in time")
    time.sleep(2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: Snakemake cancels its SLURM jobs
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output[-3000:]
    states = {j["id"]: j["state"] for j in jobs(env)}
    assert set(states.values()) == {"CANCELLED"}, (states, output[-3000:])
    sacct = subprocess.run(
        ["sacct", "-X", "--parsable2", "--noheader", "--format=JobIdRaw,State"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert all("CANCELLED by" in line for line in sacct.stdout.splitlines())
    # no per-image file is partial: each one there is the local run's result
    for f in (work / "runs" / "per_image").rglob("*.pt"):
        rel = f.relative_to(work)
        done = torch.load(f, weights_only=False)
        local = torch.load(tiny_run / rel, weights_only=False)
        for key in TENSORS:
            assert torch.equal(done[key], local[key]), rel
    assert not (work / "runs" / "metrics" / "cross_encoder_metrics.json").exists()
    assert not (work / "results" / "fig4de.png").exists()
    # what is left is planned again (nothing half-done is taken as finished)
    dry = subprocess.run(
        slurm_command(work, profile, "-n"), env=env, capture_output=True, text=True
    )
    done = sum(
        len(list((work / "runs" / folder).rglob("*.pt")))
        for folder in ("per_image", "per_image_ceiling")
    )
    # 4 configurations x 2 images, and the noise ceiling's 4 second estimates
    assert f"per-image computations left: {12 - done}" in dry.stderr


def test_runtime_and_gpu_hours_per_shard():
    # (2 x seconds per image + 15 s of start-up), whole minutes
    assert slurm_runtime_minutes(15.0) == 1  # 45 s
    assert slurm_runtime_minutes(30.0) == 2  # 75 s
    assert slurm_runtime_minutes(885.0) == 30  # 1,785 s
    shards = [(80, 1, 80 * 15 + 15), (80, 2, 80 * 15 + 30)]
    lines = slurm_lines(shards, 15.0, "measured")
    assert lines[1] == (
        "    GPU-hours per shard: 0.338 to 0.342 (0.679 in all); time limit per "
        "shard 80 min at most"
    )
    assert lines[2:] == [
        "    shard-00: 80 image(s) of 1 configuration(s), 0.338 GPU-hours",
        "    shard-01: 80 image(s) of 2 configuration(s), 0.342 GPU-hours",
    ]
    assert slurm_lines([], 0.0, "nothing left") == []


def test_the_noise_ceiling_jobs_ask_what_estimate_image_asks(tmp_path):
    """profiles/slurm names the per-image rule once: the noise ceiling's second
    estimates get the same resources, except those set for them by name."""
    import yaml

    profile = user_profile(tmp_path / "profile")
    settings = yaml.safe_load((profile / "profile.yaml").read_text())
    settings["set-resources"].append("estimate_image_ceiling:mem_mb=8000")
    (profile / "profile.yaml").write_text(yaml.safe_dump(settings))
    work = tmp_path / "work"
    work.mkdir()
    dry = subprocess.run(
        slurm_command(work, profile, "-n"),
        env=slurm_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]

    def resources(rule: str) -> list[dict]:
        jobs = [job.split("rule ")[0] for job in dry.stdout.split(f"rule {rule}:")[1:]]
        lines = [next(x for x in j.splitlines() if "resources:" in x) for j in jobs]
        return [
            dict(
                item.split("=", 1) for item in line.split("resources: ")[1].split(", ")
            )
            for line in lines
        ]

    shared = {"gpu": "1", "slurm_partition": "gpu", "slurm_account": "lab"}
    shared |= {"cpus_per_gpu": "4", "mpi": ""}
    first, second = resources("estimate_image"), resources("estimate_image_ceiling")
    assert len(first) == 8 and len(second) == 4  # tiny.yaml: 1 ceiling image
    assert all(r.items() >= {**shared, "mem_mb": "16000"}.items() for r in first)
    assert all(r.items() >= {**shared, "mem_mb": "8000"}.items() for r in second)


def test_the_shipped_profiles_placeholders_are_refused(tmp_path):
    """
    profiles/slurm as shipped (account and partition still "SET-..."): the dry run
    names each placeholder, a real run stops before any submission with one line.
    """
    work = tmp_path / "work"
    work.mkdir()
    env = slurm_env(tmp_path)
    profile = REPO / "profiles" / "slurm"
    dry = subprocess.run(
        slurm_command(work, profile, "-n"), env=env, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    warned = [line for line in dry.stderr.splitlines() if "placeholder" in line]
    assert [line.split(" is the")[0] for line in warned] == [
        "warning: profile entry set-resources "
        "estimate_image:slurm_partition=SET-your-gpu-partition",
        "warning: profile entry set-resources "
        "estimate_image:slurm_account=SET-your-account",
    ]
    run = subprocess.run(
        slurm_command(work, profile), env=env, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "config error: profile entry set-resources estimate_image:slurm_partition="
            "SET-your-gpu-partition is the profile's placeholder"
        )
    )
    assert jobs(env) == []
