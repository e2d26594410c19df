"""
Content stores of the local Modal server and the plain-HTTP server for the URLs the
client sends bytes to or fetches them from.

Modal moves file bytes outside gRPC: the server answers with URLs, the client PUTs or
GETs them with aiohttp (modal 1.6.4, modal/_utils/http_utils.py,
``ClientSessionRegistry``). Three kinds are served here, on 127.0.0.1:

- ``PUT /blobs/<blob_id>``: a blob the client asked for with ``BlobCreate`` (v1
  volume files of 4 MiB or more, ``LARGE_FILE_LIMIT`` in modal/_utils/blob_utils.py).
  The answer's ``ETag`` is the quoted MD5 hex of the body, which the client compares
  with its own (``_upload_to_s3_url``, same file).
- ``PUT /blocks/<sha256 hex>``: a block of a v2 volume file that ``VolumePutFiles2``
  reported missing; the answer's body is the block's ``put_response``, which the client
  sends back in its next ``VolumePutFiles2`` (``_put_missing_blocks``,
  modal/volume.py).
- ``GET /blobs/<blob_id>``: a blob that ``BlobGet`` pointed at (large function
  arguments and results, ``blob_download`` in modal/_utils/blob_utils.py).
- ``GET /blocks/<sha256 hex>``: a piece of a file that ``VolumeGetFile2`` pointed at;
  trailing zero bytes are left out, as the client pads each piece to its expected
  length (``read_file`` and ``_read_block_body``, modal/volume.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

from aiohttp import web

__all__ = ["BLOCK_PUT_RESPONSE_PREFIX", "ContentStore", "http_app"]

#: What a block's PUT answers, followed by its SHA-256 hex: the ``put_response`` that
#: ``VolumePutFiles2`` checks when the client sends it back.
BLOCK_PUT_RESPONSE_PREFIX = b"local-modal-block:"


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class ContentStore:
    """
    Bytes kept by their SHA-256 (file contents, volume blocks) or by blob id, in
    folders under ``root``.

    Parameters
    ----------
    root : pathlib.Path
        The server's folder; ``content/``, ``blocks/`` and ``blobs/`` are made in it.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        for sub in ("content", "blocks", "blobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        #: Blob id -> (expected length in bytes, expected MD5 as base64).
        self.pending_blobs: dict[str, tuple[int, str]] = {}
        #: ``http://127.0.0.1:<port>``, once the HTTP server listens.
        self.base_url = ""

    # -- whole files by SHA-256 (v1 volumes: MountPutFile) -----------------------
    def content_path(self, sha256_hex: str) -> Path:
        """Where the file content with this SHA-256 (hex) is kept."""
        return self.root / "content" / sha256_hex

    def has_content(self, sha256_hex: str) -> bool:
        """Whether the file content with this SHA-256 (hex) was uploaded."""
        return self.content_path(sha256_hex).is_file()

    def put_content(self, data: bytes) -> str:
        """Keep a file's content; returns its SHA-256 hex."""
        digest = hashlib.sha256(data).hexdigest()
        if not self.has_content(digest):
            _write_atomic(self.content_path(digest), data)
        return digest

    # -- blocks by SHA-256 (v2 volumes; read_file of any volume) ---------------
    def block_path(self, sha256_hex: str) -> Path:
        """Where the block with this SHA-256 (hex) is kept."""
        return self.root / "blocks" / sha256_hex

    def has_block(self, sha256_hex: str) -> bool:
        """Whether the block with this SHA-256 (hex) is kept."""
        return self.block_path(sha256_hex).is_file()

    def put_block(self, data: bytes) -> str:
        """Keep a block; returns its SHA-256 hex."""
        digest = hashlib.sha256(data).hexdigest()
        if not self.has_block(digest):
            _write_atomic(self.block_path(digest), data)
        return digest

    def block_url(self, sha256_hex: str) -> str:
        """The URL the client PUTs or GETs the block at."""
        return f"{self.base_url}/blocks/{sha256_hex}"

    # -- blobs by id (BlobCreate) ----------------------------------------------
    def new_blob(self, blob_id: str, length: int, md5_base64: str) -> str:
        """
        Expect a blob of ``length`` bytes whose MD5 is ``md5_base64``; returns the URL
        the client PUTs it at (``BlobCreate``).
        """
        self.pending_blobs[blob_id] = (length, md5_base64)
        return f"{self.base_url}/blobs/{blob_id}"

    def blob_bytes(self, blob_id: str) -> bytes | None:
        """The uploaded blob's bytes, or None if it was not uploaded."""
        path = self.root / "blobs" / blob_id
        return path.read_bytes() if path.is_file() else None


def http_app(store: ContentStore, state=None) -> web.Application:
    """
    The aiohttp application serving ``store``'s URLs (see the module's docstring).

    Parameters
    ----------
    store : ContentStore
        Where the bytes are kept.
    state : ServerState, optional
        The server's state, whose ``faults.http`` (:class:`~.faults.HttpFault`) may
        fail a request: its body is read and dropped, the fault's status answered.

    Returns
    -------
    aiohttp.web.Application
        Its answers: 200 on success; 404 for an unknown blob id or block; 400 for a
        body whose length, MD5 or SHA-256 is not the one announced; a fault's status.
    """

    @web.middleware
    async def faults(request: web.Request, handler):
        if state is not None:
            with state.lock:
                fault = state.faults.http_fault(request.method, request.path)
            if fault is not None:
                await request.read()
                return web.Response(
                    status=fault.status,
                    text=f"{request.method} {request.path}: fault injected by the test",
                )
        return await handler(request)

    async def put_blob(request: web.Request) -> web.Response:
        blob_id = request.match_info["blob_id"]
        if blob_id not in store.pending_blobs:
            return web.Response(status=404, text=f"no blob {blob_id} was created")
        length, md5_base64 = store.pending_blobs[blob_id]
        body = await request.read()
        md5 = hashlib.md5(body)
        if len(body) != length or base64.b64encode(md5.digest()).decode() != md5_base64:
            return web.Response(status=400, text="length or MD5 is not the announced")
        _write_atomic(store.root / "blobs" / blob_id, body)
        del store.pending_blobs[blob_id]
        return web.Response(status=200, headers={"ETag": f'"{md5.hexdigest()}"'})

    async def put_block(request: web.Request) -> web.Response:
        digest = request.match_info["sha256"]
        body = await request.read()
        if hashlib.sha256(body).hexdigest() != digest:
            return web.Response(status=400, text="SHA-256 is not the block's")
        store.put_block(body)
        return web.Response(
            status=200, body=BLOCK_PUT_RESPONSE_PREFIX + digest.encode()
        )

    async def get_block(request: web.Request) -> web.Response:
        digest = request.match_info["sha256"]
        if not store.has_block(digest):
            return web.Response(status=404, text=f"no block {digest}")
        return web.Response(status=200, body=store.block_path(digest).read_bytes())

    async def get_blob(request: web.Request) -> web.Response:
        blob_id = request.match_info["blob_id"]
        data = store.blob_bytes(blob_id)
        if data is None:
            return web.Response(status=404, text=f"no blob {blob_id}")
        return web.Response(status=200, body=data)

    app = web.Application(client_max_size=1 << 30, middlewares=[faults])
    app.router.add_put("/blobs/{blob_id}", put_blob)
    app.router.add_get("/blobs/{blob_id}", get_blob)
    app.router.add_put("/blocks/{sha256}", put_block)
    app.router.add_get("/blocks/{sha256}", get_block)
    return app
