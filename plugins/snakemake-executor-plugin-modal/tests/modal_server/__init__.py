"""
A local server that speaks Modal's gRPC API (``modal_proto``), for the plugin's tests
to run the real, unmodified ``modal`` client against (``MODAL_SERVER_URL``). See
README.md for what it serves and where each behaviour comes from.

It serves the handshake, environments, apps (ephemeral ones stopped when their
client disconnects or stops heartbeating), volumes, images (recorded, not built),
mounts, secrets, functions as ``FunctionCreate`` carries them, ``with_options``,
``spawn``/``get``/``cancel``, and containers: local processes of Modal's own
container entrypoint, killed at their start-up or execution timeout. Every other RPC
answers UNIMPLEMENTED. Faults (failing RPCs, HTTP uploads, commits and image builds,
preemption, slow or early containers) are injected on request (:mod:`.faults`).
"""

from .base import RPC_NAMES, UnimplementedModalServer, implemented_rpcs
from .faults import (
    BuildFault,
    CommitFault,
    ContainerLoss,
    Faults,
    HttpFault,
    Preemption,
    RpcFault,
    Unanswered,
)
from .server import LocalModal, LocalModalServer, serve
from .state import (
    AppRecord,
    CallRecord,
    ContainerRecord,
    FunctionCallRecord,
    FunctionRecord,
    ServerState,
    VolumeRecord,
)

__all__ = [
    "RPC_NAMES",
    "AppRecord",
    "BuildFault",
    "CallRecord",
    "CommitFault",
    "ContainerLoss",
    "ContainerRecord",
    "Faults",
    "FunctionCallRecord",
    "FunctionRecord",
    "HttpFault",
    "LocalModal",
    "LocalModalServer",
    "Preemption",
    "RpcFault",
    "ServerState",
    "Unanswered",
    "UnimplementedModalServer",
    "VolumeRecord",
    "implemented_rpcs",
    "serve",
]
