"""
Image, mount and secret RPCs of the local Modal server.

Served, each with the client code it answers (modal 1.6.4):

- ``ImageGetOrCreate`` and ``ImageJoinStreaming``: each layer of ``image.build()``
  or of an app's image (modal/_image.py, ``_Image._from_args`` ``_load`` and
  ``_image_await_build_result``). A layer's id follows from its definition, so the
  same definition is the same image; the first request answers no result (the client
  then joins the build), a later one answers the result at once (a cache hit,
  ``_cache_hit``), as Modal's cache does unless ``force_build``. Nothing is built:
  the containers run this machine's Python environment (:mod:`.containers`), so
  ``pip_install`` and ``run_commands`` layers are recorded only
  (:attr:`~.state.ServerState.images`). A build streams one output line
  (:data:`BUILD_LOG`, ``TaskLogs`` on stdout), which the client prints under
  ``modal.enable_output()`` (``_image_await_build_result``: ``put_streaming_log``),
  as it prints a real build's output. A :class:`~.faults.BuildFault` makes builds
  fail: its log line on stderr, then a failed result (``_Image._load`` raises
  ``ImageBuildError``); a failed layer is not cached.
- ``MountGetOrCreate`` and ``MountBatchedCheckExistence``: ``add_local_python_source``
  and other local files (modal/mount.py, ``_Mount._load_mount`` and
  ``_batched_get_missing_files``); file contents arrive through ``MountPutFile``
  (:mod:`.volumes`). A container gets its function's mounts copied into its folder
  (:mod:`.containers`). The one named mount served is the client's own
  (``modal-client-mount-<version>``, global namespace), empty here.
- ``SecretGetOrCreate`` for ``Secret.from_dict``
  (``OBJECT_CREATION_TYPE_ANONYMOUS_OWNED_BY_APP`` or ``EPHEMERAL`` with
  ``env_dict``; modal/secret.py, ``_Secret.from_dict``); a container gets its
  function's secrets as environment variables. Named secrets (``Secret.from_name``)
  answer UNIMPLEMENTED.
"""

from __future__ import annotations

import hashlib
import sys

from google.protobuf.timestamp_pb2 import Timestamp
from grpclib import GRPCError, Status
from modal_proto import api_pb2

from .apps import IMAGE_BUILDER_VERSION
from .state import new_id

__all__ = ["BUILD_LOG", "ObjectRpcs", "image_metadata"]

_SUCCESS = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
_FAILURE = api_pb2.GenericResult.GENERIC_STATUS_FAILURE

#: The output line of a layer's build (this server's words; Modal's builder streams
#: the build steps' own output the same way).
BUILD_LOG = "local Modal server: image {image_id} recorded, not built\n"

#: Secret creation types served: those of ``Secret.from_dict`` inside an app or
#: outside one (modal/secret.py).
_ANONYMOUS = (
    api_pb2.OBJECT_CREATION_TYPE_ANONYMOUS_OWNED_BY_APP,
    api_pb2.OBJECT_CREATION_TYPE_EPHEMERAL,
)


def image_metadata(builder_version: str) -> api_pb2.ImageMetadata:
    """
    What an image reports of itself: this machine's Python (the containers run it),
    the builder version asked for and Modal's default working directory, ``/root``
    (modal/_image.py, ``_Image._hydrate_metadata``; ``workdir``).
    """
    v = sys.version_info
    return api_pb2.ImageMetadata(
        python_version_info=f"{v.major}.{v.minor}.{v.micro}",
        image_builder_version=builder_version,
        workdir="/root",
    )


