"""Fake ``modal.Volume``.

A folder ``$FAKE_MODAL_DIR/volumes/<name>/`` of committed files. Clients (the test
process) only ever see committed files. A container sees its own view, a copy made at
spawn time (see ``modal`` module docstring); ``commit()`` inside the
container pushes the view's changes into the committed folder, ``reload()`` pulls other
commits into the view. Both are no-ops in the client, as with real Modal.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from ._common import atomic_copy, atomic_write, fake_root, locked, scan
from .exception import AuthError, InvalidError, NotFoundError, _PathNotFoundError

_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,64}$")
_CHUNK = 1 << 20


class FileEntryType(enum.IntEnum):
    """Type of a file entry listed from a volume (same values as real Modal)."""

    UNSPECIFIED = 0
    FILE = 1
    DIRECTORY = 2
    SYMLINK = 3
    FIFO = 4
    SOCKET = 5


@dataclass(frozen=True)
class FileEntry:
    """A listed volume entry.

    ``path`` is relative to the volume root, without leading "/".
    """

    path: str
    type: FileEntryType
    mtime: int
    size: int


def _rel(path: str | PurePosixPath) -> str:
    """Volume-relative posix path.

    "/a/b", "a/b/" and "a/./b" all give "a/b"; root gives "".
    """
    parts = [p for p in PurePosixPath(str(path)).parts if p not in ("/", ".")]
    if ".." in parts:
        raise InvalidError(f"fake modal: '..' is not allowed in volume paths: {path!r}")
    return "/".join(parts)


def _volume_dir(name: str) -> Path:
    return fake_root() / "volumes" / name


def _mounted_views() -> dict[str, str]:
    """Inside a container: ``{volume name: view folder}`` of its mounted volumes."""
    return json.loads(os.environ.get("FAKE_MODAL_MOUNTS") or "{}")


class Volume:
    """A named volume.

    Obtain one with ``Volume.from_name``; do not construct directly.
    """

    def __init__(self, name: str, _view: str | None = None):
        self.name = name
        self.object_id = f"vo-fake-{name}"
        self._view = Path(_view) if _view else None

    def __repr__(self) -> str:
        suffix = " (mounted view)" if self._view else ""
        return f"<fake modal.Volume {self.name!r}{suffix}>"

    @staticmethod
    def from_name(
        name: str,
        *,
        environment_name: str | None = None,
        create_if_missing: bool = False,
        version: Any = None,
        create_options: Any = None,
        client: Any = None,
    ) -> Volume:
        """Reference volume ``name``, lazily as Modal 1.6 does (``_Volume.from_name``
        in ``modal/volume.py`` only builds a loader): a volume that does not exist
        raises ``NotFoundError`` at its first use (``hydrate()``, ``listdir``, ...),
        or is created then if ``create_if_missing``."""
        if not _NAME_RE.match(name):
            raise InvalidError(f"fake modal: invalid volume name {name!r}")
        volume = Volume(name, _mounted_views().get(name))
        volume._create_if_missing = create_if_missing
        return volume

    def hydrate(self, client=None) -> Volume:
        """Look the volume up now (``_Object.hydrate``, ``modal/_object.py``)."""
        self._committed  # noqa: B018 - the lookup
        return self

    # -- committed-store helpers -----------------------------------------------
    @property
    def _committed(self) -> Path:
        if self._view is None and os.environ.get("FAKE_MODAL_TOKEN_REJECTED") == "1":
            # the client's first request to the server: a refused token fails here
            raise AuthError("Token ID is malformed or invalid (fake: token rejected)")
        folder = _volume_dir(self.name)
        if not folder.is_dir():
            if not getattr(self, "_create_if_missing", False):
                raise NotFoundError(f"Volume '{self.name}' not found")
            folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _entry(self, p: Path) -> FileEntry:
        st = p.lstat()
        if p.is_symlink():
            kind = FileEntryType.SYMLINK
        elif p.is_dir():
            kind = FileEntryType.DIRECTORY
        elif p.is_file():
            kind = FileEntryType.FILE
        else:
            kind = FileEntryType.UNSPECIFIED
        rel = p.relative_to(self._committed).as_posix()
        return FileEntry(
            path=rel,
            type=kind,
            mtime=int(st.st_mtime),
            size=st.st_size if kind == FileEntryType.FILE else 0,
        )

    # -- public API ------------------------------------------------------------
    def listdir(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        """Entries under ``path`` ("/" or "" is the root).

        A file path lists just that file.
        """
        if path.endswith("*"):
            raise InvalidError("Glob patterns in `Volume.listdir()` are not supported")
        target = self._committed / _rel(path)
        if not target.exists():
            raise NotFoundError(
                f"No such file or directory: {path!r} in volume '{self.name}'"
            )
        if not target.is_dir():
            return [self._entry(target)]
        children = target.rglob("*") if recursive else target.iterdir()
        return [self._entry(p) for p in sorted(children)]

    def read_file(self, path: str) -> Iterator[bytes]:
        """Yield the committed file's bytes in chunks.

        Missing file: NotFoundError/FileNotFoundError (raised on first iteration, like
        real Modal's generator).
        """
        target = self._committed / _rel(path)
        if not target.is_file():
            raise _PathNotFoundError(f"No such file: {path!r} in volume '{self.name}'")
        with open(target, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                yield chunk

    def remove_file(self, path: str, recursive: bool = False) -> None:
        """Remove a committed file, or a directory when ``recursive``."""
        rel = _rel(path)
        if not rel:
            raise InvalidError("fake modal: refusing to remove the volume root")
        target = self._committed / rel
        with locked(f"volume-{self.name}"):
            if not (target.exists() or target.is_symlink()):
                raise _PathNotFoundError(
                    f"No such file or directory: {path!r} in volume '{self.name}'"
                )
            if target.is_dir() and not target.is_symlink():
                if not recursive:
                    raise InvalidError(f"{path!r} is a directory; pass recursive=True")
                shutil.rmtree(target)
            else:
                target.unlink()

    @contextmanager
    def batch_upload(self, force: bool = False) -> Iterator[_BatchUpload]:
        """Collect ``put_file``/``put_directory`` calls; write them when the block ends.

        Each file is written atomically (temp file + rename). With ``force=False`` an
        already existing remote file makes the whole batch fail with
        ``FileExistsError`` before any write.
        """
        batch = _BatchUpload()
        yield batch  # an exception in the block propagates and nothing is uploaded
        _upload_fault()
        batch._flush(self, force)

    def commit(self) -> None:
        """In a container with this volume mounted: push the view's changes.

        Client: no-op.

        Changes are relative to the view's baseline (its state at spawn, last commit or
        reload), so files other containers committed meanwhile are never deleted.
        """
        if self._view is None:
            return
        _commit_fault()
        self._push()

    def _push(self) -> None:
        """Push the view's changes into the committed folder (see ``commit``)."""
        committed = self._committed
        with locked(f"volume-{self.name}"):
            baseline = _load_baseline(self._view)
            current = scan(self._view)
            for rel, stat in current.items():
                if baseline.get(rel) != stat:  # new or changed
                    atomic_copy(self._view / rel, committed / rel)
            for rel in baseline:
                if rel not in current:  # deleted in the view
                    (committed / rel).unlink(missing_ok=True)
            for dirpath, _dirs, _files in os.walk(self._view):  # empty folders, too
                rel_dir = Path(dirpath).relative_to(self._view)
                (committed / rel_dir).mkdir(parents=True, exist_ok=True)
            _save_baseline(self._view, current)

    def reload(self) -> None:
        """In a container: bring other commits into the view.

        Files changed locally and not yet committed are kept. Client: no-op.
        """
        if self._view is None:
            return
        committed = self._committed
        with locked(f"volume-{self.name}"):
            baseline = _load_baseline(self._view)
            current = scan(self._view)
            remote = scan(committed)
            for rel, stat in remote.items():
                unchanged_here = current.get(rel) == baseline.get(rel)
                if unchanged_here and stat != baseline.get(rel):
                    atomic_copy(committed / rel, self._view / rel)
                    st = (self._view / rel).stat()
                    baseline[rel] = [st.st_size, st.st_mtime_ns]
            for rel in list(baseline):
                if rel not in remote and current.get(rel) == baseline[rel]:
                    (self._view / rel).unlink(missing_ok=True)
                    del baseline[rel]
            _save_baseline(self._view, baseline)


