"""
One GPU per job: which GPUs this machine shows, and a slot on one of them held for the
job's lifetime.

Snakemake counts GPUs (``resources: gpu=1``, ``--resources gpu=N``) but does not say
which one a job gets (snakemake/snakemake issue #281). A per-image job therefore takes
an exclusive ``flock`` on one lock file per GPU, in a folder shared by every run of the
machine's user, and computes on that GPU. The operating system releases a lock when its
process ends, however it ends (SIGKILL included), so a crashed job never keeps a GPU.

The lock files live in a folder on this machine's own disk, ``/tmp`` whatever
``$TMPDIR`` says; one that refuses locks is said in one line before any job
(`multigeom_workflow.compute.lock_folder`).

A GPU slice (MIG) is a slot of its own, but a CUDA process can enumerate only one MIG
device whatever ``CUDA_VISIBLE_DEVICES`` lists (NVIDIA's MIG User Guide, "CUDA device
enumeration"; pytorch #102715, #92315: ``cuda:1`` is "invalid device ordinal"). So
when a slot is a slice, the process that computes on it is narrowed to it
(`Slot.environment`: ``CUDA_VISIBLE_DEVICES`` of that one id) and computes on
``cuda:0``.

CPU shares belong to one run (``run-<pid>/cpuN.lock``, the pid of its Snakemake
process): an unrelated run of the same user never holds this run's share. Whoever
computes on a slot (a warm worker, or a cold job) also holds the slot's compute lock
(`compute_lock`) for as long as it computes, so that a worker left over from a killed
run can never compute on a GPU beside the next run's. The next run removes the folders
of runs that ended (`clean_ended_runs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from ..processes import alive as _alive
from .lock_folder import (
    LOCK_DIR_ENV,
    SlotLockError,
    default_lock_dir,
    flock,
    lock_dir,
    slot_lock_problem,
)

__all__ = [
    "LOCK_DIR_ENV",
    "VISIBLE_GPUS_ENV",
    "Slot",
    "SlotLockError",
    "allocation_cpus",
    "allocation_lock_dir",
    "clean_ended_allocations",
    "clean_ended_runs",
    "compute_lock",
    "hold_cpu",
    "hold_gpu",
    "hold_slot",
    "lock_dir",
    "default_lock_dir",
    "device_kind",
    "gpu_index",
    "is_mig_device",
    "narrowed_ids",
    "resolve_device",
    "run_dir",
    "slot_file_name",
    "slot_lock_problem",
    "stop_gpu",
    "stopped_gpus",
    "visible_gpu_ids",
]


#: The environment variable that tells a process narrowed to one GPU slice how many
#: GPUs (or slices) the run's processes share the CPU cores with
#: (`multigeom_workflow.compute.engine.cpu_threads`): it sees only its own.
VISIBLE_GPUS_ENV = "MULTIGEOM_VISIBLE_GPUS"


def is_mig_device(gpu_id: str) -> bool:
    """
    Whether `gpu_id` names a GPU slice (MIG device) as ``CUDA_VISIBLE_DEVICES`` and
    ``nvidia-smi -L`` write it: ``MIG-<uuid>`` (drivers >= R470) or
    ``MIG-GPU-<uuid>/<gpu instance>/<compute instance>`` (R450; CUDA's
    ``CUDA_VISIBLE_DEVICES`` documentation).
    """
    return str(gpu_id).strip().startswith("MIG-")


def narrowed_ids(ids: list[str]) -> bool:
    """
    Whether the processes that compute on the GPUs `ids` must each be narrowed to its
    own GPU (``CUDA_VISIBLE_DEVICES`` of one id, ``cuda:0``): when any of them is a
    slice, since a CUDA process enumerates only one MIG device (the first it is
    shown), so that ``cuda:<position>`` names no device past the first slice.
    """
    return any(is_mig_device(i) for i in ids)


def _ids_of_nvidia_smi_list(text: str) -> list[str]:
    """
    The GPUs of ``nvidia-smi -L``: each GPU's index (``GPU 0: NVIDIA A100 ...``), or,
    for a GPU split into slices, its slices' ids (the indented ``MIG 1g.5gb Device
    0: (UUID: MIG-...)`` lines under it).
    """
    out: list[list[str]] = []
    for line in text.splitlines():
        gpu = re.match(r"\s*GPU (\d+):", line)
        mig = re.match(r"\s*MIG .*\(UUID: (MIG-[^)\s]+)\)", line)
        if gpu:
            out.append([gpu.group(1)])
        elif mig and out:
            if not is_mig_device(out[-1][0]):
                out[-1] = []  # a GPU in MIG mode: only its slices compute
            out[-1].append(mig.group(1))
    return [i for ids in out for i in ids]


def visible_gpu_ids() -> list[str]:
    """
    The GPUs this process may use, as ids: those of ``CUDA_VISIBLE_DEVICES`` when it is
    set (``"-1"`` or empty: none), else those ``nvidia-smi -L`` lists (a GPU's index,
    or its slices' ``MIG-...`` ids when it is split: `is_mig_device`), else none.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return _ids_of_nvidia_smi_list(out.stdout)


def resolve_device(device: str, gpu_ids: list[str] | None = None) -> str:
    """
    The device a per-image job computes on: ``"auto"`` and ``"cuda"`` are ``"cuda"``
    (any free GPU) when a GPU is visible, ``"cuda:N"`` that GPU, and all of them
    ``"cpu"`` when no GPU is visible (as the old helper fell back). `gpu_ids`: the
    visible GPUs, listed once per run (default: `visible_gpu_ids`).
    """
    ids = visible_gpu_ids() if gpu_ids is None else gpu_ids
    if device == "cpu" or not ids:
        return "cpu"
    return "cuda" if device == "auto" else device


def gpu_index(device: str) -> int | None:
    """N of a device ``"cuda:N"``; None for ``"cuda"`` (any GPU) and ``"cpu"``."""
    kind, _, index = str(device).partition(":")
    return int(index) if kind == "cuda" and index else None


def device_kind(device: str) -> str:
    """``"cpu"`` or ``"cuda"``, of a device string (``"cuda:1"`` is ``"cuda"``)."""
    return str(device).partition(":")[0]


def slot_file_name(kind: str, slot_id: str) -> str:
    """
    The name of a slot in file names (its lock, its worker's log and socket):
    ``<kind><id>``, with the ``/`` of an old-style MIG id
    (``MIG-GPU-<uuid>/<gi>/<ci>``) written ``_`` (never in an id).
    """
    return f"{kind}{slot_id}".replace("/", "_")


def run_dir(run_id: str | int) -> Path:
    """
    The folder of one run's CPU shares and warm workers' sockets:
    ``<lock_dir>/run-<run_id>`` (`run_id`: the pid of the run's Snakemake process).
    """
    folder = lock_dir() / f"run-{run_id}"
    folder.mkdir(exist_ok=True)
    return folder


def stop_gpu(run_id: str | int, gpu_id: str, why: str) -> Path:
    """
    Stop GPU `gpu_id` for the run `run_id`: no later job of the run holds it
    (`hold_gpu`), e.g. after its CUDA context failed in two workers in a row;
    `why` is kept in ``<run_dir>/gpu<id>.stopped``. Other runs are not affected (a
    new run tries the GPU again, in new processes).
    """
    marker = run_dir(run_id) / f"{slot_file_name('gpu', gpu_id)}.stopped"
    marker.write_text(why.strip() + "\n")
    return marker


def stopped_gpus(run_id: str | int) -> dict[str, str]:
    """The GPUs stopped for the run `run_id` (`stop_gpu`): id -> why."""
    out = {}
    for marker in run_dir(run_id).glob("gpu*.stopped"):
        try:
            gpu_id = marker.name[3 : -len(".stopped")].replace("_", "/")
            out[gpu_id] = marker.read_text().strip()
        except OSError:
            continue
    return out


def clean_ended_runs() -> list[Path]:
    """
    Remove the folders (CPU share locks, sockets) of runs whose Snakemake process has
    ended, e.g. one killed with SIGKILL; returns them.
    """
    removed = []
    short = Path("/tmp").glob(f"mgw-{os.getuid()}-run-*")  # sockets of long lock paths
    for folder in [*lock_dir().glob("run-*"), *short]:
        pid = folder.name.rpartition("run-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def allocation_cpus() -> int | None:
    """
    The CPU cores SLURM gave this allocation on this node (``SLURM_CPUS_ON_NODE``),
    or None outside an allocation: a shard's warm worker computes with them, not with
    the node's cores (other allocations share the node).
    """
    value = os.environ.get("SLURM_CPUS_ON_NODE", "")
    if not os.environ.get("SLURM_JOB_ID") or not value.isdigit():
        return None
    return max(int(value), 1)


#: Minutes a SLURM allocation's folder of locks and sockets may stand without a live
#: run before another allocation on the node removes it.
ALLOCATION_FOLDER_AGE_MIN = 10.0


def clean_ended_allocations(own_job: str) -> list[Path]:
    """
    Remove the lock folders (``<lock_dir>/slurm-<jobid>``) of SLURM allocations that
    ended on this node: none of their runs' Snakemake processes is alive and the
    folder is older than `ALLOCATION_FOLDER_AGE_MIN` (one just starting is left
    alone). Called by each new allocation (`own_job`, never removed).
    """
    removed = []
    now = time.time()
    for folder in lock_dir().glob("slurm-*"):
        if folder.name == f"slurm-{own_job}" or not folder.is_dir():
            continue
        try:
            age_min = (now - folder.stat().st_mtime) / 60
        except OSError:
            continue
        runs = [r.name.rpartition("run-")[2] for r in folder.glob("run-*")]
        alive = any(pid.isdigit() and _alive(int(pid)) for pid in runs)
        if not alive and age_min >= ALLOCATION_FOLDER_AGE_MIN:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def allocation_lock_dir(job_id: str) -> Path:
    """
    The folder of one SLURM allocation's slot locks and sockets,
    ``<lock_dir>/slurm-<jobid>`` (SLURM numbers every allocation's GPUs from 0, and
    allocations may share a node), removed when this process (the allocation's
    first Snakemake) exits; one left by an allocation killed first goes with the
    next allocation on the node (`clean_ended_allocations`).
    """
    import atexit

    clean_ended_allocations(job_id)
    folder = lock_dir() / f"slurm-{job_id}"
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@contextlib.contextmanager
def compute_lock(kind: str, slot_id: str, run_id: str | int):
    """
    Hold the compute lock of a slot for the duration of the block, waiting for it:
    ``<lock_dir>/gpu<id>.compute.lock`` for a GPU (machine-wide),
    ``cpu<i>.compute.lock`` in the run's folder for a CPU share. Only its holder
    computes on the slot; the operating system releases it when the holder ends,
    however it ends.

    Raises
    ------
    SlotLockError
        If the folder refuses file locks (one line, `slot_lock_problem`).
    """
    folder = lock_dir() if kind == "gpu" else run_dir(run_id)
    with open(folder / f"{slot_file_name(kind, slot_id)}.compute.lock", "a+") as handle:
        flock(handle, fcntl.LOCK_EX, folder)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Slot:
    """
    A GPU (or a CPU share) held by this process: its kind (``"gpu"`` or ``"cpu"``), its
    id (for a GPU, as ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi`` names it), its
    position among the `count` slots of its kind, and whether the process that
    computes on it is narrowed to it (`narrowed_ids`: GPU slices).
    """

    def __init__(
        self,
        kind: str,
        slot_id: str,
        position: int,
        handle,
        *,
        narrowed: bool = False,
        count: int = 1,
    ):
        self.kind, self.slot_id, self.position = kind, slot_id, position
        self.narrowed, self.count = narrowed and kind == "gpu", count
        self._handle = handle

    @property
    def device(self) -> str:
        """
        The torch device: ``cuda:<position among the visible GPUs>``, ``cuda:0`` in
        a process narrowed to its GPU (`environment`), or ``cpu``.
        """
        if self.kind != "gpu":
            return "cpu"
        return "cuda:0" if self.narrowed else f"cuda:{self.position}"

    def environment(self) -> dict[str, str]:
        """
        What the environment of the process that computes on this slot must hold (a
        warm worker's, or a cold job's before it initialises CUDA): for a narrowed
        GPU, ``CUDA_VISIBLE_DEVICES`` of its id alone and `VISIBLE_GPUS_ENV` (the
        run's GPU count, for the CPU share); else nothing.
        """
        if not self.narrowed:
            return {}
        return {"CUDA_VISIBLE_DEVICES": self.slot_id, VISIBLE_GPUS_ENV: str(self.count)}


@contextlib.contextmanager
def hold_slot(
    kind: str,
    ids: list[str],
    *,
    want: int | None = None,
    poll_s=0.2,
    folder: Path | None = None,
    stopped=None,
    narrow: bool = False,
):
    """
    Hold one slot of `kind` for the duration of the block: the first free one of `ids`,
    or the one at position `want` among them, waiting until one is free. The slot is an
    exclusive ``flock`` on ``<folder>/<kind><id>.lock`` (default folder: `lock_dir`).
    `stopped`, a callable giving id -> why, names slots not to hold (read again while
    waiting); positions stay those among `ids` (a slot's device is ``cuda:<position>``,
    or ``cuda:0`` with `narrow`: `Slot.environment`).

    Yields
    ------
    Slot

    Raises
    ------
    SlotLockError
        If the folder refuses file locks (one line naming it, the error and the fix).
    RuntimeError
        If there is no slot to hold, `want` is not a position among them, or every
        slot it may hold is stopped.
    """
    if not ids:
        raise RuntimeError(f"no {kind} slot to hold")
    if want is not None and not 0 <= want < len(ids):
        raise RuntimeError(f"{kind} {want} asked for, but there are {len(ids)}")
    positions = [want] if want is not None else list(range(len(ids)))
    folder = lock_dir() if folder is None else folder
    # Start at a different slot in each process, so that waiting jobs spread out.
    shift = os.getpid() % len(positions)
    order = positions[shift:] + positions[:shift]
    while True:
        out = stopped() if stopped is not None else {}
        if all(ids[p] in out for p in order):
            said = "; ".join(f"{kind} {ids[p]}: {out[ids[p]]}" for p in order)
            raise RuntimeError(f"every {kind} this job may use is stopped ({said})")
        for position in order:
            if ids[position] in out:
                continue
            handle = open(folder / f"{slot_file_name(kind, ids[position])}.lock", "a+")
            try:
                flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB, folder)
            except BlockingIOError:
                handle.close()
                continue
            except SlotLockError:
                handle.close()
                raise
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                yield Slot(
                    kind, ids[position], position, handle, narrowed=narrow,
                    count=len(ids),
                )  # fmt: skip
                return
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
        time.sleep(poll_s)


def hold_gpu(
    ids: list[str] | None = None,
    *,
    want: int | None = None,
    poll_s=0.2,
    run_id: str | int | None = None,
):
    """
    Hold one GPU (`hold_slot` over `ids`, default `visible_gpu_ids`), or GPU `want`;
    with `run_id`, none that is stopped for that run (`stop_gpu`). When any of `ids`
    is a GPU slice, the slot is narrowed (`narrowed_ids`, `Slot.environment`).

    Raises
    ------
    RuntimeError
        If no GPU is visible, `want` is not one of them, or every GPU it may hold is
        stopped.
    """
    ids = visible_gpu_ids() if ids is None else list(ids)
    if not ids:
        raise RuntimeError("no GPU is visible (CUDA_VISIBLE_DEVICES, nvidia-smi)")
    if want is not None and not 0 <= want < len(ids):
        raise RuntimeError(f"cuda:{want} asked for, but {len(ids)} GPU(s) are visible")
    stopped = None if run_id is None else (lambda: stopped_gpus(run_id))
    return hold_slot(
        "gpu", ids, want=want, poll_s=poll_s, stopped=stopped, narrow=narrowed_ids(ids)
    )


def hold_cpu(n_slots: int, *, run_id: str | int | None = None, poll_s=0.2):
    """
    Hold one of `n_slots` CPU shares (one per per-image job running at once) of the
    run `run_id` (its own folder, `run_dir`; default: the machine's user's folder).
    """
    folder = None if run_id is None else run_dir(run_id)
    ids = [str(i) for i in range(max(n_slots, 1))]
    return hold_slot("cpu", ids, poll_s=poll_s, folder=folder)
