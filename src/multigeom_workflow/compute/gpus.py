"""
One GPU per job: which GPUs this machine shows, and a slot on one of them held for the
job's lifetime.

Snakemake counts GPUs (``resources: gpu=1``, ``--resources gpu=N``) but does not say
which one a job gets (snakemake/snakemake issue #281). A per-image job therefore takes
an exclusive ``flock`` on one lock file per GPU, in a folder shared by every run of the
machine's user, and computes on that GPU. The operating system releases a lock when its
process ends, however it ends (SIGKILL included), so a crashed job never keeps a GPU.

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
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = [
    "Slot",
    "allocation_cpus",
    "allocation_lock_dir",
    "clean_ended_allocations",
    "clean_ended_runs",
    "compute_lock",
    "hold_cpu",
    "hold_gpu",
    "hold_slot",
    "lock_dir",
    "device_kind",
    "gpu_index",
    "resolve_device",
    "run_dir",
    "stop_gpu",
    "stopped_gpus",
    "visible_gpu_ids",
]


def visible_gpu_ids() -> list[str]:
    """
    The GPUs this process may use, as ids: those of ``CUDA_VISIBLE_DEVICES`` when it is
    set (``"-1"`` or empty: none), else the indices ``nvidia-smi`` lists, else none.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        return [] if not ids or ids[0] == "-1" else ids
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


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


def lock_dir() -> Path:
    """
    The folder of the slot lock files (and of the workers' sockets):
    ``$MULTIGEOM_GPU_LOCK_DIR``, else one per user in the temporary folder, shared by
    every run on this machine.
    """
    env = os.environ.get("MULTIGEOM_GPU_LOCK_DIR")
    folder = (
        Path(env)
        if env
        else Path(tempfile.gettempdir()) / (f"multigeom-workflow-{os.getuid()}")
    )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
    marker = run_dir(run_id) / f"gpu{gpu_id}.stopped"
    marker.write_text(why.strip() + "\n")
    return marker


def stopped_gpus(run_id: str | int) -> dict[str, str]:
    """The GPUs stopped for the run `run_id` (`stop_gpu`): id -> why."""
    out = {}
    for marker in run_dir(run_id).glob("gpu*.stopped"):
        try:
            out[marker.name[3 : -len(".stopped")]] = marker.read_text().strip()
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
    """
    folder = lock_dir() if kind == "gpu" else run_dir(run_id)
    with open(folder / f"{kind}{slot_id}.compute.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Slot:
    """
    A GPU (or a CPU share) held by this process: its kind (``"gpu"`` or ``"cpu"``), its
    id (for a GPU, as ``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi`` names it) and its
    position among the slots of its kind.
    """

    def __init__(self, kind: str, slot_id: str, position: int, handle):
        self.kind, self.slot_id, self.position = kind, slot_id, position
        self._handle = handle

    @property
    def device(self) -> str:
        """The torch device: ``cuda:<position among the visible GPUs>``, or ``cpu``."""
        return f"cuda:{self.position}" if self.kind == "gpu" else "cpu"


@contextlib.contextmanager
def hold_slot(
    kind: str,
    ids: list[str],
    *,
    want: int | None = None,
    poll_s=0.2,
    folder: Path | None = None,
    stopped=None,
):
    """
    Hold one slot of `kind` for the duration of the block: the first free one of `ids`,
    or the one at position `want` among them, waiting until one is free. The slot is an
    exclusive ``flock`` on ``<folder>/<kind><id>.lock`` (default folder: `lock_dir`).
    `stopped`, a callable giving id -> why, names slots not to hold (read again while
    waiting); positions stay those among `ids` (a slot's device is ``cuda:<position>``).

    Yields
    ------
    Slot

    Raises
    ------
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
            handle = open(folder / f"{kind}{ids[position]}.lock", "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                yield Slot(kind, ids[position], position, handle)
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
    with `run_id`, none that is stopped for that run (`stop_gpu`).

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
    return hold_slot("gpu", ids, want=want, poll_s=poll_s, stopped=stopped)


def hold_cpu(n_slots: int, *, run_id: str | int | None = None, poll_s=0.2):
    """
    Hold one of `n_slots` CPU shares (one per per-image job running at once) of the
    run `run_id` (its own folder, `run_dir`; default: the machine's user's folder).
    """
    folder = None if run_id is None else run_dir(run_id)
    ids = [str(i) for i in range(max(n_slots, 1))]
    return hold_slot("cpu", ids, poll_s=poll_s, folder=folder)
