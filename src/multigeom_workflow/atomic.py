"""Writing files so that a killed job never leaves one that looks finished."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from pathlib import Path

__all__ = ["atomic_path", "error_reason", "write_error_line"]

#: What torch's file writer says when the disk fills up under it (its zip writer
#: checks positions: ``[enforce fail at inline_container.cc:...] . unexpected pos``).
TORCH_WRITE_FAILURES = (
    "unexpected pos",
    "PytorchStreamWriter failed",
    "file write failed",
)


@contextlib.contextmanager
def atomic_path(final: str | Path):
    """
    A temporary path beside `final`, not yet created; when the block ends without an
    error it is renamed to `final` (``os.replace``, atomic on POSIX), otherwise it is
    deleted if it exists.

    The temporary name starts with ``.`` and ends with ``.part``, so no pattern of the
    workflow (``img*.pt``, ``*.json``) matches it.

    Yields
    ------
    Path
        Where to write.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Not created here (mkstemp would make it private, mode 0600): the writer creates
    # it with the user's usual permissions.
    tmp = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
    try:
        yield tmp
        tmp.replace(final)
    finally:
        tmp.unlink(missing_ok=True)


def error_reason(err: OSError) -> str:
    """An OSError in a few words for a line of the run's output: its class and the
    system's message (``PermissionError: Operation not permitted``).
    """
    return f"{type(err).__name__}: {err.strerror or err}"


def write_error_line(err: BaseException, path: str | Path) -> str | None:
    """
    One line for an error met while writing `path` (a full disk, a read-only folder),
    naming the file, the folder's free space and what to do; None for other errors.

    A full disk reaches us as ``OSError(ENOSPC)`` or, from `torch.save`, as a
    ``RuntimeError`` of its zip writer (``[enforce fail at inline_container.cc:664] .
    unexpected pos ...``); a read-only folder as ``EROFS`` / ``EACCES``.
    """
    path = Path(path)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    code = getattr(err, "errno", None)
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"{path}: could not be written, {folder} is read-only for this user "
            f"({os.strerror(code)}); fix its permissions, or set runs_dir to a folder "
            "you can write to, and run again"
        )
    text = str(err)
    if code in (errno.ENOSPC, errno.EDQUOT) or any(
        s in text for s in TORCH_WRITE_FAILURES
    ):
        try:
            free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free"
        except OSError:
            free = "free space unknown"
        return (
            f"{path}: could not be written, the disk of {folder} is full ({free}); "
            "free space (or set runs_dir to another disk) and run again"
        )
    return None
