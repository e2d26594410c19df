"""
What a Modal error means, named once: the client's transport errors and rate limit
(a call whose status could not be read, not a failed call), an exception raised in
the container (the job's own failure), and the line a user reads when the run's
image or app cannot start.
"""

from __future__ import annotations

import re
import traceback

from snakemake_interface_common.exceptions import WorkflowError

from .preflight import oauth_in_use

__all__ = [
    "first_line",
    "raised_in_container",
    "start_error",
    "transport_errors",
    "unreadable_errors",
]


def transport_errors() -> tuple[type[BaseException], ...]:
    """
    Exceptions that, raised by the client itself (not in the container: see
    :func:`raised_in_container`), mean "Modal could not be asked", not "the call
    failed": the client's network (``OSError``, which includes Python's
    ``ConnectionError`` and a socket's ``TimeoutError``), Modal's ``ConnectionError``
    (what ``modal/_utils/grpc_utils.py`` raises once its retries of an ``OSError`` are
    spent), its ``TimeoutError`` (``RetryTimeoutError`` there, once the total deadline
    is spent), ``InternalError`` and ``ServiceError`` (server side, retryable), and
    grpclib's transport errors (Modal 1.6 speaks gRPC through grpclib).
    """
    import modal.exception

    errors = [
        OSError,
        modal.exception.ConnectionError,
        modal.exception.TimeoutError,
        modal.exception.InternalError,
        modal.exception.ServiceError,
    ]
    # the client's transport (a dependency of modal): a connection lost mid-call
    from grpclib.exceptions import StreamTerminatedError

    errors.append(StreamTerminatedError)
    return tuple(errors)


def unreadable_errors() -> tuple[type[BaseException], ...]:
    """
    Client-side errors after which a call counts as running for a while (its status
    could not be read, the call itself is fine): the transport errors
    (:func:`transport_errors`) and Modal's rate limit, ``ResourceExhaustedError``
    (gRPC RESOURCE_EXHAUSTED: the workspace sent too many requests).
    """
    import modal.exception

    return (*transport_errors(), modal.exception.ResourceExhaustedError)


#: How Modal names the frames of a traceback that come from a container: the file name
#: prefixed with ``<task id>:`` (``extract_traceback`` in ``modal/_traceback.py``).
_CONTAINER_FRAME = re.compile(r"^<ta-[^>]*>:")


def raised_in_container(exc: BaseException) -> bool:
    """
    Whether an exception that ``FunctionCall.get`` raised was raised in the container
    (and pickled there, then raised again here with its own class), not by the client.

    Modal 1.6 marks such an exception in two ways, both copied here: its container
    prefixes the traceback's file names with ``<task id>:`` (``extract_traceback``,
    ``modal/_traceback.py``, called by ``pickle_traceback`` in
    ``modal/_serialization.py`` from ``_runtime/container_io_manager.py``), and the
    client that raises it again gives it a ``__line_cache__`` attribute
    (``append_modal_tb``, ``modal/_traceback.py``, from ``_process_result`` in
    ``modal/_utils/function_utils.py``). An exception of the client's own (a transport
    error, ``poll_function``'s ``TimeoutError``) has neither.

    Parameters
    ----------
    exc : BaseException
        What ``FunctionCall.get`` raised.

    Returns
    -------
    bool
    """
    if getattr(exc, "__line_cache__", None) is not None:
        return True
    for frame in traceback.extract_tb(exc.__traceback__):
        if _CONTAINER_FRAME.match(frame.filename or ""):
            return True
    return False


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def start_error(
    exc: BaseException, gpus: list | None = None, doing: str = "start the run's app"
) -> WorkflowError:
    """
    What went wrong when the run's image was built or its app started, named for what
    it is, as one line a user can act on; nothing was submitted.

    Parameters
    ----------
    exc : BaseException
        What ``Image.build`` or entering ``App.run()`` raised.
    gpus : list, optional
        The GPU specifications of the app's functions (named when the server rejects
        one).
    doing : str
        What the client was doing, for the line of an unreachable Modal.

    Returns
    -------
    WorkflowError

    Notes
    -----
    Modal 1.6 raises, at this point: ``ImageBuildError`` (a failed build step; its
    message names ``modal image logs <id>``), ``AuthError`` (a wrong, revoked or
    expired token), ``InvalidError`` from the server (a GPU type it does not offer,
    a Python its image builder does not support: ``_validate_python_version`` in
    ``modal/_image.py``), ``ModuleNotMountable`` (``modal/_utils/package_utils.py``:
    a local package that cannot be mounted; not a ``modal.exception.Error``), and the
    client's ``ConnectionError`` when Modal cannot be reached.
    """
    import modal.exception

    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = f"{type(exc).__name__}: {first}"
    tail = "; nothing was submitted"
    if isinstance(exc, modal.exception.ImageBuildError):
        image_id = getattr(exc, "image_id", None)
        hint = f"; see `modal image logs {image_id}`" if image_id else ""
        return WorkflowError(
            f"Modal: the container image could not be built ({what}){hint}{tail}"
        )
    if isinstance(exc, modal.exception.AuthError):
        if oauth_in_use():
            given = (
                "the OAuth credentials (MODAL_OAUTH_*) are wrong, revoked or "
                "expired; renew them with your identity provider"
            )
        else:
            given = (
                "the token is wrong, revoked or expired; run `modal token new` (or "
                "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET)"
            )
        return WorkflowError(f"Modal refused the credentials ({what}): {given}{tail}")
    if isinstance(exc, modal.exception.ModuleNotMountable):
        return WorkflowError(
            f"--modal-local-packages: a package cannot be copied into the image "
            f"({what}); name importable packages of Python source files{tail}"
        )
    if isinstance(exc, modal.exception.InvalidError) and "gpu" in text.lower():
        named = f" (this run asks for {', '.join(map(str, gpus))})" if gpus else ""
        return WorkflowError(
            f"Modal rejected the GPU request{named} ({what}): check --modal-gpu and "
            f"the jobs' modal_gpu or gpu_model resources{tail}"
        )
    if isinstance(exc, modal.exception.InvalidError) and "python" in text.lower():
        return WorkflowError(
            f"Modal's image builder does not offer this Python ({what}); run "
            f"Snakemake from a Python it supports{tail}"
        )
    if isinstance(exc, transport_errors()):
        return WorkflowError(
            f"Modal could not be reached to {doing} ({what}); check the "
            f"network and start the run again{tail}"
        )
    return WorkflowError(f"Modal: the run's app could not start ({what}){tail}")
