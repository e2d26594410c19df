"""
Faults the local Modal server injects on request, all held by one :class:`Faults`
object (``ServerState.faults``): given to ``serve(root, faults=Faults(...))`` or
changed on the running server (``server.faults.fail_rpc(...)``, ``server.faults.build
= BuildFault(...)``...). Each fault names the modal 1.6.4 client code that meets it,
so that a test asserts what the real client does with it, not what a fake says.

- :class:`RpcFault`: the next calls of one RPC answer a gRPC status instead of being
  served: transport errors (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``: retried by the
  client itself, 3 retries by default, ``Retry`` and ``_retry_transient_errors`` in
  modal/_utils/grpc_utils.py, then raised as ``ServiceError``), a revoked token
  (``UNAUTHENTICATED``: ``AuthError`` at once), a rate limit (``RESOURCE_EXHAUSTED``:
  ``ResourceExhaustedError`` at once), lost cancels (``FunctionCallCancel``), a batch
  upload failing at its end (``VolumePutFiles``). The status -> exception table is
  ``_STATUS_TO_EXCEPTION`` (modal/_grpc_client.py).
- :class:`HttpFault`: the next requests to the server's upload/download URLs answer
  an HTTP error (a blob's PUT: ``_upload_to_s3_url``, modal/_utils/blob_utils.py,
  tries 3 times, then raises ``ExecutionError``).
- :class:`CommitFault`: containers' ``VolumeCommit`` fails (modal/volume.py,
  ``_Volume.commit``; the exit commit, ``TaskLifecycleManager.volume_commit``).
- :class:`BuildFault`: image builds fail (``ImageJoinStreaming`` answers a failed
  result after streaming a build log line: ``_image_await_build_result`` prints the
  line under ``enable_output``, ``_Image._load`` raises ``ImageBuildError``,
  modal/_image.py).
- :class:`Preemption`: a running input's container is interrupted and its input
  restarted in a new container ("Modal will gracefully terminate the Function and
  restart it on the same input", Modal's docs, guide "Preemption").
- :class:`ContainerLoss`: a running input's container is lost the ways Modal loses
  one (the kernel's OOM killer, its entrypoint killed, its worker lost), its input
  ended with the result Modal's server gives each (``GenericResult`` statuses,
  modal_proto/api.proto), which the client raises (``_process_result``,
  modal/_utils/function_utils.py).
- :class:`Unanswered`: calls whose output the server never gives (``FunctionGetOutputs``
  answers "unfinished" whatever happened to their input).
- ``start_delay_s``: each container waits this long, started and billed, before
  Modal's entrypoint runs (and asks for its input).
- ``containers_ahead``: each function keeps one container started ahead of its next
  input, its view of the volumes made then (:mod:`.containers`).

The server thread changes the counters (``seen``, ``failed``) under
``ServerState.lock``; a test reads them after the client's calls.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

__all__ = [
    "CLIENT",
    "CONTAINER",
    "BuildFault",
    "CommitFault",
    "ContainerLoss",
    "Faults",
    "HttpFault",
    "Preemption",
    "RpcFault",
    "Unanswered",
]

#: Who sent a call, for :attr:`RpcFault.caller`: a client outside the containers
#: (``CLIENT_TYPE_CLIENT``) or a container's client (``CLIENT_TYPE_CONTAINER``).
CLIENT, CONTAINER = "client", "container"


def _counts(times: int | None, after: int, seen: int, failed: int) -> bool:
    """Whether the ``seen``-th matching request fails: past ``after``, while fewer
    than ``times`` failed (``times`` None: every one)."""
    return seen > after and (times is None or failed < times)


@dataclass
class RpcFault:
    """
    Calls of one RPC answered with a gRPC status instead of being served (nothing
    done: the request is recorded with that status).

    Attributes
    ----------
    method : str
        The RPC's name, such as ``"FunctionGetOutputs"``.
    status : str
        The gRPC status, by name (``grpclib.Status``): ``"UNAVAILABLE"``,
        ``"DEADLINE_EXCEEDED"``, ``"UNAUTHENTICATED"``, ``"RESOURCE_EXHAUSTED"``...
    times : int or None
        How many calls fail (None: every one). The client retries ``UNAVAILABLE``,
        ``DEADLINE_EXCEEDED``, ``CANCELLED``, ``INTERNAL`` and ``UNKNOWN``
        (``RETRYABLE_GRPC_STATUS_CODES``, modal/_utils/grpc_utils.py) up to
        ``Retry.max_retries`` times, 3 by default: one failure that reaches the
        caller of ``FunctionCall.get``, ``spawn`` or ``cancel`` takes 4 here.
    after : int
        Matching calls served before the first failure.
    caller : str
        :data:`CLIENT` (default), :data:`CONTAINER`, or ``""`` for both.
    message : str
        The status's message (the client's exception text); ``""`` gives
        ``"<method>: <status> (fault injected by the test)"``.
    seen, failed : int
        Matching calls so far, and those failed.
    """

    method: str
    status: str = "UNAVAILABLE"
    times: int | None = 1
    after: int = 0
    caller: str = CLIENT
    message: str = ""
    seen: int = 0
    failed: int = 0

    def fails(self, method: str, caller: str) -> bool:
        """Count one call of ``method`` from ``caller``; whether it fails."""
        if method != self.method or (self.caller and caller != self.caller):
            return False
        return _count(self)

    @property
    def text(self) -> str:
        """The status message sent."""
        return self.message or (
            f"{self.method}: {self.status} (fault injected by the test)"
        )


def _count(fault) -> bool:
    """One more matching request of `fault` (an `RpcFault` or `HttpFault`): whether
    it fails (its ``times`` and ``after``), counted in ``seen`` and ``failed``."""
    fault.seen += 1
    if not _counts(fault.times, fault.after, fault.seen, fault.failed):
        return False
    fault.failed += 1
    return True


@dataclass
class HttpFault:
    """
    Requests to the server's HTTP URLs (:mod:`.blobs`) answered with an error status,
    nothing stored or read.

    Attributes
    ----------
    method : str
        ``"PUT"`` or ``"GET"``.
    prefix : str
        The path's start: ``"/blobs/"`` (``BlobCreate`` uploads, ``BlobGet``
        downloads) or ``"/blocks/"`` (v2 volume blocks, ``read_file`` pieces).
    status : int
        The HTTP status answered (500 by default; 503 makes the client wait a second
        more before its next try, ``_upload_to_s3_url``).
    times : int or None
        How many requests fail (None: every one). ``_upload_to_s3_url`` tries 3
        times (``@retry(n_attempts=3)``, modal/_utils/blob_utils.py), then raises
        ``ExecutionError("Put to url ... failed with status ...")``.
    after : int
        Matching requests served before the first failure.
    seen, failed : int
        Matching requests so far, and those failed.
    """

    method: str = "PUT"
    prefix: str = "/blobs/"
    status: int = 500
    times: int | None = 3
    after: int = 0
    seen: int = 0
    failed: int = 0

    def fails(self, method: str, path: str) -> bool:
        """Count one request; whether it fails."""
        if method != self.method or not path.startswith(self.prefix):
            return False
        return _count(self)


@dataclass
class CommitFault:
    """
    Commits of volumes from containers that fail.

    Attributes
    ----------
    mode : str
        ``"once"`` (one commit fails, later ones work) or ``"always"``.
    status : str
        The gRPC status of the failure, by name. The client retries
        ``UNAVAILABLE``, ``INTERNAL``, ``DEADLINE_EXCEEDED``, ``CANCELLED`` and
        ``UNKNOWN`` (modal/_utils/grpc_utils.py, ``RETRYABLE_GRPC_STATUS_CODES``;
        ``_Volume.commit`` up to 90 times, the exit commit 9 times:
        ``TaskLifecycleManager.volume_commit``), so "once" with one of those is
        never seen by the function; the default, ``FAILED_PRECONDITION``, is
        ``ConflictError``, which ``_Volume.commit`` raises as ``RuntimeError``
        (modal/volume.py; modal/_grpc_client.py, ``_STATUS_TO_EXCEPTION``). The exit
        commit logs a failure and does not raise (``volume_commit``,
        modal/_runtime/task_lifecycle_manager.py).
    after : int
        Commits that go through before the first failure.
    volume : str
        The volume's name (``""``: every volume).
    seen, failed : int
        Commits counted so far, and those failed.
    """

    mode: str = "once"
    status: str = "FAILED_PRECONDITION"
    after: int = 0
    volume: str = ""
    seen: int = 0
    failed: int = 0

    def fails(self, volume_name: str) -> bool:
        """Count one commit of ``volume_name``; whether it fails."""
        if self.volume and volume_name != self.volume:
            return False
        self.seen += 1
        if self.seen <= self.after or (self.mode == "once" and self.failed):
            return False
        self.failed += 1
        return True


@dataclass
class BuildFault:
    """
    Image builds that fail: ``ImageJoinStreaming`` streams :attr:`log` as the
    build's output (``TaskLogs`` on stderr: printed by the client under
    ``modal.enable_output()``, ``_image_await_build_result``, modal/_image.py), then
    a ``GENERIC_STATUS_FAILURE`` result; ``_Image._load`` raises ``ImageBuildError``
    with the image's id: "Image build for im-... failed with the exception:\\n
    <exception>" or, without one, "Image build for im-... failed.\\nView the build
    logs:\\n  modal image logs im-...". A failed layer is not cached: its next
    request builds again.

    Attributes
    ----------
    log : str
        The build's output line(s), such as ``"ERROR: No matching distribution for
        torch"``.
    exception : str
        The result's ``exception`` (``""``: none, as for a failed build step).
    times : int or None
        How many layer builds fail (None: every one).
    failed : int
        Layer builds failed so far.
    """

    log: str = ""
    exception: str = ""
    times: int | None = None
    failed: int = 0

    def fails(self) -> bool:
        """Count one layer build; whether it fails."""
        if not _counts(self.times, 0, 1, self.failed):
            return False
        self.failed += 1
        return True


@dataclass
class Preemption:
    """
    Preemption of a running input's container, once given files of a volume are
    committed (or a time has passed): the server sends it ``SIGINT`` (Modal "will
    send an interrupt signal to your container", docs, guide "Preemption";
    ``modal.exception.simulate_preemption`` raises the same ``KeyboardInterrupt``),
    then ``SIGKILL`` to its process group :attr:`grace_s` later (that helper's
    docstring: a second interrupt after 30 s "simulates SIGKILL"). The container's
    client then sends no output ("Send no task result in case we get sigint:ed by
    the runner. The status of the input should have been handled externally",
    ``handle_task_lifecycle_exception``, modal/_runtime/task_lifecycle_manager.py)
    but still runs its exit commit (``lifecycle_context`` step 8,
    modal/_runtime/user_code_imports.py). Once its process is gone the input is
    restarted: the same call and input in a new container, with a fresh view of the
    committed volume; whatever the preempted container sent is dropped.

    Attributes
    ----------
    volume : str
        The volume whose committed files :attr:`when` matches (``""`` with no
        patterns).
    when : tuple of str
        Glob patterns relative to the volume's root (``fnmatch``, ``*`` crossing
        ``/``): the container is preempted once each matches a committed file.
    after_s : float or None
        Or: seconds after the container received its input (with :attr:`when`:
        whichever comes first).
    grace_s : float
        Seconds between the interrupt and the kill.
    times : int
        How many containers are preempted (one per input at most).
    preempted : list of str
        The task ids preempted, in order.
    """

    volume: str = ""
    when: tuple[str, ...] = ()
    after_s: float | None = None
    grace_s: float = 30.0
    times: int = 1
    preempted: list[str] = field(default_factory=list)

    def due(self, committed: list[str], running_s: float) -> bool:
        """
        Whether a container running its input for ``running_s`` seconds is to be
        preempted, the volume holding ``committed`` (relative POSIX paths).
        """
        if len(self.preempted) >= self.times:
            return False
        if self.after_s is not None and running_s >= self.after_s:
            return True
        return bool(self.when) and all(
            any(fnmatch.fnmatch(p, pattern) for p in committed) for pattern in self.when
        )


#: How a container is lost (:class:`ContainerLoss`) -> what the server does and
#: answers: the end reason recorded, whether the container's process group is killed
#: (else only its entrypoint's process, the rest killed when that is seen gone), and
#: the input's ``GenericResult`` status, each as modal_proto/api.proto (modal 1.6.4)
#: documents it:
#:
#: - ``"oom"``: "the kernel OOM-killed a process in the task's container after it
#:   hit its own memory limit" (``GENERIC_STATUS_KERNEL_OOM_KILL``; the process
#:   killed is the container's Python, which sends nothing more);
#: - ``"entrypoint"``: "a task was killed using an external signal"
#:   (``GENERIC_STATUS_TERMINATED``): its entrypoint's process gets ``SIGKILL``;
#: - ``"worker"``: the worker is lost ("lost inputs or worker preemption" are
#:   ``GENERIC_STATUS_INTERNAL_FAILURE``, modal/_functions.py, ``run_function``;
#:   ``TASK_TERMINATION_REASON_WORKER_HEARTBEAT_TIMEOUT``, "the worker lost contact
#:   with the control plane"): every process of the container ends at once.
#:
#: The client's ``FunctionCall.get`` (``poll_function``, modal/_functions.py, which
#: retries nothing) hands the result to ``_process_result``
#: (modal/_utils/function_utils.py): ``INTERNAL_FAILURE`` raises
#: ``InternalFailure``; any other status but success and timeout, with no data,
#: raises ``RemoteError`` itself with the result's ``exception`` text, the same
#: error a stopped app's terminated inputs raise.
LOSSES = {
    "oom": ("oom killed", True, "GENERIC_STATUS_KERNEL_OOM_KILL"),
    "entrypoint": ("entrypoint killed", False, "GENERIC_STATUS_TERMINATED"),
    "worker": ("worker lost", True, "GENERIC_STATUS_INTERNAL_FAILURE"),
}


@dataclass
class ContainerLoss:
    """
    A running input's container lost (killed without its Python sending anything),
    once given files of a volume are committed or a time has passed, as
    :class:`Preemption` chooses its moment; its input ends with what Modal answers
    for that loss (:data:`LOSSES`) and is not restarted. The server's texts are its
    own: Modal's are not in the client.

    Attributes
    ----------
    how : str
        ``"oom"``, ``"entrypoint"`` or ``"worker"`` (:data:`LOSSES`).
    volume : str
        The volume whose committed files :attr:`when` matches.
    when : tuple of str
        Glob patterns relative to the volume's root (``fnmatch``): the container is
        lost once each matches a committed file.
    after_s : float or None
        Or: seconds after the container received its input.
    times : int
        How many containers are lost (the first running ones, in start order).
    lost : list of str
        The task ids lost, in order.
    """

    how: str = "oom"
    volume: str = ""
    when: tuple[str, ...] = ()
    after_s: float | None = None
    times: int = 1
    lost: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.how not in LOSSES:
            raise ValueError(f"how: one of {sorted(LOSSES)}, not {self.how!r}")

    @property
    def end_reason(self) -> str:
        """What the lost container's record says (``ContainerRecord.end_reason``)."""
        return LOSSES[self.how][0]

    @property
    def whole_group(self) -> bool:
        """Whether every process of the container is killed at once."""
        return LOSSES[self.how][1]

    @property
    def status(self) -> str:
        """The input's ``GenericResult`` status name."""
        return LOSSES[self.how][2]

    def due(self, committed: list[str], running_s: float) -> bool:
        """Whether a container running its input for ``running_s`` seconds is lost
        now, the volume holding ``committed`` (relative POSIX paths)."""
        if len(self.lost) >= self.times:
            return False
        if self.after_s is not None and running_s >= self.after_s:
            return True
        return bool(self.when) and all(
            any(fnmatch.fnmatch(p, pattern) for p in committed) for pattern in self.when
        )


