"""
The orchestration around the estimator, with simulated GPUs (fake ids in
CUDA_VISIBLE_DEVICES) and the stand-in estimator (it sleeps instead of computing and
records when each process computed on which slot): a run killed with SIGKILL leaves
nothing that lets two processes compute on one GPU, nor stale files; the local GPU
profile runs no more per-image jobs than there are GPUs; and the typed request gives
the warm worker's tensors when computed from its JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_CONFIG

from multigeom_workflow.compute.request import RUN_ENV, EstimateRequest, RunSettings
from multigeom_workflow.compute.standin import simulated_scenario, simulated_targets

TENSORS = ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues", "J_eigenvectors")


def simulated_run(root: Path, work: Path, n_gpus: int, seconds: float, *args: str):
    """The command and environment of a run of the simulated scenario in `work`."""
    config, env = simulated_scenario(root, 2, 4)
    env = {
        **os.environ,
        **env,
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n_gpus)),
        "MULTIGEOM_STANDIN_S": str(seconds),
        "MULTIGEOM_STANDIN_RECORD": str(root / "records.jsonl"),
        "MULTIGEOM_GPU_LOCK_DIR": str(root / "locks"),
    }
    work.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(work), *simulated_targets(2, 4)]
    return [*cmd, "--configfile", str(config), *args], env  # (nargs="+" options last)


def records(root: Path) -> list[dict]:
    path = root / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def compute_intervals(entries: list[dict], unended: float) -> dict[str, list[tuple]]:
    """Per slot, (start, end, pid) of every computation; a stopped one ends when its
    worker recorded that it stops (it ends right after, releasing the slot), one with
    no end at `unended`."""
    ends = {
        (e["pid"], e["out"]): e["end"]
        for e in entries
        if e["what"] in ("compute", "stopped") and e["end"] is not None
    }
    slots: dict[str, list[tuple]] = {}
    for e in entries:
        if e["what"] == "compute" and e["end"] is None:
            end = ends.get((e["pid"], e["out"]), unended)
            slots.setdefault(e["slot"], []).append((e["start"], end, e["pid"]))
    return slots


@pytest.fixture
def short_root():
    """A folder with a short path (Unix socket paths are limited), removed after."""
    root = Path(tempfile.mkdtemp(prefix="mgw", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def wait_for_workers_to_end(locks: Path, timeout=20.0) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sockets = list(locks.rglob("*.sock"))
        if not sockets:
            return []
        time.sleep(0.2)
    return sockets


@pytest.mark.workflow
@pytest.mark.parametrize("workers", ["warm", "cold"])
def test_a_killed_run_then_a_rerun(tmp_path, short_root, workers):
    root = short_root
    cmd, env = simulated_run(
        root,
        tmp_path / "work",
        2,
        1.5,
        "--cores",
        "4",
        "--config",
        f"workers={workers}",
    )
    run = subprocess.Popen(
        cmd,
        env=env,
        start_new_session=True,  # its own process group, as a shell would start it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert run.poll() is None, "the run ended before it was killed"
        path = root / "records.jsonl"
        if (
            path.exists()
            and sum(e["what"] == "compute" and e["end"] is None for e in records(root))
            >= 2
        ):
            break
        time.sleep(0.1)
    time.sleep(0.3)  # both slots computing
    os.killpg(run.pid, signal.SIGKILL)  # the whole run, no cleanup can run
    run.wait()
    killed_at = time.time()
    per_image = tmp_path / "work" / "runs" / "per_image"
    if workers == "cold":  # a killed job cannot clean up (a warm worker does)
        assert list(per_image.glob("*/*/.img*")), "the kill left no temporary folder"
    (per_image / "inception/V1/.img0003.x1y2z3").mkdir(parents=True)  # an older kill's

    # As a user would: unlock the working directory (Snakemake's lock outlives a
    # SIGKILL), then run again, redoing the jobs the kill cut short.
    unlock = subprocess.run([*cmd, "--unlock"], env=env, capture_output=True)
    assert unlock.returncode == 0, unlock.stderr[-3000:]
    rerun = subprocess.run(
        [*cmd, "--rerun-incomplete"], env=env, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    entries = records(root)
    # A cold job computes in its own process: SIGKILL ended it. A warm worker records
    # when it stops.
    unended = killed_at if workers == "cold" else float("inf")
    for slot, spans in compute_intervals(entries, unended).items():
        spans.sort()
        for (_, end, pid), (start, _, other) in zip(spans, spans[1:], strict=False):
            assert end <= start, (
                f"processes {pid} and {other} computed on {slot} at once"
            )
    # Nothing was computed to the end by the killed run's workers after the kill.
    killed_pids = {e["pid"] for e in entries if e.get("start", e["end"]) < killed_at}
    late = [
        e
        for e in entries
        if e["what"] == "compute"
        and e["end"] is not None
        and e["pid"] in killed_pids
        and e["end"] > killed_at + 0.5
    ]
    assert not late, late
    # No stale temporary folders or sockets; the killed run's folder is gone.
    assert not list(per_image.glob("*/*/.img*"))
    assert not wait_for_workers_to_end(root / "locks")
    assert not (root / "locks" / f"run-{run.pid}").exists()
    # Every per-image file equals an uninterrupted run's.
    clean_cmd, clean_env = simulated_run(
        root, tmp_path / "clean", 2, 0.05, "--cores", "4"
    )
    clean = subprocess.run(clean_cmd, env=clean_env, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stderr[-3000:]
    for target in simulated_targets(2, 4):
        assert (tmp_path / "work" / target).read_bytes() == (
            tmp_path / "clean" / target
        ).read_bytes(), target
    if workers == "warm":  # the killed run's workers said why they stopped, in a line
        logs = "".join(
            p.read_text() for p in (tmp_path / "work" / "logs" / "workers").glob("*")
        )
        assert "worker stops: the job asking for img" in logs
        assert "Traceback" not in logs


@pytest.mark.workflow
def test_local_gpu_profile_runs_one_job_per_gpu(tmp_path, short_root):
    root = short_root
    config, env = simulated_scenario(root, 4, 6)
    env = {
        **os.environ,
        **env,
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(8)),
        "MULTIGEOM_STANDIN_S": "0.5",
        "MULTIGEOM_STANDIN_RECORD": str(root / "records.jsonl"),
        "MULTIGEOM_GPU_LOCK_DIR": str(root / "locks"),
    }
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(tmp_path), *simulated_targets(4, 6)]
    cmd += ["--profile", str(REPO / "profiles" / "local-gpu"), "--cores", "24"]
    cmd += ["--configfile", str(config)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [e for e in records(root) if e["what"] == "job"]
    assert len(jobs) == 24
    events = sorted([(j["start"], 1) for j in jobs] + [(j["end"], -1) for j in jobs])
    running, most = 0, 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most <= 8, f"{most} per-image jobs ran at once on 8 GPUs"


def test_request_json_round_trip():
    request = EstimateRequest(
        image="/d/img.png",
        index=7,
        out="/r/img0007.pt",
        estimator={"seed": 42, "monte_carlo": {"n_samples": 4}},
        encoder_name="onoff",
        area="V1",
        encoder_ckpt="/e.pt",
        diffusion_ckpt="/d.pt",
        diffusion={"unet": {"block_channels": [32, 64]}},
        settings_files={"estimator": "/s.yaml"},
    )
    back = EstimateRequest.from_json(request.to_json())
    assert back == request
    assert (back.engine, back.precision) == ("fast", "fp32")
    with pytest.raises(
        ValueError, match=r"unknown fields of an estimate request: \['gpu'\]"
    ):
        EstimateRequest.from_json(
            json.dumps({**json.loads(request.to_json()), "gpu": 1})
        )
    with pytest.raises(ValueError, match="incomplete estimate request"):
        EstimateRequest.from_json('{"index": 1}')
    run = RunSettings(run_id="12", device="cuda", gpu_ids=["3", "5"])
    assert RunSettings.from_env(run.to_env()) == run
    with pytest.raises(RuntimeError, match=f"{RUN_ENV} is not set"):
        RunSettings.from_env({})


def test_a_job_reads_its_rule_and_settings_from_its_output_and_the_run(monkeypatch):
    """The per-image job's command holds no settings: its output's path names the rule
    (per_image/ or per_image_ceiling/), the configuration and the image, and the run's
    settings give that rule's estimator settings for the configuration."""
    from multigeom_workflow.compute.client import parse_args

    run = RunSettings(
        run_id="1",
        device="cpu",
        estimator={"seed": 42, "top_k": 5},
        seeds={
            "estimate_image/onoff/V1": 7,
            "estimate_image_ceiling/onoff/V1": 42 + 10**6,
        },
        diffusion={"T": 1000},
    )
    monkeypatch.setenv(RUN_ENV, run.to_env()[RUN_ENV])
    inputs = ["--input", "img.png", "enc.pt", "diff.pt"]
    first, threads = parse_args(
        [*inputs, "--output", "runs/per_image/onoff/V1/img0005.pt", "--threads", "3"]
    )
    assert (first.encoder_name, first.area, first.index, threads) == (
        "onoff",
        "V1",
        5,
        3,
    )
    assert first.estimator == {"seed": 7, "top_k": 5} and first.seed == 7
    assert first.diffusion == {"T": 1000}
    second, _ = parse_args(
        [*inputs, "--output", "runs/per_image_ceiling/onoff/V1/img0005.pt"]
    )
    assert second.seed == 42 + 10**6
    with pytest.raises(SystemExit):  # not a per-image file's path
        parse_args([*inputs, "--output", "runs/img5.pt"])
    with pytest.raises(
        RuntimeError, match="no estimator settings for 'estimate_image/b/V1'"
    ):
        parse_args([*inputs, "--output", "runs/per_image/b/V1/img0005.pt"])


