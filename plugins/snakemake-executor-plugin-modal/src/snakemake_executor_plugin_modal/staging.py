"""
Files between the local working directory and the Modal Volume.

The working directory is mirrored under one folder of the volume (the *prefix*, by
default the working directory's name and a hash of its absolute path, so that two
checkouts never share files): the local file ``results/a.txt`` is
``<prefix>/results/a.txt`` there. Uploads are content-checked: a manifest on the
volume (``<prefix>/.snakemake/modal/manifest.json``) holds the SHA-256 of every file
sent, and a file is sent again only if its content differs. Downloads list the folder
once and fetch the files in parallel, each written to a temporary name and renamed, so
a half-downloaded file never looks finished.

The status loop lists the mirror once per round, however many jobs the round
brings home (:class:`Listing`), and a job's files that came home
verified leave the volume (:meth:`VolumeStager.prune`): the volume holds what is not
home yet, so it stays small (Modal's guide "Volumes",
https://modal.com/docs/guide/volumes: a volume works best with fewer than 50,000
files and directories, and holds at most 500,000 inodes; `volume_entries_problem`).

The same class serves a workflow's own tools (progress, clean-up):
:meth:`VolumeStager.files` lists what a run has on the volume,
:meth:`VolumeStager.remove` deletes files and the markers that let a later run reuse
them (see :mod:`.container`).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path, PurePosixPath

from snakemake_interface_common.exceptions import WorkflowError

from .container import DONE, PART

__all__ = [
    "MANIFEST",
    "Listing",
    "VolumeStager",
    "default_prefix",
    "relative_to_workdir",
]

#: The upload manifest, relative to the prefix.
MANIFEST = ".snakemake/modal/manifest.json"
#: Files downloaded at once.
DOWNLOAD_THREADS = 8


def default_prefix(workdir: str | os.PathLike) -> str:
    """
    The volume folder of a working directory: its name and the first 8 hex digits
    of the SHA-256 of its absolute path (``wf-1a2b3c4d``).
    """
    path = Path(os.path.abspath(workdir))
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"{path.name}-{digest}"


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
        self._manifest: dict[str, str] | None = None
        self._hashes: dict[str, tuple[int, int, str]] = {}
        self._lock = threading.Lock()
        # files downloaded whole: path -> (bytes, SHA-256) as read from the volume
        # and written here (`_fetch`); what `prune` may delete from the volume
        self._verified: dict[str, tuple[int, str]] = {}

    def listing(self, shared: bool = False) -> Listing:
        """A listing of the whole mirror taken at its first use (`Listing`);
        ``shared``: a status round's, read by the downloads of all its jobs."""
        return Listing(self, shared)

    def remote_path(self, rel: str) -> str:
        """Path on the volume of the local file ``rel``."""
        return str(PurePosixPath(self.prefix, rel))

    def files(self, folder: str = "") -> dict[str, object]:
        """
        The committed files below ``folder`` of the mirror (one listing of the volume).

        Parameters
        ----------
        folder : str
            Folder relative to the working directory; ``""`` for the whole mirror.

        Returns
        -------
        dict
            Path relative to the working directory -> ``modal.volume.FileEntry``;
            empty if the folder (or the volume) does not exist. Part files left by
            a container killed mid-copy are left out.
        """
        import modal.exception

        where = str(PurePosixPath(self.prefix, folder)) if self.prefix else folder
        try:
            entries = self.volume.listdir(where or "/", recursive=True)
        except (modal.exception.NotFoundError, FileNotFoundError):
            return {}
        base = self.prefix or "."
        return {
            str(PurePosixPath(e.path).relative_to(base)): e
            for e in entries
            if _is_file(e) and not _is_part(e.path)
        }

    def remove(self, paths: Iterable[str]) -> list[str]:
        """
        Delete files of the mirror, each with the markers that let a job reuse it
        (``<prefix>/.snakemake/modal/done/<file>@<key>``), so that no later run takes
        it as finished.

        Parameters
        ----------
        paths : iterable of str
            Files relative to the working directory.

        Returns
        -------
        list of str
            The paths that were on the volume (and are deleted).

        Notes
        -----
        Each folder of markers is listed once, however many of its files are
        removed (``Volume.listdir``, not recursive): the work is linear in the paths
        and the folders' entries, not their product.
        """
        import modal.exception

        missing = (modal.exception.NotFoundError, FileNotFoundError)
        gone = []
        for rel in paths:
            try:
                self.volume.remove_file(self.remote_path(rel))
            except missing:
                continue
            gone.append(rel)
        by_folder: dict[PurePosixPath, set[str]] = {}
        for rel in gone:
            marker = PurePosixPath(self.remote_path(DONE), rel)
            by_folder.setdefault(marker.parent, set()).add(marker.name)
        for folder, names in by_folder.items():
            try:
                entries = self.volume.listdir(str(folder))
            except missing:
                continue
            for e in entries:  # <output>@<key>: a key holds no "@"
                output, sep, _ = PurePosixPath(e.path).name.rpartition("@")
                if sep and output in names:
                    self.volume.remove_file(e.path)
        with self._lock:  # an upload must send them again
            manifest = self.manifest()
            # every one popped (`any` would stop at the first)
            if [rel for rel in gone if manifest.pop(rel, None) is not None]:
                self._upload([])
        return gone

    def prune(self, paths: Iterable[str], listing: Listing | None = None) -> list[str]:
        """
        Delete from the volume the files of finished jobs that are home and
        verified, with their reuse markers (``<prefix>/.snakemake/modal/done/
        <file>@<key>``), so that the volume holds only what is not home yet.

        A file is verified when this stager downloaded it whole (`_fetch`: as many
        bytes as the volume's listing gives its size, renamed into place only then)
        and the local file still has that size and SHA-256; any other path is left
        on the volume. The manifest drops the files first and is written once, then
        the files go: a run killed in between leaves files the manifest does not
        know of (sent again when a job needs them), never the manifest naming a file
        the volume lacks.

        Parameters
        ----------
        paths : iterable of str
            Files relative to the working directory (what `download` returned).
        listing : Listing, optional
            The status round's listing, where the markers are found; default: one
            made here.

        Returns
        -------
        list of str
            The files deleted from the volume, sorted.

        Notes
        -----
        Markers are found in the round's listing (not changed here: another
        job's download may be reading it); the files are deleted in parallel, one
        ``VolumeRemoveFile`` each (modal 1.6.4, ``_Volume.remove_file``): the work
        is linear in the paths pruned. Empty folders stay (a few: one per folder
        of outputs, not per file).
        """
        import modal.exception

        todo = []
        for rel in sorted(set(paths)):
            known = self._verified.get(rel)
            try:
                size = (self.workdir / rel).stat().st_size
            except FileNotFoundError:
                continue
            if known is not None and known == (size, self.content_hash(rel)):
                todo.append(rel)
        if not todo:
            return []
        _, names = (listing or self.listing()).get()
        doomed = []
        for rel in todo:
            doomed.append(rel)
            head = f"{DONE}/{rel}@"  # <output>@<key>: a key holds no "@" or "/"
            i = bisect.bisect_left(names, head)
            while i < len(names) and names[i].startswith(head):
                if "/" not in names[i][len(head) :]:
                    doomed.append(names[i])
                i += 1
        with self._lock:  # the manifest first: an upload must send them again
            manifest = self.manifest()
            if [rel for rel in todo if manifest.pop(rel, None) is not None]:
                self._upload([])
            for rel in todo:
                self._verified.pop(rel, None)

        def delete(rel: str) -> None:
            try:
                self.volume.remove_file(self.remote_path(rel))
            except (modal.exception.NotFoundError, FileNotFoundError):
                pass

        with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            list(pool.map(delete, doomed))
        return todo

    def finished(self, members: list[dict]) -> list[str]:
        """
        The outputs of a job's members that are on the volume with the marker of
        their member's key (``<prefix>/.snakemake/modal/done/<file>@<key>``: written
        by the container once the file was finished and committed); a member counts
        only with all its outputs there.

        Parameters
        ----------
        members : list of dict
            ``outputs`` (paths relative to the working directory) and ``key``, as in
            the job's spec.

        Returns
        -------
        list of str
            Paths relative to the working directory, sorted.
        """
        files = self.files()
        done = []
        for member in members:
            outputs = member.get("outputs") or []
            if outputs and all(
                rel in files and f"{DONE}/{rel}@{member['key']}" in files
                for rel in outputs
            ):
                done += outputs
        return sorted(done)

    def content_hash(self, rel: str) -> str:
        """
        SHA-256 (hex) of a local file's content; for a folder, of its files' relative
        paths and hashes. Kept while the file's size and modification time hold.

        Raises
        ------
        WorkflowError
            If the path does not exist locally.
        """
        local = self.workdir / rel
        if local.is_dir():
            digest = hashlib.sha256()
            for f in sorted(local.rglob("*")):
                if f.is_file():
                    frel = f.relative_to(self.workdir).as_posix()
                    digest.update(f"{frel}\0{self.content_hash(frel)}\n".encode())
            return digest.hexdigest()
        try:
            st = local.stat()
        except FileNotFoundError:
            raise WorkflowError(
                f"{rel} does not exist locally and cannot be staged to the Modal volume"
            ) from None
        known = self._hashes.get(rel)
        if known and known[:2] == (st.st_size, st.st_mtime_ns):
            return known[2]
        digest = hashlib.sha256()
        with open(local, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        self._hashes[rel] = (st.st_size, st.st_mtime_ns, digest.hexdigest())
        return digest.hexdigest()

    def manifest(self) -> dict[str, str]:
        """Relative path -> SHA-256 of the files on the volume this run knows of."""
        if self._manifest is None:
            try:
                data = b"".join(self.volume.read_file(self.remote_path(MANIFEST)))
                self._manifest = json.loads(data)
            except Exception as e:  # none yet, or unreadable: everything is sent
                import modal.exception

                if not isinstance(
                    e, (FileNotFoundError, modal.exception.NotFoundError, ValueError)
                ):
                    raise
                self._manifest = {}
        return self._manifest

    def upload(self, paths: Iterable[str]) -> list[str]:
        """
        Send the files (and the files inside folders) among ``paths`` whose content
        the volume does not have (by the manifest's SHA-256). They enter the manifest
        only once the batch is committed: after an error, a retry sends them again.

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
        Exception
            What Modal's ``batch_upload`` raised (e.g. ``modal.exception
            .ConnectionError``); nothing is recorded as sent.
        """
        with self._lock:
            manifest = self.manifest()
            todo = []
            for rel in sorted(set(paths)):
                local = self.workdir / rel
                if not local.exists():
                    raise WorkflowError(
                        f"{rel} does not exist locally and cannot be staged to the "
                        "Modal volume"
                    )
                files = [local] if local.is_file() else sorted(local.rglob("*"))
                for f in files:
                    if not f.is_file():
                        continue
                    frel = f.relative_to(self.workdir).as_posix()
                    digest = self.content_hash(frel)
                    if manifest.get(frel) != digest:
                        todo.append((f, frel, digest))
            if not todo:
                return []
            # recorded only once the batch is committed: a batch that fails (in the
            # middle too) leaves the manifest as it was, so a retry sends it again
            updated = {**manifest, **{frel: digest for _, frel, digest in todo}}
            self._upload([(f, frel) for f, frel, _ in todo], updated)
            self._manifest = updated
            return [frel for _, frel, _ in todo]

    def _upload(
        self, files: list[tuple[Path, str]], manifest: dict | None = None
    ) -> None:
        """
        Send local files (path, relative path) and the manifest (``manifest``, else
        the one held), in one batch: Modal puts a batch's files when the block ends,
        all or none (``VolumePutFiles``, ``modal/volume.py``).
        """
        manifest = self._manifest if manifest is None else manifest
        with tempfile.TemporaryDirectory() as tmp:
            record = Path(tmp, "manifest.json")
            record.write_text(json.dumps(manifest, sort_keys=True))
            with self.volume.batch_upload(force=True) as batch:
                for f, frel in files:
                    batch.put_file(str(f), "/" + self.remote_path(frel))
                batch.put_file(str(record), "/" + self.remote_path(MANIFEST))

    def download(
        self,
        paths: Iterable[str],
        missing_ok: bool = False,
        tick: Callable[[], None] | None = None,
        tick_s: float = 10.0,
        listing: Listing | None = None,
    ) -> list[str]:
        """
        Fetch files (or whole folders) from the volume into the working directory:
        one listing of the prefix, then the files in parallel.

        Each file is written to ``.<name>.modal-part`` beside its target and renamed
        when complete; its content is recorded as known to the volume (so it is not
        sent back by the next upload).

        Parameters
        ----------
        paths : iterable of str
            Paths relative to the working directory.
        missing_ok : bool
            Skip paths absent from the volume instead of raising.
        tick : callable, optional
            Called every `tick_s` seconds while the files download (the executor's
            budget check: a shard's thousands of files take minutes, during which
            Snakemake's status loop, or its lock, waits for this call).
        tick_s : float
            Seconds between calls of `tick`.
        listing : Listing, optional
            The status round's listing (`listing`); default: one made here. A path
            missing from it is looked for once in a new listing (committed after
            it was taken) before it counts as missing.

        Returns
        -------
        list of str
            The files written locally.

        Raises
        ------
        WorkflowError
            If a path is not on the volume and ``missing_ok`` is false.
        """
        paths = list(paths)
        if not paths:
            return []
        with self._lock:
            self.manifest()  # downloaded files are recorded in it
        listing = listing or self.listing()
        files, names = listing.get()  # names sorted: a folder's files in one slice
        todo = {}
        for rel in paths:
            below = _below(rel, files, names)
            if not below and not missing_ok and listing.shared:
                listing = self.listing()  # committed after the round's listing
                files, names = listing.get()
                below = _below(rel, files, names)
            if not below:
                if missing_ok:
                    continue
                raise WorkflowError(
                    f"{rel} is not on the Modal volume (expected at "
                    f"{self.remote_path(rel)}): the job did not write it, or it was "
                    "not committed"
                )
            todo.update({f: files[f] for f in below})
        with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
            futures = [pool.submit(self._fetch, *item) for item in todo.items()]
            pending = set(futures)
            while pending:
                done, pending = wait(
                    pending,
                    timeout=tick_s if tick is not None else None,
                    return_when=FIRST_EXCEPTION,
                )
                if any(f.exception() is not None for f in done):
                    for f in pending:
                        f.cancel()
                    break
                if pending and tick is not None:
                    tick()
            for f in futures:  # the first error, as raised by the fetch
                if f.done() and not f.cancelled() and f.exception() is not None:
                    raise f.exception()
        return sorted(todo)

    def _fetch(self, frel: str, entry) -> None:
        local = self.workdir / frel
        local.parent.mkdir(parents=True, exist_ok=True)
        part = local.with_name(f".{local.name}.modal-part")
        digest = hashlib.sha256()
        size = 0
        try:
            with open(part, "wb") as out:
                for chunk in self.volume.read_file(entry.path):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            # the listing's size in bytes (``FileEntry.size``, modal/types.py)
            expected = getattr(entry, "size", None)
            if expected is not None and size != expected:
                raise WorkflowError(
                    f"{frel}: {size} bytes came from the Modal volume, its listing "
                    f"says {expected}: the download is incomplete; run again"
                )
            mtime = int(entry.mtime)
            os.utime(part, (mtime, mtime))
            os.replace(part, local)
        finally:
            part.unlink(missing_ok=True)
        st = local.stat()
        with self._lock:
            self._hashes[frel] = (st.st_size, st.st_mtime_ns, digest.hexdigest())
            self._manifest[frel] = digest.hexdigest()
            self._verified[frel] = (size, digest.hexdigest())


class Listing:
    """
    One listing of the whole mirror (`VolumeStager.files`), taken at the first
    `get` and then shared: the status loop makes one per round, once it has seen
    the round's calls end (what their containers committed is in it), and every
    job the round brings home reads it, so that a round costs one listing, linear
    in the volume's entries, however many jobs it ends (not one or two per job:
    jobs x entries over a run).

    Parameters
    ----------
    stager : VolumeStager
    shared : bool
        Made for a round (a path missing from it is looked for again in a new
        listing: `VolumeStager.download`).
    """

    def __init__(self, stager: VolumeStager, shared: bool = False):
        self.stager = stager
        self.shared = shared
        self._lock = threading.Lock()
        self._got: tuple[dict[str, object], list[str]] | None = None

    def get(self) -> tuple[dict[str, object], list[str]]:
        """The listing (path -> ``FileEntry``) and its paths sorted; listed at the
        first call, by one thread while the others wait."""
        with self._lock:
            if self._got is None:
                files = self.stager.files()
                self._got = (files, sorted(files))
            return self._got


def _below(rel: str, files: dict, names: list[str]) -> list[str]:
    """The listed files of a path: itself, or those inside the folder (`names`:
    the listing's paths, sorted; one slice, found by bisection)."""
    below = [rel] if rel in files else []
    inside = rel.rstrip("/") + "/"
    i = bisect.bisect_left(names, inside)
    while i < len(names) and names[i].startswith(inside):
        below.append(names[i])
        i += 1
    return below


def _is_part(path: str) -> bool:
    """Whether a volume path is a part file left by a container killed mid-copy
    (``.<name>.part-<random>``, :func:`~.container._copy_atomically`)."""
    name = PurePosixPath(path).name
    return name.startswith(".") and PART in name


def _is_file(entry) -> bool:
    """Whether a ``modal.volume.FileEntry`` is a regular file (type FILE = 1)."""
    return getattr(entry.type, "name", None) == "FILE" or entry.type == 1
