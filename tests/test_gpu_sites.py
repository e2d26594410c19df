"""
What sites and hardware do to GPU slots, simulated: a folder whose file system refuses
``flock`` (NFS without its lock daemon, Lustre mounted without ``flock``), GPU slices
(MIG) in ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``, and the CPU share of a process
narrowed to one slice.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import python_path, run_snakemake, said_lines

from multigeom_workflow.compute import lock_folder
from multigeom_workflow.compute.gpus import (
    SlotLockError,
    compute_lock,
    default_lock_dir,
    hold_gpu,
    lock_dir,
    slot_lock_problem,
    stop_gpu,
    stopped_gpus,
    visible_gpu_ids,
)

# --- file systems without locks ----------------------------------------------------

#: What flock(2) fails with where the file system cannot lock: NFS, whose flock is
#: emulated with the lock manager's byte-range locks (flock(2), NOTES) when that
#: does not answer (ENOLCK, huggingface_hub #2399, datasets #2618); Lustre mounted
#: without ``-o flock`` (ENOSYS, the Lustre manual's mount options).
REFUSALS = [
    (errno.ENOLCK, "ENOLCK: No locks available"),
    (errno.ENOSYS, "ENOSYS: Function not implemented"),
]

#: A ``sitecustomize`` that makes every process of a run (Snakemake, its jobs, their
#: workers) meet such a file system in one folder: ``flock`` on a file there raises
#: what the kernel returns there, elsewhere the real ``flock`` runs.
NO_LOCKS_SITE = """
import errno, fcntl, os
_real_flock = fcntl.flock
_folder = os.environ["FAKE_NO_LOCKS_DIR"].rstrip("/") + "/"
_code = int(os.environ["FAKE_NO_LOCKS_ERRNO"])

def flock(fd, operation):
    n = fd if isinstance(fd, int) else fd.fileno()
    if os.readlink(f"/proc/self/fd/{n}").startswith(_folder):
        raise OSError(_code, os.strerror(_code))
    return _real_flock(fd, operation)

fcntl.flock = flock
"""


@pytest.fixture
def no_locks(tmp_path, monkeypatch):
    """A lock folder whose file system refuses flock, as `NO_LOCKS_SITE` makes it."""
    folder = tmp_path / "nfs-locks"
    folder.mkdir()
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(folder))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")

    def refuse(code):
        real = fcntl.flock

        def flock(handle, operation):
            path = os.readlink(f"/proc/self/fd/{handle.fileno()}")
            if path.startswith(f"{folder}/"):
                raise OSError(code, os.strerror(code))
            return real(handle, operation)

        monkeypatch.setattr(lock_folder.fcntl, "flock", flock)

    return folder, refuse


@pytest.mark.parametrize(("code", "said"), REFUSALS, ids=["ENOLCK", "ENOSYS"])
def test_a_folder_refusing_locks_is_said_in_one_line(no_locks, code, said):
    folder, refuse = no_locks
    assert slot_lock_problem() is None  # the real flock works in tmp_path
    refuse(code)
    line = slot_lock_problem()
    assert line is not None and "\n" not in line
    assert line.startswith(f"GPU slot locks: the folder {folder} (file system ")
    assert f"refuses file locks ({said}); " in line
    assert line.endswith(
        f"set MULTIGEOM_GPU_LOCK_DIR to a folder on this machine's own disk (e.g. "
        f"{default_lock_dir()}), or unset it for that default"
    )
    # a job that meets it anyway fails with the same line, not a traceback of flock
    with pytest.raises(SlotLockError) as raised:
        with hold_gpu():
            pass
    assert str(raised.value) == line
    with pytest.raises(SlotLockError, match="refuses file locks"):
        with compute_lock("gpu", "0", os.getpid()):
            pass


def test_the_default_lock_folder_is_local_whatever_tmpdir(tmp_path, monkeypatch):
    monkeypatch.delenv("MULTIGEOM_GPU_LOCK_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # e.g. a scratch on Lustre
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir reads TMPDIR again
    assert tempfile.gettempdir() == str(tmp_path)
    expected = Path("/tmp") / f"multigeom-workflow-{os.getuid()}"
    assert lock_dir() == expected and expected.is_dir()
    assert expected.stat().st_uid == os.getuid()


@pytest.mark.workflow
def test_a_local_run_on_a_folder_without_locks_stops_before_any_job(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_LOCKS_SITE)
    folder = tmp_path / "nfs-locks"
    env = {
        "PYTHONPATH": python_path(site),
        "FAKE_NO_LOCKS_DIR": str(folder),
        "FAKE_NO_LOCKS_ERRNO": str(errno.ENOLCK),
        "MULTIGEOM_GPU_LOCK_DIR": str(folder),
        "CUDA_VISIBLE_DEVICES": "",
    }
    work = tmp_path / "work"
    work.mkdir()
    result = run_snakemake(work, "--config", "device=cpu", env=env)
    assert result.returncode == 1
    lines = said_lines(result.stderr)
    assert lines[-1].startswith(f"GPU slot locks: the folder {folder} (file system ")
    assert "refuses file locks (ENOLCK: No locks available)" in lines[-1]
    assert sum("GPU slot locks" in line for line in lines) == 1
    assert not (work / "logs").exists() and not (work / "runs").exists()


# --- GPU slices (MIG) --------------------------------------------------------------

SLICE_A = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"
SLICE_B = "MIG-89c850dc-38e3-57df-85c7-690c186b68e9"


def cuda_devices(visible: str) -> int:
    """
    The devices a CUDA process enumerates under ``CUDA_VISIBLE_DEVICES=visible``, as
    CUDA 11/R450 to CUDA 12 do: the whole GPUs listed, and of the slices only the
    first ("a single CUDA process can only enumerate a single MIG device", NVIDIA's
    MIG User Guide; pytorch #92315: two slices, ``device_count() == 1``, ``cuda:1``
    "invalid device ordinal").
    """
    ids = [i.strip() for i in visible.split(",") if i.strip()]
    slices = [i for i in ids if i.startswith("MIG-")]
    return len(ids) - len(slices) + min(len(slices), 1)


def ordinal_is_valid(slot, env_before: str) -> bool:
    """Whether the slot's device exists in the process that computes on it."""
    visible = slot.environment().get("CUDA_VISIBLE_DEVICES", env_before)
    return int(slot.device.partition(":")[2]) < cuda_devices(visible)


