"""
Warm workers: one model load per (slot, configuration) used, the same results as a cold
job, and no worker left running after the run, however it ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import CONFIGURATIONS, REPO, TINY_CONFIG, run_snakemake, tiny_lock_dir

TENSORS = ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues", "J_eigenvectors")


def workers_alive(lock_dir: str) -> list[str]:
    """Command lines of this checkout's worker processes of the lock folder
    `lock_dir` (their sockets are in it): the tests running beside this one
    (pytest-xdist) and other checkouts on a shared machine have their own."""
    out = subprocess.run(
        ["ps", "-ww", "-eo", "args"], capture_output=True, text=True
    ).stdout
    python_dir = str(Path(sys.executable).parent)
    return [
        line
        for line in out.splitlines()
        if "multigeom_workflow.compute.workers" in line
        and line.startswith(python_dir)
        and lock_dir in line
    ]


def wait_until_no_worker(lock_dir: str, timeout=10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while workers_alive(lock_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    return workers_alive(lock_dir)


def test_one_start_per_slot_and_one_model_load_per_slot_and_configuration(tiny_run):
    held = set()
    # per-image jobs and the noise ceiling's second estimates share the workers
    logs = [*(tiny_run / "logs").glob("estimate_image*/*/*/img*.log")]
    for log in logs:
        m = re.search(r"holding (\w+) (\S+) ", log.read_text())
        held.add((m.group(1), m.group(2), log.parent.parent.name, log.parent.name))
    loads = [
        line
        for log in (tiny_run / "logs" / "workers").glob("*.log")
        for line in log.read_text().splitlines()
        if line.startswith("models loaded:")
    ]
    starts = [
        line
        for log in (tiny_run / "logs" / "workers").glob("*.log")
        for line in log.read_text().splitlines()
        if line.startswith("worker started")
    ]
    assert len(held) >= len(CONFIGURATIONS)
    assert len(loads) == len(held)
    assert len(starts) == len({(kind, slot) for kind, slot, _, _ in held})
    assert not wait_until_no_worker(str(tiny_lock_dir(tiny_run)))


def test_cold_job_gives_the_warm_result(tiny_copy):
    victim = tiny_copy / "runs/per_image/smallcnn/complex/img0001.pt"
    warm = torch.load(victim, weights_only=False)
    victim.unlink()
    result = run_snakemake(tiny_copy, "--config", "workers=cold")
    assert result.returncode == 0, result.stderr[-3000:]
    cold = torch.load(victim, weights_only=False)
    for key in TENSORS:
        assert torch.equal(cold[key], warm[key]), key
    assert cold["provenance"]["device"] == warm["provenance"]["device"] == "cpu"


def test_no_worker_outlives_a_failed_run(tiny_copy, tmp_path):
    locks = tempfile.mkdtemp(prefix="mgw", dir="/tmp")
    image = tiny_copy / "runs/demo/test_images/img0001.png"
    (tiny_copy / "runs/per_image/onoff/complex/img0000.pt").unlink()
    (tiny_copy / "runs/per_image/onoff/complex/img0001.pt").unlink()
    image.write_bytes(b"not an image")  # image 1 fails in the worker
    env = {"MULTIGEOM_GPU_LOCK_DIR": locks}
    result = run_snakemake(
        tiny_copy, "--rerun-triggers", "params", "--keep-going", env=env
    )
    assert result.returncode != 0
    assert (
        "the estimator worker failed"
        in (tiny_copy / "logs/estimate_image/onoff/complex/img0001.log").read_text()
    )
    assert (tiny_copy / "runs/per_image/onoff/complex/img0000.pt").exists()
    assert not (tiny_copy / "runs/per_image/onoff/complex/img0001.pt").exists()
    assert not wait_until_no_worker(locks)


def test_no_worker_outlives_an_interrupted_run(tiny_copy):
    locks = tempfile.mkdtemp(prefix="mgw", dir="/tmp")
    for f in (tiny_copy / "runs/per_image").glob("*/*/img*.pt"):
        f.unlink()
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += [
        "--directory",
        str(tiny_copy),
        "--cores",
        "2",
        "--configfile",
        str(TINY_CONFIG),
    ]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "MULTIGEOM_GPU_LOCK_DIR": locks},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not workers_alive(locks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert workers_alive(locks), "no worker started"
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    proc.wait(timeout=60)
    assert not wait_until_no_worker(locks)
    # Nothing that looks finished was left by the interrupted jobs.
    for f in Path(tiny_copy, "runs/per_image").glob("*/*/img*.pt"):
        torch.load(f, weights_only=False)


ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (torch.AcceleratorError(ILLEGAL_ACCESS), True),
        (RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel"), True),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), True),
        (RuntimeError("CUDA error: unspecified launch failure"), True),
        (RuntimeError("CUDA error: misaligned address"), True),
        (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasSgemm"), True),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), False),
        (RuntimeError("shape mismatch"), False),
        (ValueError("an illegal memory access was encountered"), False),
    ],
)
def test_a_broken_cuda_context_is_told_from_other_errors(error, lost):
    from multigeom_workflow.compute.workers import cuda_context_lost

    assert cuda_context_lost(error) is lost


def test_a_broken_context_is_found_behind_the_error_it_caused():
    """The eigen-step's CPU fallback cannot copy off the device either: its error is
    raised from the first one."""
    from multigeom_workflow.compute.workers import cuda_context_lost

    try:
        try:
            raise torch.AcceleratorError(ILLEGAL_ACCESS)
        except RuntimeError as first:
            raise ValueError("could not copy the eigen-step's input off") from first
    except ValueError as err:
        assert cuda_context_lost(err)
