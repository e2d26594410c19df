"""
Files between the local working directory and the Modal Volume.

The working directory is mirrored under one folder of the volume (the *prefix*): the
local file ``results/a.txt`` is ``<prefix>/results/a.txt`` there. Uploads send only what
is missing on the volume or changed locally (size differs, or modified in a later
second than the volume's copy was written: the volume keeps whole seconds); downloads
write each file to a temporary name and rename it, so a half-downloaded file never
looks finished.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from snakemake_interface_common.exceptions import WorkflowError

__all__ = ["VolumeStager", "relative_to_workdir"]


def relative_to_workdir(path: str | os.PathLike, workdir: Path) -> str:
    """
    A job's file as a POSIX path relative to the working directory.

    Raises
    ------
    WorkflowError
        If the file lies outside the working directory: a container sees only what is
        below it.
    """
    absolute = Path(os.path.abspath(Path(workdir, path)))
    try:
        rel = absolute.relative_to(Path(os.path.abspath(workdir)))
    except ValueError:
        raise WorkflowError(
            f"{path} is outside the working directory {workdir}: the Modal executor "
            "stages only files below the working directory; move the file there or "
            "start Snakemake from a folder above it"
        ) from None
    return rel.as_posix()


class VolumeStager:
    """
    Upload and download the files of jobs, through one folder of a Modal Volume.

    Parameters
    ----------
    volume : modal.Volume
        The volume (``modal.Volume.from_name(name, create_if_missing=True)``).
    prefix : str
        Folder of the volume that mirrors the working directory.
    workdir : Path
        The local working directory.
    """

    def __init__(self, volume, prefix: str, workdir: Path):
        self.volume = volume
        self.prefix = prefix.strip("/")
        self.workdir = Path(workdir)
        self._remote: dict[str, tuple[int, int]] | None = None

    def remote_path(self, rel: str) -> str:
        """Path on the volume of the local file ``rel``."""
        return str(PurePosixPath(self.prefix, rel))

    def remote_files(self) -> dict[str, tuple[int, int]]:
        """
        Files under the prefix on the volume: relative path -> (size in bytes, mtime in
        epoch seconds). Listed once, then kept up to date by this object's uploads.
        """
        if self._remote is None:
            import modal.exception

            self._remote = {}
            try:
                entries = self.volume.listdir(self.prefix or "/", recursive=True)
            except modal.exception.NotFoundError:
                entries = []
            for entry in entries:
                if _is_file(entry):
                    rel = str(PurePosixPath(entry.path).relative_to(self.prefix or "."))
                    self._remote[rel] = (entry.size, int(entry.mtime))
        return self._remote

    def upload(self, paths: Iterable[str]) -> list[str]:
        """
        Send the files (and the files inside folders) among ``paths`` that are missing
        on the volume or changed locally.

        Parameters
        ----------
        paths : iterable of str
            Paths relative to the working directory.

        Returns
        -------
        list of str
            The files sent, relative to the working directory.

        Raises
        ------
        WorkflowError
            If a path does not exist locally.
        """
        remote = self.remote_files()
        todo = []
        for rel in sorted(set(paths)):
            local = self.workdir / rel
            if not local.exists():
                raise WorkflowError(
                    f"{rel} does not exist locally and cannot be staged to the Modal "
                    "volume"
                )
            files = [local] if local.is_file() else sorted(local.rglob("*"))
            for f in files:
                if not f.is_file():
                    continue
                frel = f.relative_to(self.workdir).as_posix()
                st = f.stat()
                known = remote.get(frel)
                if (
                    known is None
                    or known[0] != st.st_size
                    or int(st.st_mtime) > known[1]
                ):
                    todo.append((f, frel, st.st_size))
        if todo:
            with self.volume.batch_upload(force=True) as batch:
                for f, frel, _ in todo:
                    batch.put_file(str(f), "/" + self.remote_path(frel))
            for f, frel, size in todo:
                remote[frel] = (size, int(f.stat().st_mtime))
        return [frel for _, frel, _ in todo]

    def download(self, paths: Iterable[str], missing_ok: bool = False) -> list[str]:
        """
        Fetch files (or whole folders) from the volume into the working directory.

        Each file is written to ``.<name>.modal-part`` beside its target and renamed
        when complete, and gets the volume copy's modification time (so it is not sent
        back by the next upload).

        Parameters
        ----------
        paths : iterable of str
            Paths relative to the working directory.
        missing_ok : bool
            Skip paths absent from the volume instead of raising.

        Returns
        -------
        list of str
            The files written locally.

        Raises
        ------
        WorkflowError
            If a path is not on the volume and ``missing_ok`` is false.
        """
        import modal.exception

        written = []
        for rel in paths:
            remote = self.remote_path(rel)
            try:
                entries = self.volume.listdir(remote, recursive=True)
            except modal.exception.NotFoundError:
                entries = None
            if not entries:
                if missing_ok:
                    continue
                raise WorkflowError(
                    f"{rel} is not on the Modal volume (expected at {remote}): the job "
                    "did not write it, or it was not committed"
                )
            for entry in entries:
                if not _is_file(entry):
                    continue
                frel = str(PurePosixPath(entry.path).relative_to(self.prefix or "."))
                self._fetch(entry.path, self.workdir / frel, int(entry.mtime))
                written.append(frel)
                if self._remote is not None:
                    self._remote[frel] = (entry.size, int(entry.mtime))
        return written

    def _fetch(self, remote: str, local: Path, mtime: int) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(f".{local.name}.modal-part")
        try:
            with open(part, "wb") as out:
                for chunk in self.volume.read_file(remote):
                    out.write(chunk)
            os.utime(part, (mtime, mtime))
            os.replace(part, local)
        finally:
            part.unlink(missing_ok=True)


def _is_file(entry) -> bool:
    """Whether a ``modal.volume.FileEntry`` is a regular file (type FILE = 1)."""
    return getattr(entry.type, "name", None) == "FILE" or entry.type == 1
