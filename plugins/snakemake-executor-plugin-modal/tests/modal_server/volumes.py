"""
Volume RPCs of the local Modal server: a volume is a folder of plain files
(:attr:`~.state.VolumeRecord.folder`), changed by the client's uploads and removals.

Served, each with the client code it answers (modal 1.6.4):

- ``VolumeGetOrCreate``: ``Volume.from_name(name, create_if_missing=...)``, hydrated
  at first use (modal/volume.py, ``_Volume.from_name``).
- ``VolumeListFiles`` (v1) and ``VolumeListFiles2`` (v2): ``listdir``/``iterdir``.
- ``VolumeGetFile2`` (both versions): ``read_file``; its URLs are served by
  :mod:`.blobs`.
- ``MountPutFile``, ``BlobCreate``, ``VolumePutFiles`` (v1) and ``VolumePutFiles2``
  (v2): ``batch_upload`` (``_VolumeUploadContextManager`` and
  ``_VolumeUploadContextManager2``, modal/volume.py; ``_blob_upload``,
  modal/_utils/blob_utils.py).
- ``VolumeRemoveFile`` (v1) and ``VolumeRemoveFile2`` (v2): ``remove_file``.
- ``VolumeCommit`` and ``VolumeReload``: ``commit`` (which reloads unless the answer
  says ``skip_reload``) and ``reload``, from a container: its own view of the volume
  published, or published and refreshed (:mod:`.views`); a commit may fail as the
  server's :class:`~.faults.CommitFault` says.

Errors follow what the client turns them into (modal/_grpc_client.py,
``_STATUS_TO_EXCEPTION``): NOT_FOUND for a missing volume or path (``read_file`` and
``remove_file`` raise ``FileNotFoundError`` from it), ALREADY_EXISTS for an upload onto
an existing file without ``force`` (``batch_upload`` raises ``FileExistsError``).
The messages are this server's own: Modal's exact texts are not in the client.
"""

from __future__ import annotations

import os
import shutil
import stat as stat_module
from pathlib import Path, PurePosixPath

from google.protobuf import empty_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from grpclib import GRPCError, Status
from modal_proto import api_pb2

from .blobs import BLOCK_PUT_RESPONSE_PREFIX
from .state import VolumeRecord, new_id
from .views import publish, refresh

__all__ = ["BLOCK_SIZE", "DEFAULT_ENVIRONMENT", "VolumeRpcs"]

#: A volume file's block, in bytes: the client hashes v2 uploads and expects
#: ``VolumeGetFile2`` pieces cut at multiples of it (modal 1.6.4,
#: modal/_utils/blob_utils.py, ``BLOCK_SIZE``; modal/volume.py,
#: ``_expected_block_lengths``).
BLOCK_SIZE = 8 * 1024 * 1024

#: The environment of a request that names none (Modal's default is ``main``).
DEFAULT_ENVIRONMENT = "main"

#: Entries per message of a streamed listing.
_LIST_BATCH = 100

_V1 = api_pb2.VOLUME_FS_VERSION_V1
_V2 = api_pb2.VOLUME_FS_VERSION_V2


def _rel(path: str) -> str:
    """
    A volume path relative to its root: ``"/a/b"``, ``"a/b/"`` and ``"a/./b"`` give
    ``"a/b"``; the root gives ``""``.

    Raises
    ------
    grpclib.GRPCError
        INVALID_ARGUMENT for a path with ``..``.
    """
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", ".")]
    if ".." in parts:
        raise GRPCError(Status.INVALID_ARGUMENT, f"'..' in volume path {path!r}")
    return "/".join(parts)


def _entry(folder: Path, p: Path) -> api_pb2.FileEntry:
    # FileEntry: path relative to the volume's root without a leading "/", mtime in
    # whole seconds (modal/types.py, FileEntry; modal/volume.py, iterdir)
    st = p.lstat()
    if stat_module.S_ISLNK(st.st_mode):
        kind = api_pb2.FileEntry.FileType.SYMLINK
    elif stat_module.S_ISDIR(st.st_mode):
        kind = api_pb2.FileEntry.FileType.DIRECTORY
    elif stat_module.S_ISREG(st.st_mode):
        kind = api_pb2.FileEntry.FileType.FILE
    else:
        kind = api_pb2.FileEntry.FileType.UNSPECIFIED
    return api_pb2.FileEntry(
        path=p.relative_to(folder).as_posix(),
        type=kind,
        mtime=int(st.st_mtime),
        size=st.st_size if kind == api_pb2.FileEntry.FileType.FILE else 0,
    )


