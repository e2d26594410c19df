"""
The local Modal server: gRPC (grpclib) and plain HTTP on 127.0.0.1, in a background
thread of the test process, for the real ``modal`` client pointed at it by
``MODAL_SERVER_URL``.

The client opens a plain-text HTTP/2 channel for an ``http://`` URL (modal 1.6.4,
modal/_utils/grpc_utils.py, ``create_channel``: TLS only for ``https``) and sends
its credentials as metadata on every request: ``x-modal-token-id`` and
``x-modal-token-secret`` with ``x-modal-client-type`` ``CLIENT_TYPE_CLIENT``
(modal/client.py, ``_get_metadata``), or, given Modal's OAuth settings
(``MODAL_OAUTH_*``), ``x-modal-refresh-token``, ``x-modal-oauth-client-id`` and
``x-modal-oauth-client-secret`` (same function; what Modal's server does with them is
not in the client: this one compares them with its own). This server checks them on
every RPC and answers
UNAUTHENTICATED otherwise, which the client raises as ``modal.exception.AuthError``
(modal/_grpc_client.py). A container's client (``CLIENT_TYPE_CONTAINER``, no token)
is accepted with the task id and secret the server gave the container
(:mod:`.containers`), and only for the RPCs a container sends.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpclib.events
from aiohttp import web
from grpclib import GRPCError, Status
from grpclib.server import Server
from modal_proto import api_pb2

from .apps import AppRpcs
from .base import UnimplementedModalServer
from .blobs import ContentStore, http_app
from .containers import APP_HEARTBEAT_TIMEOUT_S, ContainerRpcs
from .faults import CLIENT, CONTAINER, Faults
from .functions import FunctionRpcs
from .objects import ObjectRpcs
from .state import CallRecord, ServerState, new_id
from .volumes import DEFAULT_ENVIRONMENT, VolumeRpcs

__all__ = ["LocalModal", "LocalModalServer", "serve"]

#: Modal's OAuth settings, by the metadata key the client sends each in (modal 1.6.4,
#: modal/client.py, ``_get_metadata``; a JWT key is sent as an assertion instead,
#: which this server does not take).
OAUTH_METADATA = {
    "MODAL_OAUTH_REFRESH_TOKEN": "x-modal-refresh-token",
    "MODAL_OAUTH_CLIENT_ID": "x-modal-oauth-client-id",
    "MODAL_OAUTH_CLIENT_SECRET": "x-modal-oauth-client-secret",
}

#: Metadata not recorded in :attr:`~.state.CallRecord.metadata`.
_SECRET_KEYS = frozenset(
    {
        "x-modal-token-secret",
        "x-modal-task-secret",
        "x-modal-refresh-token",
        "x-modal-oauth-client-secret",
    }
)

#: The RPCs a container's client may send: its own (modal/_runtime/
#: container_io_manager.py), volume commits and reloads (modal/volume.py), blobs of
#: large arguments and results (modal/_utils/blob_utils.py), and what the function's
#: own code may call on the app's objects (spawn, get, cancel, volumes).
CONTAINER_RPCS = frozenset(
    {
        "BlobCreate",
        "BlobGet",
        "ContainerHeartbeat",
        "ContainerHello",
        "ContainerStop",
        "FunctionBindParams",
        "FunctionCallCancel",
        "FunctionGetInputs",
        "FunctionGetOutputs",
        "FunctionMap",
        "FunctionPutInputs",
        "FunctionPutOutputs",
        "MountPutFile",
        "VolumeCommit",
        "VolumeGetFile2",
        "VolumeGetOrCreate",
        "VolumeListFiles",
        "VolumeListFiles2",
        "VolumePutFiles",
        "VolumePutFiles2",
        "VolumeReload",
        "VolumeRemoveFile",
        "VolumeRemoveFile2",
    }
)


class LocalModalServer(
    AppRpcs,
    VolumeRpcs,
    ObjectRpcs,
    FunctionRpcs,
    ContainerRpcs,
    UnimplementedModalServer,
):
    """
    The gRPC servicer: :class:`~.apps.AppRpcs`, :class:`~.volumes.VolumeRpcs`,
    :class:`~.objects.ObjectRpcs`, :class:`~.functions.FunctionRpcs` and
    :class:`~.containers.ContainerRpcs` over a base whose every other RPC answers
    UNIMPLEMENTED (:mod:`.base`).

    Parameters
    ----------
    state : ServerState
        What it holds and records.
    store : ContentStore
        Where uploaded bytes are kept.
    base_url : str
        The HTTP server's URL (``http://127.0.0.1:<port>``).
    url : str
        The gRPC server's URL, given to containers.
    container_heartbeat_s : float
        Seconds between a container's heartbeats (``MODAL_HEARTBEAT_INTERVAL`` of its
        client; Modal's is 15).
    """

    def __init__(
        self,
        state: ServerState,
        store: ContentStore,
        base_url: str,
        url: str = "",
        container_heartbeat_s: float = 15.0,
    ):
        self.state = state
        self.store = store
        self.base_url = base_url
        self.url = url
        self.container_heartbeat_s = container_heartbeat_s

    def _client_credentials(self, metadata) -> bool:
        """Whether a client's request carries the token this server accepts or its
        OAuth credentials (``ServerState.oauth``, :data:`OAUTH_METADATA`), not both."""
        token = metadata.get("x-modal-token-id") == self.state.token_id and (
            metadata.get("x-modal-token-secret") == self.state.token_secret
        )
        oauth = all(
            metadata.get(OAUTH_METADATA[name]) == value
            for name, value in self.state.oauth.items()
        )
        return token != oauth

    async def on_request(self, event: grpclib.events.RecvRequest) -> None:
        """
        Record the call and check its credentials (a grpclib ``RecvRequest``
        listener); wrap the handler so that its request messages and final status are
        recorded too.

        Raises
        ------
        grpclib.GRPCError
            UNAUTHENTICATED for another client type or other credentials; the status
            of an :class:`~.faults.RpcFault` that fails this call (nothing served).
        """
        metadata = {
            k: v
            for k, v in event.metadata.items()
            if isinstance(v, str) and k not in _SECRET_KEYS
        }
        record = CallRecord(
            method=event.method_name.rsplit("/", 1)[-1],
            at=self.state.now(),
            metadata=metadata,
        )
        with self.state.lock:
            self.state.calls.append(record)
        client_type = event.metadata.get("x-modal-client-type")
        if client_type == str(api_pb2.CLIENT_TYPE_CONTAINER):
            with self.state.lock:
                container = self.state.containers.get(
                    event.metadata.get("x-modal-task-id", "")
                )
            if (
                container is None
                or event.metadata.get("x-modal-task-secret") != container.secret
                or record.method not in CONTAINER_RPCS
            ):
                record.status = Status.UNAUTHENTICATED.name
                raise GRPCError(
                    Status.UNAUTHENTICATED,
                    f"container call {record.method}: unknown task or not served "
                    "to containers",
                )
        elif client_type != str(api_pb2.CLIENT_TYPE_CLIENT):
            record.status = Status.UNAUTHENTICATED.name
            raise GRPCError(
                Status.UNAUTHENTICATED,
                f"client type {client_type!r}: only CLIENT_TYPE_CLIENT and "
                "CLIENT_TYPE_CONTAINER are served",
            )
        elif not self._client_credentials(event.metadata):
            record.status = Status.UNAUTHENTICATED.name
            raise GRPCError(Status.UNAUTHENTICATED, "Token ID or secret is invalid")
        caller = (
            CONTAINER if client_type == str(api_pb2.CLIENT_TYPE_CONTAINER) else CLIENT
        )
        with self.state.lock:
            fault = self.state.faults.rpc_fault(record.method, caller)
        handler = event.method_func

        async def recorded(stream) -> None:
            receive = stream.recv_message

            async def recv_message():
                message = await receive()
                if message is not None:
                    record.requests.append(message)
                return message

            stream.recv_message = recv_message
            if fault is not None:  # its request recorded, nothing served
                await stream.recv_message()
                record.status = fault.status
                raise GRPCError(Status[fault.status], fault.text)
            try:
                await handler(stream)
            except GRPCError as e:
                record.status = e.status.name
                raise
            except Exception:  # grpclib answers INTERNAL (and logs the traceback)
                record.status = Status.INTERNAL.name
                raise
            record.status = "OK"

        event.method_func = recorded


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LocalModal:
    """
    A running local Modal server (gRPC and HTTP), its state and the environment a
    client process needs to use it.

    Parameters
    ----------
    root : pathlib.Path
        The server's folder (volumes, uploaded bytes); made if missing.
    token_id, token_secret : str
        The credentials it accepts.
    app_heartbeat_timeout_s : float
        Seconds without a heartbeat after which an ephemeral app is stopped and its
        containers killed (default :data:`~.containers.APP_HEARTBEAT_TIMEOUT_S`).
    container_heartbeat_s : float
        Seconds between a container's heartbeats (Modal's: 15); a cancel without
        ``terminate_containers`` reaches a container at its next heartbeat.
    gpu_queue_delay_s : float
        Seconds a call of a GPU function waits before its container starts (not
        billed; :attr:`~.state.ServerState.gpu_queue_delay_s`).
    background_commit_s : float or None
        Seconds between background commits of a running container's volumes (None:
        none; :mod:`.views`).
    faults : Faults or None
        The faults the server injects (:class:`~.faults.Faults`); changeable while
        it runs through :attr:`faults`.

    Attributes
    ----------
    url : str
        ``http://127.0.0.1:<port>``: the gRPC server, for ``MODAL_SERVER_URL``.
    http_url : str
        ``http://127.0.0.1:<port>``: the HTTP server of upload and download URLs.
    state : ServerState
        What the server holds and recorded.
    """

    def __init__(
        self,
        root: Path,
        token_id: str = "ak-local-test",
        token_secret: str = "as-local-test",
        app_heartbeat_timeout_s: float = APP_HEARTBEAT_TIMEOUT_S,
        container_heartbeat_s: float = 15.0,
        gpu_queue_delay_s: float = 0.0,
        background_commit_s: float | None = None,
        faults: Faults | None = None,
    ):
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self.state = ServerState(root, token_id, token_secret)
        self.state.app_heartbeat_timeout_s = app_heartbeat_timeout_s
        self.state.gpu_queue_delay_s = gpu_queue_delay_s
        self.state.background_commit_s = background_commit_s
        self.state.faults = faults if faults is not None else Faults()
        self.container_heartbeat_s = container_heartbeat_s
        self.state.environments[DEFAULT_ENVIRONMENT] = new_id("en")
        self.store = ContentStore(root)
        self.url = self.http_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> LocalModal:
        """
        Start both servers in a background thread; returns ``self``.

        Raises
        ------
        RuntimeError
            If it is running already.
        concurrent.futures.TimeoutError
            If the servers did not listen within ``timeout_s`` seconds.
        """
        if self._thread is not None:
            raise RuntimeError("the local Modal server is running already")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="local-modal-server", daemon=True
        )
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout_s)
        return self

    async def _start(self) -> None:
        http_sock, grpc_sock = _listening_socket(), _listening_socket()
        self.http_url = f"http://127.0.0.1:{http_sock.getsockname()[1]}"
        self.url = f"http://127.0.0.1:{grpc_sock.getsockname()[1]}"
        self.store.base_url = self.http_url
        self._runner = web.AppRunner(http_app(self.store, self.state), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, http_sock).start()
        self.servicer = LocalModalServer(
            self.state,
            self.store,
            self.http_url,
            url=self.url,
            container_heartbeat_s=self.container_heartbeat_s,
        )
        self._grpc = Server([self.servicer])
        grpclib.events.listen(
            self._grpc, grpclib.events.RecvRequest, self.servicer.on_request
        )
        await self._grpc.start(sock=grpc_sock)
        self._watch = asyncio.ensure_future(self.servicer.watch())

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop both servers and their thread (running requests are cancelled)."""
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._loop.close()
        self._thread = self._loop = None

    async def _stop(self) -> None:
        self._watch.cancel()
        for container in self.state.running_containers():
            self.servicer._kill(container, "server stopped")
            await asyncio.to_thread(container.process.wait)
            container.ended_at = self.state.now()
            container.returncode = container.process.returncode
        self._grpc.close()
        await self._grpc.wait_closed()
        await self._runner.cleanup()

    def client_env(
        self,
        base: dict[str, str] | None = None,
        heartbeat_interval_s: float = 15.0,
        oauth: bool = False,
    ) -> dict[str, str]:
        """
        The environment of a process running the real ``modal`` client against this
        server.

        Parameters
        ----------
        base : dict, optional
            The environment to start from (default: ``os.environ``).
        heartbeat_interval_s : float
            Seconds between an app's heartbeats (``MODAL_HEARTBEAT_INTERVAL``, read
            when ``modal.client`` is imported; Modal's default is 15).
        oauth : bool
            Give the OAuth credentials the server accepts (``MODAL_OAUTH_*``,
            modal/config.py) instead of its token.

        Returns
        -------
        dict
            ``base`` with ``MODAL_SERVER_URL``, the credentials, a ``.modal.toml`` path
            that does not exist (``MODAL_CONFIG_PATH``, modal/config.py), 127.0.0.1
            left out of any proxy (``NO_PROXY``, modal/_utils/proxy_support.py), no
            other ``MODAL_*`` setting.
        """
        env = {
            k: v
            for k, v in (os.environ if base is None else base).items()
            if not k.startswith("MODAL_")
        }
        no_proxy = [p for p in env.get("NO_PROXY", "").split(",") if p]
        env["NO_PROXY"] = env["no_proxy"] = ",".join([*no_proxy, "127.0.0.1"])
        env.update(
            MODAL_SERVER_URL=self.url,
            MODAL_CONFIG_PATH=str(self.state.root / "no-modal.toml"),
            MODAL_HEARTBEAT_INTERVAL=str(heartbeat_interval_s),
            PYTHONUNBUFFERED="1",
        )
        if oauth:
            env.update(self.state.oauth)
        else:
            env.update(
                MODAL_TOKEN_ID=self.state.token_id,
                MODAL_TOKEN_SECRET=self.state.token_secret,
            )
        return env

    @property
    def faults(self) -> Faults:
        """The faults the server injects (``state.faults``): change them while it
        runs, e.g. ``server.faults.fail_rpc("FunctionGetOutputs", times=4)``."""
        return self.state.faults

    def __enter__(self) -> LocalModal:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def serve(root: Path, **kwargs) -> Iterator[LocalModal]:
    """
    Run a local Modal server for the block's duration.

    Parameters
    ----------
    root : pathlib.Path
        Its folder (see :class:`LocalModal`).
    **kwargs
        ``token_id``, ``token_secret``, ``app_heartbeat_timeout_s``,
        ``container_heartbeat_s``, ``gpu_queue_delay_s``, ``background_commit_s``,
        ``faults`` (see :class:`LocalModal`).

    Yields
    ------
    LocalModal
        The running server: its ``url``, ``state`` and ``client_env()``.
    """
    server = LocalModal(root, **kwargs)
    with server:
        yield server


if __name__ == "__main__":  # a server for a manual try: prints its URL, runs until ^C
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp)) as s:
        print(f"MODAL_SERVER_URL={s.url}", file=sys.stderr)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
