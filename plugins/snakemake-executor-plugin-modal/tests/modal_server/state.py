"""
What the local Modal server holds, for the tests to read directly: environments, apps,
volumes and every RPC it was sent.

The server's event loop runs in its own thread and is the only writer; a test reads
between the client's calls (or after its process ended), under :attr:`ServerState.lock`
where it needs a consistent view of several records.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import Message
from modal_proto import api_pb2

from .faults import CommitFault, Faults

__all__ = [
    "AppRecord",
    "CallRecord",
    "CommitFault",
    "ContainerRecord",
    "FunctionCallRecord",
    "Faults",
    "FunctionRecord",
    "ServerState",
    "VolumeRecord",
    "new_id",
]


def new_id(prefix: str) -> str:
    """
    A new object id in Modal's form, ``<prefix>-<random>`` (``ap-``, ``vo-``, ``en-``,
    ``bl-``): the client checks ids by their prefix (modal 1.6.4, modal/_object.py,
    ``_Object._is_id_type``; e.g. ``_Volume(type_prefixes=("vo",))`` in
    modal/volume.py).
    """
    return f"{prefix}-{secrets.token_hex(11)}"


@dataclass
class CallRecord:
    """
    One RPC the server received.

    Attributes
    ----------
    method : str
        The RPC's name, such as ``"AppHeartbeat"``.
    at : float
        When it arrived, in seconds since the epoch (``time.time()``).
    metadata : dict
        Its request metadata (the client's ``x-modal-*`` headers, token secret left
        out).
    requests : list of protobuf messages
        The request messages it carried (one for a unary RPC).
    status : str
        ``"OK"``, or the name of the gRPC status it was answered with
        (``"UNIMPLEMENTED"``, ``"NOT_FOUND"``...); ``""`` while it runs.
    """

    method: str
    at: float
    metadata: dict[str, str]
    requests: list[Message] = field(default_factory=list)
    status: str = ""


@dataclass
class AppRecord:
    """
    One app (``AppCreate``).

    Attributes
    ----------
    app_id : str
        ``ap-...``.
    description : str
        The name the client gave (``modal.App(name)``) or its script's file name.
    environment : str
        The environment's name.
    state : int
        An ``api_pb2.AppState`` value (``APP_STATE_EPHEMERAL``,
        ``APP_STATE_STOPPED``...).
    created_at : float
        Seconds since the epoch.
    heartbeats : list of float
        When each ``AppHeartbeat`` arrived, in seconds since the epoch.
    published : int
        How many ``AppPublish`` requests it got.
    function_ids : dict
        Tag -> function id, from the last ``AppPublish``.
    disconnect_reason : int or None
        The ``api_pb2.AppDisconnectReason`` of ``AppClientDisconnect``, if one came.
    disconnect_exception : str
        The exception text the client sent with it (``""`` for a clean exit).
    stopped_at : float or None
        When it was stopped (disconnect of an ephemeral app, ``AppStop``, or its
        heartbeats stopping).
    stop_reason : str
        Why it was stopped: ``"disconnect"``, ``"stop"`` or ``"heartbeat timeout"``
        (``""`` while it runs).
    """

    app_id: str
    description: str
    environment: str
    state: int
    created_at: float
    heartbeats: list[float] = field(default_factory=list)
    published: int = 0
    function_ids: dict[str, str] = field(default_factory=dict)
    disconnect_reason: int | None = None
    disconnect_exception: str = ""
    stopped_at: float | None = None
    stop_reason: str = ""

    @property
    def state_name(self) -> str:
        """The state's enum name, such as ``"APP_STATE_STOPPED"``."""
        return api_pb2.AppState.Name(self.state)


@dataclass
class VolumeRecord:
    """
    One named volume, kept as a folder of plain files (:attr:`folder`).

    Attributes
    ----------
    volume_id : str
        ``vo-...``.
    name : str
        Its name in its environment.
    environment : str
        The environment's name.
    version : int
        ``api_pb2.VOLUME_FS_VERSION_V1`` or ``_V2``: which upload, listing and
        removal RPCs the client uses for it (modal 1.6.4, modal/volume.py,
        ``_Volume._is_v1``).
    folder : pathlib.Path
        Where its files are.
    created_at : float
        Seconds since the epoch.
    commits, reloads : int
        How many ``VolumeCommit`` and ``VolumeReload`` requests it got.
    """

    volume_id: str
    name: str
    environment: str
    version: int
    folder: Path
    created_at: float
    commits: int = 0
    reloads: int = 0


