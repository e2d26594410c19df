"""
The folder of the GPU slot locks (`multigeom_workflow.compute.gpus`), on this machine's
own disk, and one line when it cannot hold them.

A slot is an ``flock`` on a file of this folder. ``flock`` fails with ENOLCK or ENOSYS
(sometimes EOPNOTSUPP) on network file systems mounted without lock support, such as
NFS whose lock daemon does not answer and Lustre mounted without ``flock``
(huggingface_hub #2399, datasets #2618); and where a network file system does lock, the
lock is shared by every machine that mounts it, so that GPU 0 of one node would wait
for GPU 0 of another. Clusters often point ``$TMPDIR`` at such a file system, so the
default folder is in ``/tmp`` whatever ``$TMPDIR`` says (`default_lock_dir`). A folder
that refuses locks (chosen with ``$MULTIGEOM_GPU_LOCK_DIR``, or a ``/tmp`` that does)
is said in one line before any job (`slot_lock_problem`), naming the folder, its file
system, the error and the setting that fixes it; a job that meets it anyway fails with
the same line (`SlotLockError`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

__all__ = [
    "LOCK_DIR_ENV",
    "SlotLockError",
    "default_lock_dir",
    "flock",
    "lock_dir",
    "slot_lock_problem",
]

#: The environment variable that chooses the folder of the slot locks (`lock_dir`).
LOCK_DIR_ENV = "MULTIGEOM_GPU_LOCK_DIR"


class SlotLockError(RuntimeError):
    """The folder of the slot locks cannot hold them (one line: `slot_lock_problem`)."""


def default_lock_dir() -> Path:
    """
    The folder of the slot locks when ``$MULTIGEOM_GPU_LOCK_DIR`` is unset:
    ``/tmp/multigeom-workflow-<uid>``, whatever ``$TMPDIR`` says.

    ``/tmp`` is on the machine's own disk (or memory) on every Linux system, where
    ``flock`` works and is seen by this machine's processes only: GPU slots are this
    machine's. ``$TMPDIR`` is often a network file system on clusters; ``/dev/shm``
    and ``/run/user/<uid>`` are emptied of a user's files when the user's last
    session ends (systemd-logind's ``RemoveIPC``, pam_systemd), under a run started
    with ``nohup`` that goes on.
    """
    base = Path("/tmp") if os.path.isdir("/tmp") else Path(tempfile.gettempdir())
    return base / f"multigeom-workflow-{os.getuid()}"


def lock_dir() -> Path:
    """
    The folder of the slot lock files (and of the workers' sockets):
    ``$MULTIGEOM_GPU_LOCK_DIR``, else `default_lock_dir`, shared by every run of the
    user on this machine; made if missing.

    Raises
    ------
    SlotLockError
        One line naming the folder, why it cannot be made and the fix.
    """
    env = os.environ.get(LOCK_DIR_ENV)
    folder = Path(env) if env else default_lock_dir()
    try:
        if env:
            folder.mkdir(parents=True, exist_ok=True)
        else:  # in /tmp: the user's own
            folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as err:
        raise SlotLockError(_refused_line(folder, err, "cannot be made")) from None
    return folder


def _file_system(folder: Path) -> str | None:
    """The type of the file system `folder` is on (``/proc/self/mounts``), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    path, best, kind = os.path.realpath(folder), "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _refused_line(folder: Path, err: OSError, what: str = "refuses file locks") -> str:
    """One line: the lock folder `folder`, the error, and the setting that fixes it."""
    code = errno.errorcode.get(err.errno or 0, type(err).__name__)
    fs = _file_system(folder)
    on = f" (file system {fs})" if fs else ""
    chosen = os.environ.get(LOCK_DIR_ENV)
    if chosen:
        fix = (
            f"set {LOCK_DIR_ENV} to a folder on this machine's own disk (e.g. "
            f"{default_lock_dir()}), or unset it for that default"
        )
    else:
        fix = (
            f"set {LOCK_DIR_ENV} to a folder on this machine's own disk where "
            f"flock works (e.g. /var/tmp/multigeom-workflow-{os.getuid()})"
        )
    return (
        f"GPU slot locks: the folder {folder}{on} {what} ({code}: {err.strerror}); "
        f"no per-image job can hold a GPU or CPU share there; {fix}"
    )


def flock(handle, flags: int, folder: Path) -> None:
    """
    ``fcntl.flock`` `handle` (an open file of `folder`) with `flags`.

    Raises
    ------
    BlockingIOError
        With ``LOCK_NB``, when another process holds the lock.
    SlotLockError
        When the file system refuses the lock (any other error): one line naming
        `folder`, the error and the fix.
    """
    try:
        fcntl.flock(handle, flags)
    except BlockingIOError:
        raise
    except OSError as err:  # ENOLCK, ENOSYS, EOPNOTSUPP...: locks refused here
        raise SlotLockError(_refused_line(folder, err)) from err


def slot_lock_problem(folder: Path | None = None) -> str | None:
    """
    Whether the slot locks can be held in `folder` (default: `lock_dir`): None if so,
    else the one line that says why not and what to set (the run stops with it
    before any job).

    Parameters
    ----------
    folder : Path, optional
        The folder to try, e.g. a SLURM allocation's
        (`multigeom_workflow.compute.gpus.allocation_lock_dir`).

    Returns
    -------
    str or None
        ``"GPU slot locks: the folder ... refuses file locks (ENOLCK: No locks
        available); ...; set MULTIGEOM_GPU_LOCK_DIR to ..."``, or None.
    """
    try:
        folder = lock_dir() if folder is None else Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / "probe.lock", "a+")
    except SlotLockError as err:
        return str(err)
    except OSError as err:
        return _refused_line(Path(folder), err, "cannot be written")
    with handle:
        try:
            flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB, folder)
        except BlockingIOError:  # another run is trying it too: locks work
            return None
        except SlotLockError as err:
            return str(err)
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None
