"""Writing files so that a killed job never leaves one that looks finished."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(final: str | Path):
    """
    A temporary path beside `final`; when the block ends without an error it is renamed
    to `final` (``os.replace``, atomic on POSIX), otherwise it is deleted.

    The temporary name starts with ``.`` and ends with ``.part``, so no pattern of the
    workflow (``img*.pt``, ``*.json``) matches it.

    Yields
    ------
    Path
        Where to write.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{final.name}.", suffix=".part", dir=final.parent
    )
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        tmp.replace(final)
    finally:
        tmp.unlink(missing_ok=True)