@dataclass
class FunctionRecord:
    """
    One function of an app (``FunctionPrecreate``/``FunctionCreate``), or a variant of
    one made by ``with_options`` (``FunctionBindParams``).

    Attributes
    ----------
    function_id : str
        ``fu-...``.
    app_id : str
        The app it belongs to.
    name : str
        Its name (``function_name``; the tag in the app).
    definitions : list of api_pb2.Function
        What ``FunctionCreate`` carried: one definition, or one per GPU of a fallback
        list, in rank order (``FunctionData.ranked_functions``; modal/_functions.py).
        Empty until ``FunctionCreate`` (after ``FunctionPrecreate`` only).
    create_request : api_pb2.FunctionCreateRequest or None
        The ``FunctionCreate`` request as received.
    base_function_id : str
        For a variant: the function it was bound from (``""`` otherwise).
    options : api_pb2.FunctionOptions or None
        For a variant: the options ``FunctionBindParams`` carried.
    """

    function_id: str
    app_id: str
    name: str
    definitions: list = field(default_factory=list)
    create_request: Message | None = None
    base_function_id: str = ""
    options: Message | None = None

    @property
    def definition(self):
        """The first-ranked definition (``api_pb2.Function``)."""
        return self.definitions[0]

    @property
    def timeout_secs(self) -> int:
        """The execution timeout its containers run under, seconds."""
        return self.definition.timeout_secs

    @property
    def startup_timeout_secs(self) -> int:
        """The start-up timeout its containers run under, seconds."""
        return self.definition.startup_timeout_secs

    @property
    def gpus(self) -> list[str]:
        """
        Its GPU request per rank, as ``"<type>:<count>"`` (``""`` for none): one item,
        or one per GPU of a fallback list.
        """
        return [
            f"{d.resources.gpu_config.gpu_type}:{d.resources.gpu_config.count}"
            if d.resources.gpu_config.count
            else ""
            for d in self.definitions
        ]


@dataclass
class FunctionCallRecord:
    """
    One function call with its one input (``spawn``, ``remote``: ``FunctionMap``).

    Attributes
    ----------
    function_call_id : str
        ``fc-...``.
    function_id : str
        The function (or variant) called.
    input_id : str
        ``in-...``: its input.
    function_input : api_pb2.FunctionInput
        The serialized arguments, as sent (passed to the container unchanged).
    invocation_type : int
        ``api_pb2.FunctionCallInvocationType`` (``ASYNC`` for ``spawn``).
    created_at : float
        Seconds since the epoch.
    output : api_pb2.FunctionGetOutputsItem or None
        Its output, once the container sent it or the server ended the input
        (timeout, cancel, app stopped, container lost).
    cancelled : bool
        Whether ``FunctionCallCancel`` was received for it.
    task_ids : list of str
        The containers that ran (or run) it.
    queued_until : float or None
        While it waits for a GPU (the server's ``gpu_queue_delay_s``): when its
        container is to start, in seconds since the epoch.
    """

    function_call_id: str
    function_id: str
    input_id: str
    function_input: Message
    invocation_type: int
    created_at: float
    output: Message | None = None
    cancelled: bool = False
    task_ids: list[str] = field(default_factory=list)
    queued_until: float | None = None

    @property
    def status_name(self) -> str:
        """Its output's ``GenericResult`` status name, or ``""`` while unfinished."""
        if self.output is None:
            return ""
        return api_pb2.GenericResult.GenericStatus.Name(self.output.result.status)


