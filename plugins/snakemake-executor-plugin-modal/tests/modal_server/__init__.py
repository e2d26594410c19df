"""
A local server that speaks Modal's gRPC API (``modal_proto``), for the plugin's tests
to run the real, unmodified ``modal`` client against (``MODAL_SERVER_URL``). See
README.md for what it serves and where each behaviour comes from.

Phase 1 serves the handshake, environments, ephemeral apps and volumes. What the
plugin's other paths call, for phase 2 (modal 1.6.4, read in the client):

- ``image.build()``: an ephemeral app of its own, then ``ImageGetOrCreate`` and
  ``ImageJoinStreaming`` per layer (modal/_image.py); local sources:
  ``MountGetOrCreate``, ``MountBatchedCheckExistence``, ``MountPutFile``
  (modal/mount.py).
- ``Secret.from_dict`` in the app: ``SecretGetOrCreate``
  (``OBJECT_CREATION_TYPE_ANONYMOUS_OWNED_BY_APP``; modal/secret.py).
- ``app.function``: ``FunctionPrecreate``, ``FunctionCreate`` with
  ``timeout_secs = timeout`` and ``startup_timeout_secs = startup_timeout or
  timeout`` (modal/app.py, modal/_functions.py); ``with_options``:
  ``FunctionBindParams`` (``FunctionOptions.timeout_secs``, ``resources``).
- ``spawn``: ``FunctionMap`` (async invocation, one pipelined input; else
  ``FunctionPutInputs``); ``FunctionCall.get(timeout=0)``: ``FunctionGetOutputs``;
  ``cancel``: ``FunctionCallCancel``; large payloads: ``BlobCreate``/``BlobGet``.
- Containers: ``ContainerHello``, ``ContainerHeartbeat``, ``FunctionGetInputs``,
  ``FunctionPutOutputs``, ``ContainerStop`` (modal/_runtime/container_io_manager.py).
"""

from .base import RPC_NAMES, UnimplementedModalServer, implemented_rpcs
from .server import LocalModal, LocalModalServer, serve
from .state import AppRecord, CallRecord, ServerState, VolumeRecord

__all__ = [
    "RPC_NAMES",
    "AppRecord",
    "CallRecord",
    "LocalModal",
    "LocalModalServer",
    "ServerState",
    "UnimplementedModalServer",
    "VolumeRecord",
    "implemented_rpcs",
    "serve",
]