_UPLOAD_ERRORS: dict[str, int | None] = {"left": None}


def _upload_fault() -> None:
    """
    Fault injection (``FAKE_MODAL_UPLOAD_ERRORS=<n>``): the first n batch uploads of
    this process fail in the middle, after their files were read and before they were
    put, as Modal's ``__aexit__`` of a batch upload fails when a block's upload does
    (``modal/volume.py``: blocks first, then one ``VolumePutFiles`` request, so none of
    the batch's files is put).
    """
    from .exception import ConnectionError as ModalConnectionError

    if _UPLOAD_ERRORS["left"] is None:
        _UPLOAD_ERRORS["left"] = int(os.environ.get("FAKE_MODAL_UPLOAD_ERRORS") or 0)
    if _UPLOAD_ERRORS["left"] > 0:
        _UPLOAD_ERRORS["left"] -= 1
        raise ModalConnectionError("Connection lost (fake fault in a batch upload)")


_COMMITS = {"done": 0}


def _commit_fault() -> None:
    """
    Fault injection in a container (``FAKE_MODAL_COMMIT_ERROR``, after
    ``FAKE_MODAL_COMMIT_ERROR_AFTER`` commits): what a commit can raise there, Python's
    ``TimeoutError`` or ``OSError`` or Modal's ``ConnectionError`` (what
    ``modal/_utils/grpc_utils.py`` raises once its retries are spent).
    """
    import errno

    from .exception import ConnectionError as ModalConnectionError

    name = os.environ.get("FAKE_MODAL_COMMIT_ERROR")
    after = int(os.environ.get("FAKE_MODAL_COMMIT_ERROR_AFTER") or 0)
    if not name or _COMMITS["done"] < after:
        _COMMITS["done"] += 1
        return
    raise {
        "TimeoutError": TimeoutError("commit timed out (fake fault)"),
        "ETIMEDOUT": OSError(errno.ETIMEDOUT, "Connection timed out (fake fault)"),
        "OSError": OSError(errno.ECONNRESET, "Connection reset by peer (fake fault)"),
        "ConnectionError": ModalConnectionError("Deadline exceeded (fake fault)"),
    }[name]