class ObjectRpcs:
    """
    Mixin of the local Modal server serving images, mounts and secrets (see the
    module's docstring). Needs ``self.state`` and ``self.store``
    (:class:`~.blobs.ContentStore`).
    """

    async def ImageGetOrCreate(self, stream) -> None:
        """
        Record an image layer; answer its id, with the build result at once when the
        same definition was built before and ``force_build`` is not asked.
        """
        req = await stream.recv_message()
        key = hashlib.sha256(
            req.image.SerializeToString(deterministic=True)
            + req.builder_version.encode()
        ).hexdigest()[:22]
        image_id = f"im-{key}"
        with self.state.lock:
            built = image_id in self.state.images and not req.force_build
            self.state.images[image_id] = req.image
        response = api_pb2.ImageGetOrCreateResponse(image_id=image_id)
        if built:
            response.result.status = _SUCCESS
            response.metadata.CopyFrom(image_metadata(req.builder_version))
        await stream.send_message(response)

    async def ImageJoinStreaming(self, stream) -> None:
        """
        Stream a layer's build output (:data:`BUILD_LOG`), then its result as the
        stream's last message (``eof``): success with its metadata (nothing is
        built, see the module's docstring), or, where the server's
        :class:`~.faults.BuildFault` fails it, the fault's log line on stderr and a
        ``GENERIC_STATUS_FAILURE`` result (the layer is then forgotten: its next
        request builds again).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown image.
        """
        req = await stream.recv_message()
        with self.state.lock:
            known = req.image_id in self.state.images
            fault = self.state.faults.build
            failing = known and fault is not None and fault.fails()
            if failing:
                del self.state.images[req.image_id]
        if not known:
            raise GRPCError(Status.NOT_FOUND, f"Image {req.image_id} not found")
        out = api_pb2.FILE_DESCRIPTOR_STDOUT
        await stream.send_message(
            api_pb2.ImageJoinStreamingResponse(
                task_logs=[
                    api_pb2.TaskLogs(
                        data=BUILD_LOG.format(image_id=req.image_id),
                        file_descriptor=out,
                    )
                ],
                entry_id="1-0",
            )
        )
        if failing:
            logs = [
                api_pb2.TaskLogs(
                    data=fault.log.rstrip("\n") + "\n",
                    file_descriptor=api_pb2.FILE_DESCRIPTOR_STDERR,
                )
            ]
            result = api_pb2.GenericResult(status=_FAILURE, exception=fault.exception)
            await stream.send_message(
                api_pb2.ImageJoinStreamingResponse(
                    task_logs=logs if fault.log else [],
                    result=result,
                    entry_id="2-0",
                    eof=True,
                )
            )
            return
        await stream.send_message(
            api_pb2.ImageJoinStreamingResponse(
                result=api_pb2.GenericResult(status=_SUCCESS),
                metadata=image_metadata(IMAGE_BUILDER_VERSION),
                entry_id="2-0",
                eof=True,
            )
        )

    async def MountBatchedCheckExistence(self, stream) -> None:
        """Answer which of the file contents (by SHA-256) the server lacks."""
        req = await stream.recv_message()
        missing = [h for h in req.sha256_hex_hashes if not self.store.has_content(h)]
        checked_at = Timestamp()
        checked_at.GetCurrentTime()
        await stream.send_message(
            api_pb2.MountBatchedCheckExistenceResponse(
                missing_sha256_hex_hashes=missing, checked_at=checked_at
            )
        )

    async def MountGetOrCreate(self, stream) -> None:
        """
        Record a mount (its files by path and SHA-256) and answer its id.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a file whose content was never sent; UNIMPLEMENTED for a
            named (deployed) mount.
        """
        req = await stream.recv_message()
        if req.deployment_name:
            await stream.send_message(self._client_mount(req))
            return
        for f in req.files:
            if not self.store.has_content(f.sha256_hex):
                raise GRPCError(Status.NOT_FOUND, f"content of {f.filename} not sent")
        digest = hashlib.sha256()
        for f in sorted(req.files, key=lambda f: f.filename):
            digest.update(f"{f.filename}\0{f.sha256_hex}\0".encode())
        mount_id = new_id("mo")
        with self.state.lock:
            self.state.mounts[mount_id] = req
        await stream.send_message(
            api_pb2.MountGetOrCreateResponse(
                mount_id=mount_id,
                handle_metadata=api_pb2.MountHandleMetadata(
                    content_checksum_sha256_hex=digest.hexdigest()
                ),
            )
        )

    def _client_mount(self, req) -> api_pb2.MountGetOrCreateResponse:
        """
        The client package's mount, ``modal-client-mount-<version>`` in the global
        namespace, which every function mounts (modal/mount.py, ``_get_client_mount``,
        ``client_mount_name``): empty here, as containers run the installed client.

        Raises
        ------
        grpclib.GRPCError
            UNIMPLEMENTED for any other named mount.
        """
        if not (
            req.deployment_name.startswith("modal-client-mount-")
            and req.namespace == api_pb2.DEPLOYMENT_NAMESPACE_GLOBAL
        ):
            raise GRPCError(
                Status.UNIMPLEMENTED,
                "UNIMPLEMENTED: MountGetOrCreate of a named mount "
                f"({req.deployment_name})",
            )
        mount_id = f"mo-{hashlib.sha256(req.deployment_name.encode()).hexdigest()[:22]}"
        with self.state.lock:
            self.state.mounts[mount_id] = req
        return api_pb2.MountGetOrCreateResponse(
            mount_id=mount_id,
            handle_metadata=api_pb2.MountHandleMetadata(
                content_checksum_sha256_hex=hashlib.sha256(b"").hexdigest()
            ),
        )

    async def SecretGetOrCreate(self, stream) -> None:
        """
        Record an anonymous secret (``Secret.from_dict``) and answer its id.

        Raises
        ------
        grpclib.GRPCError
            UNIMPLEMENTED for a named secret (``Secret.from_name``, ``modal secret
            create``).
        """
        req = await stream.recv_message()
        if req.deployment_name or req.object_creation_type not in _ANONYMOUS:
            raise GRPCError(
                Status.UNIMPLEMENTED,
                "UNIMPLEMENTED: SecretGetOrCreate of a named secret "
                f"({req.deployment_name!r})",
            )
        secret_id = new_id("st")
        with self.state.lock:
            self.state.secrets[secret_id] = dict(req.env_dict)
        await stream.send_message(
            api_pb2.SecretGetOrCreateResponse(secret_id=secret_id)
        )