def _check_target(folder: Path, rel: str, overwrite: bool) -> None:
    """
    Refuse to upload to ``rel`` where Modal would: the root, a path below a file, an
    existing directory (``batch_upload``'s docstring: "you cannot overwrite existing
    directories with uploaded files regardless"), an existing file without ``force``.

    Raises
    ------
    grpclib.GRPCError
        INVALID_ARGUMENT or ALREADY_EXISTS.
    """
    if not rel:
        raise GRPCError(Status.INVALID_ARGUMENT, "cannot upload to the volume's root")
    target = folder / rel
    for parent in PurePosixPath(rel).parents:
        p = folder / parent
        if str(parent) != "." and p.exists() and not p.is_dir():
            raise GRPCError(Status.INVALID_ARGUMENT, f"/{parent} is a file, not a dir")
    if target.is_dir():
        raise GRPCError(
            Status.INVALID_ARGUMENT, f"/{rel} is a directory; it cannot be overwritten"
        )
    if target.exists() and not overwrite:
        raise GRPCError(Status.ALREADY_EXISTS, f"/{rel}: file already exists")


def _write(folder: Path, rel: str, data: bytes, mode: int) -> None:
    target = folder / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.upload-tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, (mode & 0o7777) or 0o644)
    os.replace(tmp, target)