class _BatchUpload:
    """Object yielded by ``Volume.batch_upload``."""

    def __init__(self):
        # (source, remote rel, mode)
        self._files: list[tuple[object, str, int | None]] = []
        # (local folder, remote rel, recursive)
        self._dirs: list[tuple[Path, str, bool]] = []

    def put_file(
        self,
        local_file: Path | str | BinaryIO,
        remote_path: PurePosixPath | str,
        mode: int | None = None,
    ):
        """Queue one file.

        A path or a readable binary file object (read when the batch exits).
        """
        if str(remote_path).endswith("/"):
            raise ValueError(
                f"remote_path ({remote_path}) must refer to a file - cannot end with /"
            )
        self._files.append((local_file, _rel(remote_path), mode))

    def put_directory(
        self,
        local_path: Path | str,
        remote_path: PurePosixPath | str,
        recursive: bool = True,
    ):
        """Queue every file of a local folder (listed when the batch exits)."""
        self._dirs.append((Path(local_path), _rel(remote_path), recursive))

    def _expand(self) -> list[tuple[object, str, int | None]]:
        files = list(self._files)
        for src, rel, recursive in self._dirs:
            if not src.is_dir():
                raise NotADirectoryError(f"put_directory: {src} is not a directory")
            for p in sorted(src.rglob("*") if recursive else src.glob("*")):
                if p.is_file():
                    files.append(
                        (
                            p,
                            "/".join(
                                filter(None, [rel, p.relative_to(src).as_posix()])
                            ),
                            None,
                        )
                    )
        return files

    def _flush(self, volume: Volume, force: bool) -> None:
        committed = volume._committed
        files = self._expand()
        with locked(f"volume-{volume.name}"):
            for _src, rel, _mode in files:
                dst = committed / rel
                if not rel or dst.is_dir():
                    raise IsADirectoryError(
                        f"cannot overwrite directory {rel!r} in volume '{volume.name}'"
                    )
                if dst.exists() and not force:
                    raise FileExistsError(
                        f"{rel}: already exists in volume '{volume.name}' "
                        "(use force=True)"
                    )
            for src, rel, mode in files:
                if isinstance(src, (str, Path)):
                    atomic_copy(Path(src), committed / rel, mode)
                else:
                    data = src.read()
                    atomic_write(
                        data.encode() if isinstance(data, str) else bytes(data),
                        committed / rel,
                        mode,
                    )


#: Modal's name of what ``batch_upload`` yields (``modal/volume.py``).
VolumeUploadContextManager = _BatchUpload


# -- container views -----------------------------------------------------------
def _baseline_file(view: Path) -> Path:
    return view.with_name(view.name + ".baseline.json")


def _load_baseline(view: Path) -> dict[str, list[int]]:
    return json.loads(_baseline_file(view).read_text())


def _save_baseline(view: Path, baseline: dict[str, list[int]]) -> None:
    atomic_write(json.dumps(baseline).encode(), _baseline_file(view))


def _make_view(volume: Volume, view: Path) -> None:
    """Client side, at spawn: copy the committed files into a fresh container view."""
    with locked(f"volume-{volume.name}"):
        shutil.copytree(volume._committed, view, symlinks=True)
    _save_baseline(view, scan(view))


def _move_view(src: Path, dst: Path) -> None:
    """Move a container view (and its baseline) to another folder."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dst))
    shutil.move(str(_baseline_file(src)), str(_baseline_file(dst)))


__all__ = ["FileEntry", "FileEntryType", "Volume", "VolumeUploadContextManager"]
