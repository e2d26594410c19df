"""Writing files so that a killed job never leaves one that looks finished."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

__all__ = ["atomic_path"]


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
