"""Exceptions of the fake ``modal`` package (same names and hierarchy as Modal 1.x).

Note that ``TimeoutError`` here is *not* the builtin: as in real Modal it derives
from ``modal.exception.Error`` only.
"""


class Error(Exception):
    """Base class of all fake Modal errors."""


class InvalidError(Error):
    """Invalid use of the API (e.g. spawning a function of an app not running)."""


class NotFoundError(Error):
    """A named object (volume, path in a volume, function call) does not exist."""


class RemoteError(Error):
    """The remote function raised.

    The message holds type, message and remote traceback.
    """


# shadows the builtin on purpose, like real Modal
class TimeoutError(Error):  # noqa: A001
    """An operation did not finish within the given timeout.

    (E.g. ``FunctionCall.get``.)
    """


class FunctionTimeoutError(TimeoutError):
    """The remote function ran longer than its ``timeout``; its container was killed."""


class OutputExpiredError(TimeoutError):
    """The call's result is no longer kept by Modal (``FunctionCall.get`` too late)."""


class ConnectionError(Error):  # noqa: A001 - Modal's name
    """The client lost its connection to Modal's servers (a transport error)."""


class InternalError(Error):
    """Modal's servers failed (retryable)."""


class ServiceError(Error):
    """A Modal service is unavailable (retryable)."""


class ExecutionError(Error):
    """The call failed for a reason other than the function raising.

    (Killed, preempted, cancelled.)
    """


class ImageBuildError(RemoteError):
    """An image build failed; ``image_id`` names the image (as in Modal 1.6)."""

    def __init__(self, message: str, image_id: str):
        super().__init__(message)
        self.image_id = image_id


class _PathNotFoundError(NotFoundError, FileNotFoundError):
    """Missing file in a volume.

    Both ``NotFoundError`` and the builtin ``FileNotFoundError``. Real Modal 1.x raises
    ``FileNotFoundError`` from ``read_file``/``remove_file`` and ``NotFoundError`` from
    the server in other places; catching either works with the fake.
    """


class AuthError(Error):
    """Missing or invalid credentials (a wrong, revoked or expired token)."""


# The server's gRPC statuses the client raises as errors of their own
# (``_GRPCErrorWrapper`` subclasses in ``modal/exception.py``, Modal 1.6): raised by
# the client, not in a container, and no verdict on a call that is running.
class ResourceExhaustedError(Error):
    """A rate limit or quota of the workspace was hit (gRPC RESOURCE_EXHAUSTED)."""


class PermissionDeniedError(Error):
    """The token may not do this (gRPC PERMISSION_DENIED)."""


class AlreadyExistsError(Error):
    """The object exists already (gRPC ALREADY_EXISTS)."""


class ConflictError(InvalidError):
    """A conflicting change (gRPC ABORTED); an ``InvalidError`` as in Modal 1.6."""


class DataLossError(Error):
    """Data was lost on the server (gRPC DATA_LOSS)."""


class UnimplementedError(Error):
    """The server does not offer this (gRPC UNIMPLEMENTED)."""


class ClientClosed(Error):
    """The client was closed (``modal/exception.py``)."""


class InternalFailure(Error):
    """The call failed inside Modal (``GENERIC_STATUS_INTERNAL_FAILURE``)."""


class SerializationError(Error):
    """An object (e.g. a container's exception) could not be pickled."""


class DeserializationError(Error):
    """A pickled object could not be read back."""


class ModuleNotMountable(Exception):
    """
    A local package that ``add_local_python_source`` cannot mount (not installed, no
    source files, binary files); as in Modal 1.6 (``modal/exception.py``), *not* a
    ``modal.exception.Error``.
    """