def test_request_from_json_gives_the_warm_workers_tensors(tiny_run, monkeypatch):
    """The warm worker's file (the reduced demo) = the request computed here from its
    JSON, as a cold job or a Modal container computes it."""
    import yaml

    from multigeom_workflow.compute.estimate import estimate_request, load_models
    from multigeom_workflow.scenario import validated_scenario
    from multigeom_workflow.settings.files import resolve_settings_file

    monkeypatch.chdir(tiny_run)
    scenario = validated_scenario(yaml.safe_load(TINY_CONFIG.read_text()), REPO, False)
    config = yaml.safe_load(TINY_CONFIG.read_text())
    scenario = validated_scenario(config, REPO, False)
    request = EstimateRequest(  # what rules/estimate.smk and the client build
        image=str(tiny_run / scenario.test_image_files[1]),
        index=1,
        out=str(tiny_run / "redone" / "img0001.pt"),
        estimator=scenario.estimator,
        encoder_name="onoff",
        area="simple",
        encoder_ckpt=str(tiny_run / "runs/encoders/onoff/simple/best_model.pt"),
        diffusion_ckpt=str(tiny_run / "runs/diffusion/onoff/simple/final_model.pt"),
        diffusion=scenario.diffusion,
        settings_files={
            key: str(resolve_settings_file(config[key], key, REPO))
            for key in ("estimator", "diffusion")
        },
        engine=scenario.engine,  # the run's engine and precision, as RunSettings
        precision=scenario.precision,
    )
    request = EstimateRequest.from_json(request.to_json())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker computed
    try:
        models = load_models(
            request.encoder_ckpt, request.diffusion_ckpt, request.diffusion, "cpu"
        )
        cold = torch.load(estimate_request(models, request), weights_only=False)
    finally:
        torch.set_num_threads(threads)
        Path(request.out).unlink(missing_ok=True)
    warm = torch.load(
        tiny_run / "runs/per_image/onoff/simple/img0001.pt", weights_only=False
    )
    for key in TENSORS:
        assert torch.equal(cold[key], warm[key]), key
    assert cold["provenance"]["seed"] == warm["provenance"]["seed"]