@dataclass
class ContainerRecord:
    """
    One container: a local process running Modal's container entrypoint for one input.

    Attributes
    ----------
    task_id : str
        ``ta-...``.
    function_id, app_id, function_call_id, input_id : str
        What it runs; ``function_call_id`` and ``input_id`` are ``""`` while a
        container started ahead (``Faults.containers_ahead``) waits for an input.
    folder : pathlib.Path
        Its folder: the container arguments, its working directory (``root/``), its
        output (``stdout.log``, ``stderr.log``).
    process : subprocess.Popen
        The process (a session leader: ended with its whole process group).
    secret : str
        The token it authenticates with (``x-modal-task-secret``).
    started_at : float
        When it was started, seconds since the epoch: billing starts here.
    asked_at : float or None
        When it first asked for an input (``FunctionGetInputs``): its start-up ends
        here (a container started ahead may wait there for one).
    input_at : float or None
        When it received its input (``FunctionGetInputs``): its timeout counts from
        here.
    ended_at : float or None
        When its process was seen gone.
    end_reason : str
        ``"exited"``, ``"timeout"``, ``"startup timeout"``, ``"cancelled"``, ``"app
        stopped"``, ``"stopped"`` (``ContainerStop``), ``"preempted"``, a loss
        (``"oom killed"``, ``"entrypoint killed"``, ``"worker lost"``:
        ``Faults.loss``) or ``""`` while it runs.
    returncode : int or None
        The process's exit status (negative: the signal that ended it).
    heartbeats : list of float
        When each ``ContainerHeartbeat`` arrived.
    cancel_input_ids : list of str
        Inputs to cancel at its next heartbeat (a cancel without
        ``terminate_containers``).
    views : dict
        Volume id -> its :class:`~.views.VolumeView` (the container's copy, its
        commits and reloads); empty where volumes are linked, not viewed.
    background_commit_at : float or None
        When the server last committed its views in the background.
    preempted_at : float or None
        When the server interrupted it to preempt it (``Faults.preemption``): it is
        killed ``grace_s`` later if still running, and its input restarted in a new
        container once it is gone.
    """

    task_id: str
    function_id: str
    app_id: str
    function_call_id: str
    input_id: str
    folder: Path
    process: subprocess.Popen
    secret: str
    started_at: float
    asked_at: float | None = None
    input_at: float | None = None
    ended_at: float | None = None
    end_reason: str = ""
    returncode: int | None = None
    heartbeats: list[float] = field(default_factory=list)
    cancel_input_ids: list[str] = field(default_factory=list)
    views: dict = field(default_factory=dict)
    background_commit_at: float | None = None
    preempted_at: float | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def running(self) -> bool:
        """Whether its process has not been seen gone yet."""
        return self.ended_at is None

    def billed_s(self, now: float | None = None) -> float:
        """Seconds billed so far: from its start to its end (or ``now``)."""
        end = self.ended_at if self.ended_at is not None else (now or time.time())
        return end - self.started_at