@pytest.mark.parametrize(
    "visible",
    [f"{SLICE_A},{SLICE_B}", f"MIG-GPU-{SLICE_A[4:]}/7/0,MIG-GPU-{SLICE_A[4:]}/8/0",
     f"{SLICE_A},{SLICE_B},0"],
    ids=["MIG-uuid", "MIG-GPU-uuid/gi/ci", "slices-and-a-gpu"],
)  # fmt: skip
def test_two_slices_never_give_cuda_1(visible, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(tmp_path))
    ids = visible.split(",")
    with hold_gpu(want=0) as first, hold_gpu(want=1) as second:
        for slot, gpu_id in ((first, ids[0]), (second, ids[1])):
            assert slot.slot_id == gpu_id and slot.device == "cuda:0"
            assert slot.environment() == {
                "CUDA_VISIBLE_DEVICES": gpu_id,
                "MULTIGEOM_VISIBLE_GPUS": str(len(ids)),
            }
            assert ordinal_is_valid(slot, visible)
    # whole GPUs keep their position (and the process's own CUDA_VISIBLE_DEVICES)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with hold_gpu(want=1) as slot:
        assert (slot.device, slot.environment()) == ("cuda:1", {})
        assert ordinal_is_valid(slot, "0,1")


def test_an_old_style_slice_id_names_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(tmp_path))
    gpu_id = f"MIG-GPU-{SLICE_A[4:]}/7/0"
    stop_gpu(4242, gpu_id, "its CUDA context failed twice")
    assert stopped_gpus(4242) == {gpu_id: "its CUDA context failed twice"}
    with hold_gpu([gpu_id]) as slot:
        assert slot.slot_id == gpu_id
    assert (tmp_path / f"gpuMIG-GPU-{SLICE_A[4:]}_7_0.lock").is_file()


@pytest.mark.process
def test_slices_listed_by_nvidia_smi(tmp_path, monkeypatch):
    """Without CUDA_VISIBLE_DEVICES: GPU 0 split in two slices, GPU 1 whole (the
    layout of ``nvidia-smi -L``, NVIDIA's MIG User Guide)."""
    listing = textwrap.dedent(f"""\
        GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5ba6d2a5-0b5e-5a1b-8b36-2a1ad7e1e0f1)
          MIG 3g.20gb     Device  0: (UUID: {SLICE_A})
          MIG 3g.20gb     Device  1: (UUID: {SLICE_B})
        GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-7f3c1e2d-1c4b-4b8e-9d2f-0e8a6b5c4d3e)
        """)
    (tmp_path / "listing.txt").write_text(listing)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\n[ "$1" = -L ] && cat {tmp_path / "listing.txt"}\n')
    smi.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(tmp_path / "locks"))
    assert visible_gpu_ids() == [SLICE_A, SLICE_B, "1"]
    with hold_gpu(want=2) as slot:  # the whole GPU, narrowed too (cuda:0 is it)
        assert slot.device == "cuda:0"
        assert slot.environment()["CUDA_VISIBLE_DEVICES"] == "1"