def run_with_cuda_fault(tmp_path, root: Path, fault: str, *args: str):
    """The simulated scenario (2 configurations x 3 images) on 2 simulated GPUs with
    the local-gpu profile, the stand-in raising PyTorch's error of a broken CUDA
    context on a slot (`CUDA_FAULT_ENV`, ``<slot>:<times>``)."""
    from multigeom_workflow.compute.standin import CUDA_FAULT_ENV

    config, env = simulated_scenario(root, 2, 3)
    env = {
        **os.environ,
        **env,
        "CUDA_VISIBLE_DEVICES": "0,1",
        "MULTIGEOM_STANDIN_S": "0.3",
        "MULTIGEOM_STANDIN_RECORD": str(root / "records.jsonl"),
        "MULTIGEOM_GPU_LOCK_DIR": str(root / "locks"),
        CUDA_FAULT_ENV: fault,
    }
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(tmp_path), *simulated_targets(2, 3)]
    cmd += ["--profile", str(REPO / "profiles" / "local-gpu"), "--cores", "4"]
    cmd += ["--configfile", str(config), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


@pytest.mark.workflow
def test_a_worker_whose_cuda_context_fails_is_replaced(tmp_path, short_root):
    """
    The first image asked of GPU 0 raises what PyTorch raises after an illegal memory
    access: that worker answers and ends instead of serving the next image, and the
    job asks a fresh worker (a new process), which computes the image.
    """
    result = run_with_cuda_fault(tmp_path, short_root, "gpu0:1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list(tmp_path.glob("runs/per_image/*/*/img*.pt"))) == 6
    worker_log = (tmp_path / "logs" / "workers" / "gpu0.log").read_text()
    assert worker_log.count("worker started") >= 2
    ended = [x for x in worker_log.splitlines() if "CUDA context failed" in x]
    assert ended and "an illegal memory access was encountered" in ended[0]
    (failed,) = [
        f
        for f in tmp_path.glob("logs/estimate_image/*/*/img*.log")
        if "again in a fresh worker" in f.read_text()
    ]
    out = str(tmp_path / "runs" / "per_image" / failed.parent.parent.name)
    out += f"/{failed.parent.name}/{failed.stem}.pt"
    computes = [e for e in records(short_root) if e["what"] == "compute"]
    done = [e for e in computes if e["out"] == out and e.get("end")]
    assert len(done) == 1 and done[0]["slot"] == "gpu0"  # by the replacement
    starts = [
        int(line.split("pid ")[1].rstrip(")"))
        for line in worker_log.splitlines()
        if line.startswith("worker started")
    ]
    assert done[0]["pid"] in starts[1:]  # not the worker whose context failed


@pytest.mark.workflow
def test_a_gpu_whose_context_fails_twice_is_stopped_and_the_others_go_on(
    tmp_path, short_root
):
    """
    GPU 0 fails every image: after the second failure (two workers in a row) it is
    stopped for the run with one line naming it and the error; the image's job fails
    and its retry, like every later job, computes on GPU 1.
    """
    result = run_with_cuda_fault(tmp_path, short_root, "gpu0:1000", "--retries", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list(tmp_path.glob("runs/per_image/*/*/img*.pt"))) == 6
    # said by the run at its end (the failed job's log went with its retry), and in
    # the GPU's worker log
    said = [x for x in result.stderr.splitlines() if "stopped for this run" in x]
    assert len(said) == 1, result.stderr[-3000:]
    assert said[0].startswith(
        "warning: GPU 0 (cuda:0) stopped for this run: its CUDA context failed in two "
        "workers in a row (AcceleratorError: CUDA error: an illegal memory access was "
        "encountered)"
    )
    worker_log = (tmp_path / "logs" / "workers" / "gpu0.log").read_text()
    assert said[0].removeprefix("warning: ") in worker_log
    computes = [e for e in records(short_root) if e["what"] == "compute"]
    assert {e["slot"] for e in computes} == {"gpu1"}
    faults = (short_root / "records.jsonl.faults").read_text().split()
    assert faults == ["gpu0", "gpu0"]  # no job held GPU 0 after it was stopped