class VolumeRpcs:
    """
    Mixin of the local Modal server serving volumes (see the module's docstring).

    Needs ``self.state`` (:class:`~.state.ServerState`) and ``self.store``
    (:class:`~.blobs.ContentStore`).
    """

    # -- lookups -----------------------------------------------------------------
    def _volume(self, volume_id: str) -> VolumeRecord:
        volume = self.state.volume_by_id(volume_id)
        if volume is None:
            raise GRPCError(Status.NOT_FOUND, f"Volume {volume_id} not found")
        return volume

    def _environment(self, name: str) -> str:
        name = name or DEFAULT_ENVIRONMENT
        if name not in self.state.environments:
            raise GRPCError(Status.NOT_FOUND, f"Environment '{name}' not found")
        return name

    # -- get or create -----------------------------------------------------------
    async def VolumeGetOrCreate(self, stream) -> None:
        """
        Look a volume up by name, creating it as asked (``object_creation_type``).

        A new volume is v1 unless the request asks for v2: Modal's documentation
        calls v2 volumes a beta that is chosen explicitly ("Volumes v2",
        https://modal.com/docs/guide/volumes; ``modal volume create --version``).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a missing volume without ``create_if_missing``;
            ALREADY_EXISTS for ``CREATE_FAIL_IF_EXISTS`` on an existing one;
            UNIMPLEMENTED for ephemeral, app-owned and overwriting creation.
        """
        req = await stream.recv_message()
        ct = req.object_creation_type
        if ct not in (
            api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED,
            api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING,
            api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS,
        ):
            raise GRPCError(
                Status.UNIMPLEMENTED,
                "UNIMPLEMENTED: VolumeGetOrCreate with object_creation_type "
                f"{api_pb2.ObjectCreationType.Name(ct)}",
            )
        env = self._environment(req.environment_name)
        key = (env, req.deployment_name)
        with self.state.lock:
            volume = self.state.volumes.get(key)
            if volume is None:
                if ct == api_pb2.OBJECT_CREATION_TYPE_UNSPECIFIED:
                    raise GRPCError(
                        Status.NOT_FOUND,
                        f"Volume '{req.deployment_name}' not found in environment "
                        f"'{env}'",
                    )
                volume_id = new_id("vo")
                volume = VolumeRecord(
                    volume_id=volume_id,
                    name=req.deployment_name,
                    environment=env,
                    version=req.version or _V1,
                    folder=self.state.root / "volumes" / env / req.deployment_name,
                    created_at=self.state.now(),
                )
                volume.folder.mkdir(parents=True)
                self.state.volumes[key] = volume
            elif ct == api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS:
                raise GRPCError(
                    Status.ALREADY_EXISTS,
                    f"Volume '{req.deployment_name}' already exists in '{env}'",
                )
        metadata = api_pb2.VolumeMetadata(
            version=volume.version,
            name=volume.name,
            creation_info=api_pb2.CreationInfo(
                created_at=volume.created_at, created_by="local-test"
            ),
        )
        await stream.send_message(
            api_pb2.VolumeGetOrCreateResponse(
                volume_id=volume.volume_id, version=volume.version, metadata=metadata
            )
        )

    # -- listing -----------------------------------------------------------------
    async def _list(self, stream, response_type) -> None:
        req = await stream.recv_message()
        folder = self._volume(req.volume_id).folder
        target = folder / _rel(req.path)
        if not (target.exists() or target.is_symlink()):
            raise GRPCError(
                Status.NOT_FOUND, f"No such file or directory: {req.path!r}"
            )
        if not target.is_dir() or target.is_symlink():
            paths = [target]  # a file lists itself (iterdir's docstring)
        elif req.recursive:
            paths = sorted(target.rglob("*"))
        else:
            paths = sorted(target.iterdir())
        paths = [p for p in paths if not p.name.endswith(".upload-tmp")]
        max_entries = getattr(req, "max_entries", 0)
        if max_entries:
            paths = paths[:max_entries]
        entries = [_entry(folder, p) for p in paths]
        for i in range(0, len(entries), _LIST_BATCH):
            batch = entries[i : i + _LIST_BATCH]
            await stream.send_message(response_type(entries=batch))

    async def VolumeListFiles(self, stream) -> None:
        """
        List a v1 volume's path (``_Volume.iterdir``, modal/volume.py), in messages of
        at most 100 entries: a folder's children (all descendants with
        ``recursive``), or a file itself.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a missing volume or path.
        """
        await self._list(stream, api_pb2.VolumeListFilesResponse)

    async def VolumeListFiles2(self, stream) -> None:
        """The same as :meth:`VolumeListFiles`, for v2 volumes."""
        await self._list(stream, api_pb2.VolumeListFiles2Response)

    # -- reading -----------------------------------------------------------------
    async def VolumeGetFile2(self, stream) -> None:
        """
        Point at a file's bytes ``[start, start + len)`` (``len`` 0: to the end) as
        one URL per piece, pieces cut at multiples of :data:`BLOCK_SIZE`, as
        ``_Volume.read_file`` expects (modal/volume.py, ``_expected_block_lengths``).
        A piece's trailing zero bytes are left out when the request says
        ``client_pads_blocks``.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a missing volume or file; INVALID_ARGUMENT for a folder.
        """
        req = await stream.recv_message()
        target = self._volume(req.volume_id).folder / _rel(req.path)
        if target.is_dir():
            raise GRPCError(Status.INVALID_ARGUMENT, f"{req.path!r} is a directory")
        if not target.is_file():
            raise GRPCError(Status.NOT_FOUND, f"No such file: {req.path!r}")
        data = target.read_bytes()
        size = len(data)
        start = min(req.start, size)
        end = size if not req.len else min(size, start + req.len)
        urls, pos = [], start
        while pos < end:
            piece_end = min(end, (pos // BLOCK_SIZE + 1) * BLOCK_SIZE)
            piece = data[pos:piece_end]
            if req.client_pads_blocks:
                piece = piece.rstrip(b"\0")
            urls.append(self.store.block_url(self.store.put_block(piece)))
            pos = piece_end
        await stream.send_message(
            api_pb2.VolumeGetFile2Response(
                get_urls=urls, size=size, start=start, len=end - start
            )
        )

    # -- uploads, v1 ---------------------------------------------------------------
    async def MountPutFile(self, stream) -> None:
        """
        Whether a file content (by SHA-256 hex) is known, or take it: inline
        (``data``) or from an uploaded blob (``data_blob_id``), as
        ``_VolumeUploadContextManager._upload_file`` sends it (modal/volume.py).

        Raises
        ------
        grpclib.GRPCError
            INVALID_ARGUMENT when the bytes' SHA-256 is not the announced one;
            NOT_FOUND for a blob that was not uploaded.
        """
        req = await stream.recv_message()
        if req.data_blob_id:
            data = self.store.blob_bytes(req.data_blob_id)
            if data is None:
                raise GRPCError(Status.NOT_FOUND, f"Blob {req.data_blob_id} not found")
        elif req.HasField("data"):
            data = req.data
        else:
            data = None
        if data is not None and self.store.put_content(data) != req.sha256_hex:
            raise GRPCError(Status.INVALID_ARGUMENT, "content does not match sha256")
        checked_at = Timestamp()
        checked_at.GetCurrentTime()
        await stream.send_message(
            api_pb2.MountPutFileResponse(
                exists=self.store.has_content(req.sha256_hex), checked_at=checked_at
            )
        )

    async def BlobCreate(self, stream) -> None:
        """
        Announce a blob and answer one plain upload URL (``upload_urls`` with one
        item, ``blob_ids`` with its id); never a multipart upload, which the client
        does only when told to (modal/_utils/blob_utils.py, ``_blob_upload``).
        """
        req = await stream.recv_message()
        blob_id = new_id("bl")
        url = self.store.new_blob(blob_id, req.content_length, req.content_md5)
        await stream.send_message(
            api_pb2.BlobCreateResponse(
                blob_ids=[blob_id], upload_urls=api_pb2.UploadUrlList(items=[url])
            )
        )

    async def VolumePutFiles(self, stream) -> None:
        """
        Put a v1 batch's files, all or none, from contents sent before
        (``MountPutFile``).

        Raises
        ------
        grpclib.GRPCError
            ALREADY_EXISTS (an existing file, ``disallow_overwrite_existing_files``);
            INVALID_ARGUMENT (a directory or the root as a target); NOT_FOUND (a
            content never sent).
        """
        req = await stream.recv_message()
        folder = self._volume(req.volume_id).folder
        todo = []
        for f in req.files:
            rel = _rel(f.filename)
            _check_target(folder, rel, not req.disallow_overwrite_existing_files)
            if not self.store.has_content(f.sha256_hex):
                raise GRPCError(Status.NOT_FOUND, f"content of {f.filename} not sent")
            todo.append((rel, f.sha256_hex, f.mode))
        for rel, digest, mode in todo:
            _write(folder, rel, self.store.content_path(digest).read_bytes(), mode)
        await stream.send_message(empty_pb2.Empty())

    # -- uploads, v2 ---------------------------------------------------------------
    async def VolumePutFiles2(self, stream) -> None:
        """
        Put a v2 batch's files, all or none, once every block is known; else answer
        the missing blocks with their upload URLs and put nothing
        (``_VolumeUploadContextManager2._put_file_specs``, modal/volume.py: blocks of
        :data:`BLOCK_SIZE` bytes hashed without their trailing zero bytes).

        Raises
        ------
        grpclib.GRPCError
            ALREADY_EXISTS, INVALID_ARGUMENT (as :meth:`VolumePutFiles`; also a wrong
            ``put_response`` or a block count that does not fit the size).
        """
        req = await stream.recv_message()
        folder = self._volume(req.volume_id).folder
        missing = []
        for fi, f in enumerate(req.files):
            overwrite = not req.disallow_overwrite_existing_files
            _check_target(folder, _rel(f.path), overwrite)
            if len(f.blocks) != -(f.size // -BLOCK_SIZE):
                raise GRPCError(
                    Status.INVALID_ARGUMENT, f"{f.path}: block count does not fit size"
                )
            for bi, block in enumerate(f.blocks):
                digest = block.contents_sha256.hex()
                expected = BLOCK_PUT_RESPONSE_PREFIX + digest.encode()
                if block.put_response and block.put_response != expected:
                    raise GRPCError(Status.INVALID_ARGUMENT, "unknown put_response")
                if not self.store.has_block(digest):
                    missing.append(
                        api_pb2.VolumePutFiles2Response.MissingBlock(
                            file_index=fi,
                            block_index=bi,
                            put_url=self.store.block_url(digest),
                        )
                    )
        if not missing:
            for f in req.files:
                pieces = []
                for bi, block in enumerate(f.blocks):
                    length = min(BLOCK_SIZE, f.size - bi * BLOCK_SIZE)
                    path = self.store.block_path(block.contents_sha256.hex())
                    data = path.read_bytes()
                    pieces.append(data.ljust(length, b"\0"))
                _write(folder, _rel(f.path), b"".join(pieces), f.mode)
        await stream.send_message(
            api_pb2.VolumePutFiles2Response(missing_blocks=missing)
        )

    # -- removal -------------------------------------------------------------------
    async def _remove(self, stream) -> None:
        req = await stream.recv_message()
        folder = self._volume(req.volume_id).folder
        rel = _rel(req.path)
        if not rel:
            raise GRPCError(Status.INVALID_ARGUMENT, "cannot remove the volume's root")
        target = folder / rel
        if not (target.exists() or target.is_symlink()):
            raise GRPCError(
                Status.NOT_FOUND, f"No such file or directory: {req.path!r}"
            )
        if target.is_dir() and not target.is_symlink():
            if not req.recursive:
                raise GRPCError(Status.INVALID_ARGUMENT, f"{req.path!r} is a directory")
            shutil.rmtree(target)
        else:
            target.unlink()
        await stream.send_message(empty_pb2.Empty())

    async def VolumeRemoveFile(self, stream) -> None:
        """
        Remove a file, or a folder with ``recursive`` (``_Volume.remove_file``,
        modal/volume.py; v1).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a missing path; INVALID_ARGUMENT for the root, or a folder
            without ``recursive``.
        """
        await self._remove(stream)

    async def VolumeRemoveFile2(self, stream) -> None:
        """The same as :meth:`VolumeRemoveFile`, for v2 volumes."""
        await self._remove(stream)

    # -- commit and reload ---------------------------------------------------------
    def _view_of(self, stream, volume: VolumeRecord):
        """The calling container's view of ``volume``, or None (a client's call)."""
        task_id = stream.metadata.get("x-modal-task-id", "")
        if stream.metadata.get("x-modal-client-type") != str(
            api_pb2.CLIENT_TYPE_CONTAINER
        ):
            return None
        with self.state.lock:
            container = self.state.containers.get(task_id)
        return None if container is None else container.views.get(volume.volume_id)

    async def VolumeCommit(self, stream) -> None:
        """
        Commit the calling container's view of the volume (:func:`~.views.publish`)
        and answer ``skip_reload=False``, so the client reloads next
        (``_Volume.commit``, modal/volume.py); a commit from outside a container
        ("Must be called inside a container that mounts the Volume", same place) or
        where volumes are linked, not viewed, is counted only.

        Raises
        ------
        grpclib.GRPCError
            The server's :class:`~.faults.CommitFault` status, for a container's
            commit that it fails (nothing published).
        """
        req = await stream.recv_message()
        volume = self._volume(req.volume_id)
        view = self._view_of(stream, volume)
        fault = self.state.faults.commit
        with self.state.lock:
            volume.commits += 1
            failing = (
                fault is not None
                and stream.metadata.get("x-modal-client-type")
                == str(api_pb2.CLIENT_TYPE_CONTAINER)
                and fault.fails(volume.name)
            )
        if failing:
            raise GRPCError(
                Status[fault.status],
                f"commit of volume '{volume.name}' failed (fault set by the test)",
            )
        if view is not None:
            publish(view)
        await stream.send_message(api_pb2.VolumeCommitResponse(skip_reload=False))

    async def VolumeReload(self, stream) -> None:
        """
        Reload the calling container's view of the volume (:func:`~.views.refresh`:
        its changes published, then the volume's current files); from outside a
        container, counted only (``_Volume._do_reload``, modal/volume.py).
        """
        req = await stream.recv_message()
        volume = self._volume(req.volume_id)
        view = self._view_of(stream, volume)
        with self.state.lock:
            volume.reloads += 1
        if view is not None:
            refresh(view)
        await stream.send_message(empty_pb2.Empty())
