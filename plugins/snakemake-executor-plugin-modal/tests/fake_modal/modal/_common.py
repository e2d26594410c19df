"""Shared helpers of the fake: root folder, per-volume locks, atomic file copies."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fake_root() -> Path:
    """Absolute path of ``$FAKE_MODAL_DIR`` (created if needed).

    RuntimeError if unset.
    """
    value = os.environ.get("FAKE_MODAL_DIR")
    if not value:
        raise RuntimeError(
            "fake modal: the environment variable FAKE_MODAL_DIR is not set; it must "
            "name the folder where the fake keeps volumes/, containers/ and "
            "calls.jsonl"
        )
    root = Path(value).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def locked(name: str) -> Iterator[None]:
    """Exclusive inter-process lock ``$FAKE_MODAL_DIR/locks/<name>.lock`` (flock)."""
    lock_dir = fake_root() / "locks"
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tmp_path(dst: Path) -> Path:
    """A fresh temp file on the same file system as ``dst``, outside any volume."""
    tmp_dir = fake_root() / "tmp"
    tmp_dir.mkdir(exist_ok=True)
    fd, name = tempfile.mkstemp(dir=tmp_dir, prefix=dst.name[:50] + ".")
    os.close(fd)
    return Path(name)


def atomic_copy(src: Path, dst: Path, mode: int | None = None) -> None:
    """Copy ``src`` to ``dst`` (contents, mtime, mode) via a temp file and rename."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(dst)
    try:
        shutil.copy2(src, tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(data: bytes, dst: Path, mode: int | None = None) -> None:
    """Write ``data`` to ``dst`` through a temp file and rename."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(dst)
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def scan(folder: Path) -> dict[str, list[int]]:
    """``{relative posix path: [size, mtime_ns]}`` of regular files under ``folder``."""
    out: dict[str, list[int]] = {}
    for dirpath, _dirs, files in os.walk(folder):
        for fname in files:
            p = Path(dirpath, fname)
            if p.is_file():
                st = p.stat()
                out[p.relative_to(folder).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out
