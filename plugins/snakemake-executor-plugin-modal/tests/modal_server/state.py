"""
What the local Modal server holds, for the tests to read directly: environments, apps,
volumes and every RPC it was sent.

The server's event loop runs in its own thread and is the only writer; a test reads
between the client's calls (or after its process ended), under :attr:`ServerState.lock`
where it needs a consistent view of several records.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import Message
from modal_proto import api_pb2

__all__ = ["AppRecord", "CallRecord", "ServerState", "VolumeRecord", "new_id"]


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
        When it was stopped (disconnect of an ephemeral app, or ``AppStop``).
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
    environments : dict
        Environment name -> environment id; ``"main"`` exists from the start.
    apps : dict
        App id -> :class:`AppRecord`.
    volumes : dict
        ``(environment, name)`` -> :class:`VolumeRecord`.
    calls : list of CallRecord
        Every RPC received, in order of arrival.
    lock : threading.Lock
        Held by the server while it changes a record.
    """

    root: Path
    token_id: str
    token_secret: str
    environments: dict[str, str] = field(default_factory=dict)
    apps: dict[str, AppRecord] = field(default_factory=dict)
    volumes: dict[tuple[str, str], VolumeRecord] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)
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

    @staticmethod
    def now() -> float:
        """The server's clock, in seconds since the epoch."""
        return time.time()
