"""
One GPU per job, with 8 fake GPUs: no two jobs ever hold the same GPU, a killed job
frees its GPU, and the workflow plans one GPU per per-image job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, run_snakemake

from multigeom_workflow.cli import install_profiles
from multigeom_workflow.compute.gpus import hold_gpu, resolve_device, visible_gpu_ids

# A job: hold a GPU, record when (inside the hold), work a little, record the end.
JOB = """
import json, os, random, sys, time
from multigeom_workflow.compute.gpus import hold_gpu
with hold_gpu() as slot:
    start = time.monotonic()
    time.sleep(random.uniform(0.02, 0.15))
    end = time.monotonic()
hold = {"gpu": slot.slot_id, "device": slot.device, "start": start, "end": end}
print(json.dumps(hold))
"""


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(tmp_path / "locks"))
    return dict(os.environ)


@pytest.mark.process
def test_no_two_jobs_hold_the_same_gpu(fake_gpus):
    def job(_):
        out = subprocess.run(
            [sys.executable, "-c", JOB], env=fake_gpus, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    with ThreadPoolExecutor(max_workers=16) as pool:  # 16 jobs at once for 8 GPUs
        holds = list(pool.map(job, range(60)))
    assert len(holds) == 60
    by_gpu: dict[str, list] = {}
    for h in holds:
        assert h["device"] == f"cuda:{int(h['gpu'])}"
        by_gpu.setdefault(h["gpu"], []).append((h["start"], h["end"]))
    assert set(by_gpu) <= {str(i) for i in range(8)} and len(by_gpu) >= 6
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"two jobs held GPU {gpu} at once"


@pytest.mark.process
def test_a_killed_job_frees_its_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(tmp_path))
    hold = (
        "from multigeom_workflow.compute.gpus import hold_gpu\nimport time\n"
        "with hold_gpu():\n    print('held', flush=True)\n    time.sleep(120)\n"
    )
    first = subprocess.Popen(
        [sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True
    )
    assert first.stdout.readline().strip() == "held"
    second = subprocess.Popen(
        [sys.executable, "-c", JOB], stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)
    assert second.poll() is None  # waiting: the only GPU is held
    first.send_signal(signal.SIGKILL)  # no cleanup can run
    first.wait()
    out, _ = second.communicate(timeout=20)
    assert json.loads(out)["gpu"] == "5"


@pytest.mark.process
def test_visible_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert visible_gpu_ids() == ["2", "5"]
    for none in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", none)
        assert visible_gpu_ids() == []
        assert resolve_device("auto") == "cpu" and resolve_device("cuda:1") == "cpu"
    # Without CUDA_VISIBLE_DEVICES, nvidia-smi's list (`nvidia-smi -L`, its format).
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    smi = tmp_path / "nvidia-smi"
    listing = "".join(
        f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}a1b2c3d-0000-1111-2222-3333)\n"
        for i in range(3)
    )
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] && printf '{listing}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert visible_gpu_ids() == ["0", "1", "2"]
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:2") == "cuda:2"
    assert resolve_device("cpu") == "cpu"


def test_asking_for_a_gpu_that_is_not_there(fake_gpus):
    with pytest.raises(RuntimeError, match="cuda:9 asked for, but 8 GPU"):
        with hold_gpu(want=9):
            pass
    with hold_gpu(want=3) as slot:
        assert (slot.slot_id, slot.device) == ("3", "cuda:3")


@pytest.mark.workflow
def test_workflow_plans_one_gpu_per_image_job(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    result = run_snakemake(tmp_path, "-n", "--config", "device=auto", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = result.stdout.split("rule estimate_image:")[1:]
    assert len(jobs) == 8 and all("gpu=1" in j.split("rule ")[0] for j in jobs)
    assert "here (cuda): 3 worker(s) (3 visible GPU(s))" in result.stderr
    # --resources gpu=N limits them.
    limited = run_snakemake(
        tmp_path, "-n", "--config", "device=cuda", "--resources", "gpu=2", env=env
    )
    assert "here (cuda): 2 worker(s) (--resources gpu)" in limited.stderr


@pytest.mark.workflow
def test_no_gpu_is_said_in_one_line(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": ""}
    result = run_snakemake(tmp_path, "-n", "--config", "device=auto", env=env)
    notice = [line for line in result.stderr.splitlines() if "no GPU found" in line]
    assert notice == [
        "no GPU found (config key 'device' = 'auto'): a local run's per-image jobs "
        "run on the CPU here (with the Modal or SLURM profile, on their GPUs)"
    ]
    assert "here (cpu)" in result.stderr
    assert "gpu=1" not in result.stdout


@pytest.mark.workflow
def test_an_explicit_gpu_without_gpu_stops_a_local_run(tmp_path):
    """device: cuda, no GPU: the dry run says so, a local run stops before any job."""
    env = {"CUDA_VISIBLE_DEVICES": ""}
    dry = run_snakemake(tmp_path, "-n", "--config", "device=cuda", env=env)
    assert dry.returncode == 0
    assert "no GPU found (config key 'device' = 'cuda')" in dry.stderr
    run = run_snakemake(tmp_path, "--config", "device=cuda", env=env)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "config error: config key 'device' = 'cuda': this machine shows no GPU and a "
        "local run computes here; allowed for a local run: auto or cpu (with the "
        "Modal or SLURM profile the jobs run on their GPUs)"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.workflow
def test_bare_profile_names_after_install(tmp_path):
    target = tmp_path / "xdg" / "snakemake"
    links = install_profiles(REPO / "profiles", target)
    assert sorted(link.name for link in links) == [
        "local-cpu",
        "local-gpu",
        "modal",
        "slurm",
    ]
    assert install_profiles(REPO / "profiles", target) == links  # idempotent
    work = tmp_path / "work"
    work.mkdir()
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "CUDA_VISIBLE_DEVICES": ""}
    result = run_snakemake(work, "-n", "--profile", "local-gpu", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    # (with the workflow's own profile, which is not registered: profiles/default)
    said = result.stdout + result.stderr
    assert "Using profiles local-gpu and workflow specific profile " in said
    assert f"{REPO / 'profiles' / 'default'} for setting" in said
    other = tmp_path / "other"
    (other / "local-cpu").mkdir(parents=True)
    with pytest.raises(Exception, match="already exists and is not this workflow's"):
        install_profiles(REPO / "profiles", other)