#: A hook (`multigeom_workflow.compute.hook`) that writes what the process computing
#: sees: its CUDA_VISIBLE_DEVICES and its share of the GPUs.
SEEN_HOOK = """
import json, os
def estimate(request, slot):
    seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES",
                                           "MULTIGEOM_VISIBLE_GPUS")}
    with open(request.out, "w") as f:
        json.dump({"slot": slot, **seen}, f)
def record(**entry):
    pass
"""


def a_request(out: Path):
    from multigeom_workflow.compute.request import EstimateRequest

    return EstimateRequest(
        image="img.png", index=0, out=str(out), estimator={}, encoder_name="e",
        area="a", encoder_ckpt="e.pt", diffusion_ckpt="d.pt", diffusion={},
    )  # fmt: skip


@pytest.fixture
def seen_hook(tmp_path, monkeypatch):
    (tmp_path / "seen_hook.py").write_text(SEEN_HOOK)
    monkeypatch.setenv("PYTHONPATH", python_path(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MULTIGEOM_ESTIMATOR_HOOK", "seen_hook")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{SLICE_A},{SLICE_B}")
    monkeypatch.setenv("MULTIGEOM_VISIBLE_GPUS", "")  # restored after the test
    monkeypatch.setenv("MULTIGEOM_GPU_LOCK_DIR", str(tmp_path / "locks"))


@pytest.mark.workflow
def test_each_slice_has_its_own_warm_worker_narrowed_to_it(seen_hook, tmp_path):
    from multigeom_workflow.compute.workers import request_estimate, slot_spec

    seen = {}
    with hold_gpu(want=0) as first, hold_gpu(want=1) as second:
        for slot in (first, second):
            spec = slot_spec(
                slot.kind, slot.slot_id, slot.device, 1, os.getpid(),
                slot.environment(),
            )  # fmt: skip
            out = tmp_path / f"{slot.position}.json"
            log = tmp_path / f"worker{slot.position}.log"
            assert request_estimate(spec, a_request(out), log=log, idle_s=2)["ok"]
            seen[slot.slot_id] = json.loads(out.read_text())
            assert "worker started on cuda:0 (pid " in log.read_text()
    for gpu_id in (SLICE_A, SLICE_B):
        assert seen[gpu_id] == {
            "slot": f"gpu{gpu_id}",
            "CUDA_VISIBLE_DEVICES": gpu_id,
            "MULTIGEOM_VISIBLE_GPUS": "2",
        }
        assert cuda_devices(seen[gpu_id]["CUDA_VISIBLE_DEVICES"]) == 1


def test_a_cold_job_is_narrowed_to_its_slice(seen_hook, tmp_path):
    from multigeom_workflow.compute.client import compute_cold

    with hold_gpu(want=1) as slot:
        out = tmp_path / "cold.json"
        compute_cold(
            a_request(out), slot.kind, slot.slot_id, slot.device, 1, str(os.getpid()),
            slot.environment(),
        )  # fmt: skip
    assert json.loads(out.read_text())["CUDA_VISIBLE_DEVICES"] == SLICE_B
    assert os.environ["CUDA_VISIBLE_DEVICES"] == SLICE_B  # set before CUDA starts


def test_a_process_narrowed_to_a_slice_takes_its_share_of_the_cores(monkeypatch):
    torch = pytest.importorskip("torch")
    from multigeom_workflow.compute.engine import cpu_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one slice seen
    monkeypatch.setenv("MULTIGEOM_VISIBLE_GPUS", "4")  # of the run's 4
    before = torch.get_num_threads()
    with cpu_threads("cuda:0"):
        assert torch.get_num_threads() == max(before, 16 // 4)
    monkeypatch.setenv("MULTIGEOM_VISIBLE_GPUS", "")  # a whole GPU: its own count
    with cpu_threads("cuda:0"):
        assert torch.get_num_threads() == max(before, 16)
    assert torch.get_num_threads() == before
