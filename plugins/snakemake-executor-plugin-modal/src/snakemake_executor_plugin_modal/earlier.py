"""
Apps of earlier runs of the same workflow that still run when a run starts.

A run killed without a goodbye (SIGKILL, a closed laptop, a lost node) leaves its
ephemeral app to Modal, which stops it, and its containers, only once it notices
that the client's heartbeats have stopped; a rerun started at once would spend its
budget beside them. Before its first submission (before its image is built), a run
lists the apps of its environment as ``modal app list`` does and finds those of
the same workflow still running (`find_earlier_apps`); by default it stops them as
``modal app stop`` does and waits until their containers are gone (`stop_apps`),
or, with ``--modal-earlier-apps count``, leaves them and holds their containers'
worst case in its budget (`EarlierHold`). One line names them either way
(`earlier_line`).

The same workflow is the same volume folder, which is the run's app name
(`run_app_name`): ``snakemake-<prefix>``, where the prefix is by default the working
directory's name and a hash of its absolute path (`staging.default_prefix`), so by
default the same working directory; ``--modal-volume-prefix`` names another folder,
and runs given the same one share their files and are the same workflow too.

The listing and the stop use the client's own RPCs, as its command line does (modal
1.6.4 offers no public call that gives an app's running containers): this module is
the only place the plugin reaches past Modal's public names, and
``tests/test_contract.py`` checks each name it uses.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from .prices import ContainerRequest

__all__ = [
    "EARLIER_APPS",
    "STOP_WAIT_S",
    "EarlierApp",
    "EarlierHold",
    "earlier_line",
    "find_earlier_apps",
    "meet_earlier_apps",
    "run_app_name",
    "stop_apps",
]

#: What a run does with the apps of earlier runs it finds (``--modal-earlier-apps``):
#: stop them before any job, or count their containers in the budget and leave them.
EARLIER_APPS = ("stop", "count")
#: The most seconds a run waits for a stopped app's containers to be gone, polling
#: the listing once a second as ``modal deploy`` polls its old containers
#: (``_stop_and_wait_for_containers``, modal/runner.py).
STOP_WAIT_S = 60.0
#: Modal's longest app name is not written in the client; the plugin's names stay
#: within the 64 characters it always used.
_NAME_MAX = 64


def run_app_name(prefix: str) -> str:
    """
    The run's app name, ``snakemake-<prefix>`` (the volume folder, see the module),
    at most 64 characters: a longer one keeps its start and ends with the first 8
    hex digits of the prefix's SHA-256, so that two long prefixes never share it.
    """
    name = f"snakemake-{prefix}"
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:8]
    return f"{name[: _NAME_MAX - 9]}-{digest}"


@dataclass(frozen=True)
class EarlierApp:
    """
    An app of an earlier run found running (`find_earlier_apps`).

    Attributes
    ----------
    app_id : str
        ``ap-...``.
    state : str
        Its ``AppState`` name (``APP_STATE_EPHEMERAL``...).
    created_at : float
        When it was created, seconds since the epoch.
    containers : int
        Its running containers (``n_running_tasks``) when listed.
    """

    app_id: str
    state: str
    created_at: float
    containers: int


def _client_rpcs():
    """
    The blocking calls that list and stop apps through the client's own stub, as
    ``modal app list`` and ``modal app stop`` do (modal/cli/app.py, ``list_`` and
    ``stop``; ``App.stop``, modal/app.py), made blocking as
    ``modal.experimental.list_deployed_apps`` is (``synchronizer.create_blocking``).
    """
    from modal._object import _get_environment_name
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client
    from modal_proto import api_pb2

    @synchronizer.create_blocking
    async def list_apps(environment_name: str = ""):
        client = await _Client.from_env()
        request = api_pb2.AppListRequest(
            environment_name=_get_environment_name(environment_name or None)
        )
        return list((await client._stub.AppList(request)).apps)

    @synchronizer.create_blocking
    async def stop_app(app_id: str) -> None:
        client = await _Client.from_env()
        request = api_pb2.AppStopRequest(
            app_id=app_id, source=api_pb2.APP_STOP_SOURCE_PYTHON_CLIENT
        )
        await client._stub.AppStop(request)

    return list_apps, stop_app, api_pb2


def find_earlier_apps(name: str) -> list[EarlierApp]:
    """
    The apps named `name` (the run's own name, `run_app_name`) that still run in
    the environment of Modal's configuration: ephemeral or detached, not stopped,
    stopping or disabled, as ``modal app list`` lists them (``AppList``; the
    ``Tasks`` column is ``n_running_tasks``). Called before the run's own app
    exists, so every one found is an earlier run's.

    Raises
    ------
    Exception
        Whatever the client raises (no network, a refused token): said by the
        caller in one line.
    """
    list_apps, _, api_pb2 = _client_rpcs()
    live = (
        api_pb2.APP_STATE_EPHEMERAL,
        api_pb2.APP_STATE_DETACHED,
        api_pb2.APP_STATE_DETACHED_DISCONNECTED,
        api_pb2.APP_STATE_INITIALIZING,
    )
    return [
        EarlierApp(
            item.app_id,
            api_pb2.AppState.Name(item.state),
            item.created_at,
            item.n_running_tasks,
        )
        for item in list_apps()
        if item.description == name and item.state in live
    ]


def stop_apps(
    apps: list[EarlierApp],
    name: str,
    wait_s: float = STOP_WAIT_S,
    poll_s: float = 1.0,
) -> list[EarlierApp]:
    """
    Stop `apps` (``AppStop``, which "terminates all of its running containers",
    ``App.stop``, modal/app.py) and wait, at most `wait_s` seconds, until the
    listing shows none of them running a container.

    Returns
    -------
    list of EarlierApp
        Those still running containers after `wait_s` (as last listed).

    Raises
    ------
    Exception
        Whatever the client raises for a stop or a listing.
    """
    list_apps, stop_app, _ = _client_rpcs()
    for app in apps:
        stop_app(app.app_id)
    ids = {app.app_id for app in apps}
    deadline = time.monotonic() + wait_s
    while True:
        left = [
            EarlierApp(item.app_id, "", item.created_at, item.n_running_tasks)
            for item in list_apps()
            if item.app_id in ids and item.n_running_tasks > 0
        ]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


class EarlierHold:
    """
    An earlier run's app left running (``--modal-earlier-apps count``), held in the
    budget beside the run's own calls: each of its containers is taken as the
    dearest container of this run's planned jobs (`request`), billed from when it
    was found for at most `bound_s` seconds (that job's timeout and start-up: Modal
    stops a container by then, if not sooner for the missing heartbeats). It reads
    as a running call to the budget's checks (`Cancellation.running_calls`):
    ``reserved_usd``, ``cost_usd``, ``usd_per_second``; the budget's stop cancels
    it by stopping its app (`cancel`).

    Parameters
    ----------
    app : EarlierApp
    request : ContainerRequest
        What one of its containers is taken to request.
    bound_s : float
        The most seconds one of its containers may still bill.
    stop : callable or None
        Stops the app (``stop(app_id)``); None: `stop_apps`' stop.
    """

    def __init__(self, app: EarlierApp, request: ContainerRequest, bound_s, stop=None):
        self.app = app
        self.request = request
        self.bound_s = float(bound_s)
        self.started = time.monotonic()
        self.ended: float | None = None
        self.cancelled = False
        #: No budget of its own: the run's (`Cancellation.budget_reached`).
        self.budget = None
        self._stop = stop

    @property
    def call_id(self) -> str:
        """The app's id, where a call's id would be named."""
        return self.app.app_id

    @property
    def seconds(self) -> float:
        """Seconds it has billed since it was found (at most `bound_s`)."""
        end = self.ended or time.monotonic()
        return min(end - self.started, self.bound_s)

    @property
    def expired(self) -> bool:
        """Whether its containers can bill no more: stopped, or past `bound_s`."""
        return self.ended is not None or self.seconds >= self.bound_s

    @property
    def usd_per_second(self) -> float:
        """USD per second of its containers (0 once expired)."""
        if self.expired:
            return 0.0
        return self.app.containers * self.request.usd_per_second

    @property
    def cost_usd(self) -> float:
        """What its containers have cost since it was found, USD."""
        return self.app.containers * self.request.usd_per_second * self.seconds

    def reserved_usd(self, startup_s: float) -> float:
        """What the budget keeps aside for it: its containers for `bound_s` (which
        holds their start-up already; `startup_s` is not added)."""
        return self.app.containers * self.request.usd_per_second * self.bound_s

    def cancel(self, attempts: int = 1) -> bool:
        """Stop its app (the budget is reached); True once Modal took it."""
        if self.cancelled:
            return True
        stop = self._stop or _client_rpcs()[1]
        for _ in range(attempts):
            try:
                stop(self.app.app_id)
            except Exception:  # noqa: BLE001 (tried again at the next check)
                continue
            self.cancelled = True
            self.ended = self.ended or time.monotonic()
            return True
        return False


def _described(apps: list[EarlierApp]) -> str:
    return "; ".join(
        f"{a.app_id} ({a.containers} container(s), started "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(a.created_at))})"
        for a in apps
    )


def earlier_line(
    apps: list[EarlierApp],
    mode: str,
    holds: list[EarlierHold] | None = None,
    left: list[EarlierApp] | None = None,
) -> str:
    """
    The one line that names the earlier runs' apps found, and what became of them.

    Parameters
    ----------
    apps : list of EarlierApp
        As found.
    mode : str
        ``"stop"`` or ``"count"`` (`EARLIER_APPS`).
    holds : list of EarlierHold
        Those held in the budget (``count``, or apps whose stop failed).
    left : list of EarlierApp
        Stopped apps whose containers had not gone within `STOP_WAIT_S`.
    """
    found = (
        f"Modal: {len(apps)} app(s) of an earlier run of this workflow (same "
        f"volume folder) still running: {_described(apps)}"
    )
    held = ""
    if holds:
        per = holds[0].request
        usd = sum(h.reserved_usd(0.0) for h in holds)
        n = sum(h.app.containers for h in holds)
        held = (
            f"; {n} container(s) held in the budget as this run's dearest job, "
            f"{per.usd_per_second:.6g} USD/s each for up to {holds[0].bound_s:g} s: "
            f"{usd:.4f} USD"
        )
    if mode == "count":
        return f"{found}; left running (--modal-earlier-apps count){held}"
    gone = "stopped before any job, their containers gone"
    if left:
        gone = (
            f"stopped before any job; {_described(left)} still had containers after "
            f"{STOP_WAIT_S:g} s"
        )
    return f"{found}; {gone}{held}"


def meet_earlier_apps(
    name: str,
    mode: str,
    dearest: tuple[ContainerRequest, float],
    say,
) -> list[EarlierHold]:
    """
    Find the earlier runs' apps still running (`find_earlier_apps`) and stop them
    (``mode`` ``"stop"``: `stop_apps`) or leave them (``"count"``), saying so in one
    line (`earlier_line`, through `say`); nothing is said where none is found.

    Parameters
    ----------
    name : str
        The run's app name (`run_app_name`).
    mode : str
        ``--modal-earlier-apps``.
    dearest : (ContainerRequest, float)
        What each of their containers is taken to request, and the most seconds it
        may still bill (``Executor.dearest_planned``).
    say : callable
        Where the line goes (the executor's logger).

    Returns
    -------
    list of EarlierHold
        The apps held in the budget: left running (``count``), or whose stop failed
        or whose containers had not gone within `STOP_WAIT_S`.
    """
    try:
        apps = find_earlier_apps(name)
    except Exception as e:  # noqa: BLE001 (said; the run goes on)
        say(
            "Modal: could not look for apps of earlier runs of this workflow still "
            f"running ({type(e).__name__}: {_first_line(e)}); any there run on "
            "beside this run, outside its budget"
        )
        return []
    if not apps:
        return []
    request, bound_s = dearest
    left: list[EarlierApp] = []
    if mode == "count":
        held = [a for a in apps if a.containers]
    else:
        try:
            left = stop_apps(apps, name)
        except Exception as e:  # noqa: BLE001 (held in the budget instead)
            say(
                f"Modal: could not stop the earlier runs' apps "
                f"({type(e).__name__}: {_first_line(e)}); they are held in the "
                "budget instead"
            )
            left, mode = apps, "count"
        held = left
    holds = [EarlierHold(a, request, bound_s) for a in held]
    say(earlier_line(apps, mode, holds, left))
    return holds


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]