@dataclass
class ServerState:
    """
    Everything the server holds; the tests read it directly.

    Attributes
    ----------
    root : pathlib.Path
        The server's folder: ``volumes/`` (one folder per volume), ``content/``
        (uploaded files by SHA-256), ``blocks/`` (volume blocks by SHA-256),
        ``blobs/`` (blobs by id).
    token_id, token_secret : str
        The credentials the server accepts (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``
        of the client).
    oauth : dict
        The OAuth credentials it accepts instead of the token, by the client's
        setting (``MODAL_OAUTH_REFRESH_TOKEN``, ``MODAL_OAUTH_CLIENT_ID``,
        ``MODAL_OAUTH_CLIENT_SECRET``: modal/config.py).
    environments : dict
        Environment name -> environment id; ``"main"`` exists from the start.
    apps : dict
        App id -> :class:`AppRecord`.
    volumes : dict
        ``(environment, name)`` -> :class:`VolumeRecord`.
    calls : list of CallRecord
        Every RPC received, in order of arrival.
    images : dict
        Image id -> ``api_pb2.Image`` (the layer's definition, as received).
    mounts : dict
        Mount id -> ``api_pb2.MountGetOrCreateRequest`` (its files, by SHA-256).
    secrets : dict
        Secret id -> its environment variables (``Secret.from_dict``).
    functions : dict
        Function id -> :class:`FunctionRecord` (variants included).
    function_calls : dict
        Function call id -> :class:`FunctionCallRecord`.
    containers : dict
        Task id -> :class:`ContainerRecord`.
    app_heartbeat_timeout_s : float
        An ephemeral app whose last heartbeat (or creation) is older than this is
        stopped and its containers killed (see :mod:`.containers`).
    gpu_queue_delay_s : float
        Seconds a call of a function with a GPU waits before its container starts
        (not billed).
    background_commit_s : float or None
        Seconds between the server's background commits of a running container's
        volumes (None: none; see :mod:`.views`).
    faults : Faults
        The faults the server injects (:mod:`.faults`; none by default).
    volume_views : bool
        Whether containers get their own view of a volume (a mount namespace each);
        False once a container had to be given a link to the volume's folder.
    lock : threading.Lock
        Held by the server while it changes a record.
    """

    root: Path
    token_id: str
    token_secret: str
    oauth: dict[str, str] = field(
        default_factory=lambda: {
            "MODAL_OAUTH_REFRESH_TOKEN": "rt-local-test",
            "MODAL_OAUTH_CLIENT_ID": "oc-local-test",
            "MODAL_OAUTH_CLIENT_SECRET": "os-local-test",
        }
    )
    environments: dict[str, str] = field(default_factory=dict)
    apps: dict[str, AppRecord] = field(default_factory=dict)
    volumes: dict[tuple[str, str], VolumeRecord] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)
    images: dict[str, Message] = field(default_factory=dict)
    mounts: dict[str, Message] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    functions: dict[str, FunctionRecord] = field(default_factory=dict)
    function_calls: dict[str, FunctionCallRecord] = field(default_factory=dict)
    containers: dict[str, ContainerRecord] = field(default_factory=dict)
    app_heartbeat_timeout_s: float = 60.0
    gpu_queue_delay_s: float = 0.0
    background_commit_s: float | None = None
    faults: Faults = field(default_factory=Faults)
    volume_views: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def methods(self) -> list[str]:
        """The names of the RPCs received, in order of arrival."""
        with self.lock:
            return [c.method for c in self.calls]

    def calls_of(self, method: str) -> list[CallRecord]:
        """The received calls of one RPC, in order of arrival."""
        with self.lock:
            return [c for c in self.calls if c.method == method]

    def volume(self, name: str, environment: str = "main") -> VolumeRecord:
        """
        The volume named ``name``.

        Raises
        ------
        KeyError
            If no such volume was created.
        """
        with self.lock:
            return self.volumes[(environment, name)]

    def volume_by_id(self, volume_id: str) -> VolumeRecord | None:
        """The volume with id ``volume_id``, or None."""
        with self.lock:
            for v in self.volumes.values():
                if v.volume_id == volume_id:
                    return v
        return None

    def function(self, name: str, app_id: str | None = None) -> FunctionRecord:
        """
        The function named ``name`` (the last created, or that of ``app_id``); not a
        variant.

        Raises
        ------
        KeyError
            If no such function was created.
        """
        with self.lock:
            found = [
                f
                for f in self.functions.values()
                if f.name == name
                and not f.base_function_id
                and (app_id is None or f.app_id == app_id)
            ]
        if not found:
            raise KeyError(name)
        return found[-1]

    def bill(self) -> list[dict]:
        """
        What the server billed, one record per container: ``task_id``,
        ``function_call_id``, ``gpu`` (its function's first-ranked GPU,
        ``"<type>:<count>"`` or ``""``), ``start`` and ``end`` (seconds since the
        epoch; ``end`` None while it runs) and ``seconds`` (from its start to its end
        or now: Modal bills a container from its start, docs "Pricing").
        """
        now = self.now()
        with self.lock:
            containers = list(self.containers.values())
            gpus = {f.function_id: (f.gpus or [""])[0] for f in self.functions.values()}
        return [
            {
                "task_id": c.task_id,
                "function_call_id": c.function_call_id,
                "gpu": gpus.get(c.function_id, ""),
                "start": c.started_at,
                "end": c.ended_at,
                "seconds": c.billed_s(now),
            }
            for c in containers
        ]

    def running_containers(self) -> list[ContainerRecord]:
        """The containers whose process has not been seen gone."""
        with self.lock:
            return [c for c in self.containers.values() if c.running]

    @staticmethod
    def now() -> float:
        """The server's clock, in seconds since the epoch."""
        return time.time()