@dataclass
class Unanswered:
    """
    Calls whose status never comes: for the first :attr:`times` calls made (after
    :attr:`after`), ``FunctionGetOutputs`` answers ``num_unfinished_inputs=1`` and
    no output, whatever happened to the input (its container may end, it may be
    cancelled), after waiting the request's ``timeout``. The client's
    ``FunctionCall.get`` then raises the builtin ``TimeoutError()``
    (``poll_function``, modal/_functions.py): "no output yet", for ever.

    Attributes
    ----------
    times : int
        How many calls are never answered.
    after : int
        Calls answered normally before the first one that is not.
    seen : int
        Calls made so far.
    call_ids : list of str
        The calls never answered (``fc-...``), in order.
    """

    times: int = 1
    after: int = 0
    seen: int = 0
    call_ids: list[str] = field(default_factory=list)

    def take(self, call_id: str) -> None:
        """Count one new call; it is never answered while :attr:`times` allows."""
        self.seen += 1
        if self.seen > self.after and len(self.call_ids) < self.times:
            self.call_ids.append(call_id)


@dataclass
class Faults:
    """
    Every fault the server injects (see the module's docstring); empty by default.

    Attributes
    ----------
    rpc : list of RpcFault
        Those of one RPC apply one after the other (:meth:`rpc_fault`;
        :meth:`fail_rpc` adds one).
    http : list of HttpFault
        Those of one URL kind apply one after the other (:meth:`http_fault`).
    commit : CommitFault or None
    build : BuildFault or None
    preemption : Preemption or None
    loss : ContainerLoss or None
    unanswered : Unanswered or None
    start_delay_s : float
        Seconds each container waits, billed, before Modal's entrypoint runs.
    containers_ahead : bool
        Each function keeps a container started ahead of its next input.
    """

    rpc: list[RpcFault] = field(default_factory=list)
    http: list[HttpFault] = field(default_factory=list)
    commit: CommitFault | None = None
    build: BuildFault | None = None
    preemption: Preemption | None = None
    loss: ContainerLoss | None = None
    unanswered: Unanswered | None = None
    start_delay_s: float = 0.0
    containers_ahead: bool = False

    def fail_rpc(self, method: str, status: str = "UNAVAILABLE", **kwargs) -> RpcFault:
        """
        Add an :class:`RpcFault` (``times``, ``after``, ``caller``, ``message`` as
        keywords) and return it.

        Raises
        ------
        KeyError
            For a status name that gRPC does not have.
        """
        from grpclib import Status

        Status[status]  # noqa: B018 - a typo fails here, not in the server thread
        fault = RpcFault(method, status, **kwargs)
        self.rpc.append(fault)
        return fault

    def rpc_fault(self, method: str, caller: str) -> RpcFault | None:
        """
        The fault that fails this call of ``method`` from ``caller``, if any. The
        faults of one RPC apply one after the other: the first not yet spent
        (``failed < times``) counts the call and fails it or, within its ``after``,
        lets it be served; so ``fail_rpc(m, times=3)`` then ``fail_rpc(m,
        times=4, after=1)`` fail 3 calls, serve one, fail 4.
        """
        for fault in self.rpc:
            if (
                fault.method == method
                and fault.caller in ("", caller)
                and (fault.times is None or fault.failed < fault.times)
            ):
                return fault if fault.fails(method, caller) else None
        return None

    def http_fault(self, method: str, path: str) -> HttpFault | None:
        """The fault that fails this HTTP request, if any (one after the other, as
        :meth:`rpc_fault`)."""
        for fault in self.http:
            if (
                fault.method == method
                and path.startswith(fault.prefix)
                and (fault.times is None or fault.failed < fault.times)
            ):
                return fault if fault.fails(method, path) else None
        return None
