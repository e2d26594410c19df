"""
The server base: every RPC of Modal's API answers UNIMPLEMENTED until a mixin of this
package serves it.

``modal_proto.api_grpc.ModalClientBase`` (modal 1.6.4) is the server side of the API
that the client ships: one abstract ``async def Name(self, stream)`` per RPC and a
``__mapping__`` that routes ``/modal.client.ModalClient/Name`` to it. The defaults are
generated from its abstract methods, so an RPC that a later client adds is answered
UNIMPLEMENTED too, and a client upgrade that starts calling it fails a test instead of
meeting a silent stand-in.
"""

from __future__ import annotations

from grpclib import GRPCError, Status
from modal_proto.api_grpc import ModalClientBase

__all__ = ["RPC_NAMES", "UnimplementedModalServer", "implemented_rpcs"]

#: Every RPC of the API, as ``ModalClientBase`` declares them (its abstract methods).
RPC_NAMES: frozenset[str] = frozenset(ModalClientBase.__abstractmethods__)


def _unimplemented(name: str):
    async def handler(self, stream) -> None:
        await stream.recv_message()  # recorded by the server (server.py, on_request)
        # grpclib sends the status and message as the response's trailers; the client
        # turns UNIMPLEMENTED into modal.exception.UnimplementedError without retrying
        # (modal 1.6.4, modal/_grpc_client.py, _STATUS_TO_EXCEPTION; modal/_utils/
        # grpc_utils.py, RETRYABLE_GRPC_STATUS_CODES).
        raise GRPCError(
            Status.UNIMPLEMENTED,
            f"UNIMPLEMENTED: {name} is not served by the local Modal test server",
        )

    handler.__name__ = handler.__qualname__ = name
    handler.__doc__ = f"``{name}``: not served (answers UNIMPLEMENTED)."
    handler._unimplemented = True
    return handler


#: ``ModalClientBase`` with every abstract RPC answering UNIMPLEMENTED.
UnimplementedModalServer = type(
    "UnimplementedModalServer",
    (ModalClientBase,),
    {
        "__doc__": (
            "Modal's server base class (``modal_proto.api_grpc.ModalClientBase``, "
            "modal 1.6.4) with every RPC answering gRPC status UNIMPLEMENTED; "
            "subclasses override the RPCs they serve."
        ),
        "__module__": __name__,
        **{name: _unimplemented(name) for name in sorted(RPC_NAMES)},
    },
)


def implemented_rpcs(server_class: type) -> frozenset[str]:
    """
    The RPCs that ``server_class`` serves (those not answering UNIMPLEMENTED).

    Parameters
    ----------
    server_class : type
        A subclass of :class:`UnimplementedModalServer`.

    Returns
    -------
    frozenset of str
        RPC names, such as ``"VolumeGetOrCreate"``.
    """
    return frozenset(
        name
        for name in RPC_NAMES
        if not getattr(getattr(server_class, name), "_unimplemented", False)
    )
