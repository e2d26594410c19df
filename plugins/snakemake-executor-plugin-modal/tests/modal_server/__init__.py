"""
A local server that speaks Modal's gRPC API (``modal_proto``), for the plugin's tests
to run the real, unmodified ``modal`` client against (``MODAL_SERVER_URL``). See
README.md for what it serves and where each behaviour comes from.
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
