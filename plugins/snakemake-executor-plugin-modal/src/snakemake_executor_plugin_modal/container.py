"""
What runs inside the Modal container: stage the job's files from the volume, run the
command Snakemake formatted for the job, and put its results back on the volume.

Only the standard library and ``modal`` are used here, so the container needs nothing
but this module (added to the image as local Python source).

The job runs in a scratch folder of the container, not on the volume: a file appears on
the volume only once it is finished (written to a temporary name, then renamed, then
committed), so a job that is preempted or killed leaves no partial output there.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["JOB_LOG", "run_job"]

#: Where, below the working directory, the container's log of a job is written.
JOB_LOG = ".snakemake/modal/{name}.log"


def run_job(spec: dict) -> dict:
    """
    Run one Snakemake job in this container.

    Parameters
    ----------
    spec : dict
        ``mount`` (where the volume is mounted), ``volume`` (its name), ``prefix``
        (this working directory's folder on the volume), ``stage`` (paths relative to
        the working directory to copy from the volume before the job: workflow sources
        and the job's inputs), ``command`` (the shell command), ``env`` (extra
        environment variables), ``outputs`` (paths the job writes: outputs, logs,
        benchmarks), ``log`` (where to write the job's stdout and stderr), and
        ``sync_every_s`` (seconds between commits of finished outputs while it runs).

    Returns
    -------
    dict
        ``returncode`` (int), ``seconds`` (float, wall-clock of the command),
        ``log_tail`` (str, the last 40 lines of the job's log), ``synced`` (paths now
        on the volume).
    """
    import modal

    volume = modal.Volume.from_name(spec["volume"])
    root = Path(spec["mount"]) / spec["prefix"]
    work = Path(tempfile.mkdtemp(prefix="snakemake-job-"))
    for rel in spec["stage"]:
        _copy(root / rel, work / rel)

    log = work / spec["log"]
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.get("env", {})}
    started = time.monotonic()
    done = threading.Event()
    synced: set[str] = set()

    def sync() -> None:
        changed = _sync_finished(work, root, spec["outputs"], synced)
        if changed:
            volume.commit()

    def sync_periodically() -> None:
        while not done.wait(spec.get("sync_every_s", 30)):
            sync()

    syncer = threading.Thread(target=sync_periodically, daemon=True)
    syncer.start()
    with open(log, "wb") as out:
        proc = subprocess.run(
            spec["command"],
            shell=True,
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    seconds = time.monotonic() - started
    done.set()
    syncer.join()
    _copy_atomically(log, root / spec["log"])
    sync()
    volume.commit()
    tail = log.read_text(errors="replace").splitlines()[-40:]
    return {
        "returncode": proc.returncode,
        "seconds": seconds,
        "log_tail": "\n".join(tail),
        "synced": sorted(synced),
    }


def _sync_finished(work: Path, root: Path, paths: list[str], synced: set[str]) -> bool:
    """Copy the finished, not yet copied files among ``paths`` to the volume."""
    changed = False
    for rel in paths:
        if rel in synced or not (work / rel).exists() or _incomplete(work, rel):
            continue
        _copy_atomically(work / rel, root / rel)
        synced.add(rel)
        changed = True
    return changed


def _incomplete(work: Path, rel: str) -> bool:
    """
    Whether Snakemake still marks the output ``rel`` as being written.

    Snakemake's file persistence records a started output as the file
    ``.snakemake/incomplete/<urlsafe base64 of the path>``, cut into folder names of at
    most 254 characters, all but the last prefixed with ``@``
    (``snakemake.persistence.file``, Snakemake 9).
    """
    b64 = base64.urlsafe_b64encode(rel.encode()).decode()
    parts = [b64[i : i + 254] for i in range(0, len(b64), 254)]
    parts = ["@" + p for p in parts[:-1]] + parts[-1:]
    return work.joinpath(".snakemake", "incomplete", *parts).exists()


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def _copy_atomically(src: Path, dst: Path) -> None:
    """Copy a file or folder so that ``dst`` never exists half-written."""
    tmp = dst.with_name(f".{dst.name}.part-{os.getpid()}")
    _copy(src, tmp)
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
