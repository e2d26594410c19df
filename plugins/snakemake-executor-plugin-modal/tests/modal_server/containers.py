"""
Containers of the local Modal server: local processes running Modal's own container
entrypoint, the RPCs they send, and the server's watch over them and over apps.

A container is ``python -m modal._container_entrypoint`` (modal 1.6.4), this
machine's Python, started for one input (one container per input, as a function
declared with ``single_use_containers=True`` is served by Modal). It reads its
``api_pb2.ContainerArguments`` from the file named by ``MODAL_CONTAINER_ARGUMENTS_PATH``
and connects as a container client (``MODAL_IS_REMOTE=1``: ``CLIENT_TYPE_CONTAINER``,
no token; modal/_container_entrypoint.py, ``__main__``; modal/client.py,
``_Client.from_env``). Modal's workers know a container by its connection; here each
container sends ``x-modal-task-id`` and ``x-modal-task-secret`` through the client's
``override_headers`` setting (``MODAL_OVERRIDE_HEADERS``, modal/config.py), which
the server checks (:mod:`.server`).

What a container sees:

- its working directory ``<folder>/root``, Modal's ``/root``: the files of its
  function's mounts under ``/root`` (``add_local_python_source``, modal/mount.py) are
  copied there, and it is first on ``PYTHONPATH``; nothing else of an image is built
  (:mod:`.objects`);
- each volume at its mount path, which must lie below the system's temporary folder
  or the server's folder: its own view of the volume (:mod:`.views`), bound there in
  the container's own mount namespace (:func:`namespace_prefix`);
- its function's secrets as environment variables (modal/secret.py).

Served to containers (modal/_runtime/container_io_manager.py): ``ContainerHello``;
``ContainerHeartbeat`` (each recorded; answers a pending cancel as
``cancel_input_event``, ``_heartbeat_handle_cancellations``); ``FunctionGetInputs``
(its one input, then a ``kill_switch`` item, ``_generate_inputs``);
``FunctionPutOutputs`` (the output the caller gets, ``_send_outputs``);
``ContainerStop`` (recorded).

The server's watch (:meth:`ContainerRpcs.watch`, every 50 ms):

- a container whose process ended is marked so; an input left without output gets a
  failure output naming the exit status;
- start-up: a container that has not asked for its input within its function's
  ``startup_timeout_secs`` of its start is killed, and the input times out
  (``GENERIC_STATUS_TIMEOUT``: the client raises ``FunctionTimeoutError``,
  modal/_utils/function_utils.py, ``_process_result``). Modal's docs (guide,
  "Timeouts") define ``startup_timeout`` as the time a container may take to start
  and ``timeout`` as an input's execution time;
- execution: a container still running its input ``timeout_secs`` after receiving
  it is killed, and the input times out the same way;
- an ephemeral app whose client stopped heartbeating is stopped and its containers
  killed: "Ephemeral Apps are stopped automatically when the calling program exits,
  or when the server detects that the client is no longer connected" (Modal's docs,
  guide, "Apps"). The client heartbeats every ``heartbeat_interval`` seconds, 15 by
  default (modal/config.py; modal/runner.py, ``_run_app``, ``heartbeat_loop``), each
  attempt allowed that interval plus 0.1 s (``HEARTBEAT_TIMEOUT``, modal/client.py).
  How long Modal's server waits is in neither the client nor the docs:
  :data:`APP_HEARTBEAT_TIMEOUT_S` (four missed heartbeats) is this server's default,
  set per server (``LocalModal(app_heartbeat_timeout_s=...)``).

Faults (:mod:`.faults`): a preempted container is interrupted (``SIGINT``), killed
after its grace period, and its input restarted in a new container once it is gone
(:class:`~.faults.Preemption`); a lost container (:class:`~.faults.ContainerLoss`:
OOM-killed, its entrypoint killed, its worker lost) is killed and its input ended
with Modal's status for that loss, not restarted (:meth:`ContainerRpcs._lose`);
``start_delay_s`` runs Modal's entrypoint that long after the container's (billed)
start; ``containers_ahead`` starts each function's container at the app's start,
ahead of its input (:meth:`ContainerRpcs._start_ahead`).

Killing a container ends its whole process group (``SIGKILL``), as a worker ending a
container ends everything in it; so does the end of its entrypoint's process.
Every container is billed from its start (:meth:`~.state.ContainerRecord.billed_s`,
:meth:`~.state.ServerState.bill`); a call of a GPU function may first wait the
server's GPU queueing delay, unbilled. The
watch also commits running containers' views in the background when the server
says so (:mod:`.views`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import empty_pb2
from grpclib import GRPCError, Status
from modal_proto import api_pb2

from .state import ContainerRecord, FunctionCallRecord, FunctionRecord, new_id
from .views import VolumeView, make_view, manifest, publish

__all__ = [
    "AHEAD_POLL_S",
    "APP_HEARTBEAT_TIMEOUT_S",
    "WATCH_INTERVAL_S",
    "ContainerRpcs",
    "namespace_prefix",
]

#: Seconds without an app heartbeat after which an ephemeral app is stopped, by
#: default: four of the client's 15 s intervals (modal/config.py,
#: ``heartbeat_interval``); Modal's own limit is not published (module docstring).
APP_HEARTBEAT_TIMEOUT_S = 60.0

#: Seconds between two looks of the server's watch.
WATCH_INTERVAL_S = 0.05

#: Seconds a container started ahead waits at ``FunctionGetInputs`` for an input
#: before an empty answer (the client then asks again).
AHEAD_POLL_S = 5.0

_S = api_pb2.GenericResult

#: Environment variables a container does not inherit from the server's process.
_NOT_INHERITED = ("MODAL_", "PYTHONPATH")


#: Run in the container's mount namespace: bind each ``<view> <mount path>`` pair,
#: then ``exec`` the command after ``--``.
_BIND_SCRIPT = (
    'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 97; shift 2; done; '
    'shift; exec "$@"'
)


@functools.cache
def namespace_prefix() -> tuple[str, ...] | None:
    """
    The command that runs a process in a mount namespace of its own (util-linux
    ``unshare``), where each container's view of a volume is bound at its mount path:
    ``unshare --mount`` as root, ``unshare --mount --map-root-user`` (a user
    namespace) otherwise; None where neither can bind a folder here (then containers
    see a volume's folder itself, through a link: no per-container view).
    """
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    options = [["--mount"], ["--mount", "--map-root-user"]]
    if os.geteuid() != 0:
        options = options[1:]
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.mkdir()
        b.mkdir()
        for opts in options:
            prefix = ("unshare", *opts, "--propagation", "private", "--")
            try:
                done = subprocess.run(
                    [*prefix, "mount", "--bind", str(a), str(b)],
                    capture_output=True,
                    timeout=10,
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0:
                return prefix
    return None


def _result(status: int, exception: str = "") -> api_pb2.GenericResult:
    return api_pb2.GenericResult(status=status, exception=exception)


class ContainerRpcs:
    """
    Mixin of the local Modal server: containers (start, watch, kill) and the RPCs they
    send (see the module's docstring).

    Needs ``self.state`` (:class:`~.state.ServerState`), ``self.store``, ``self.url``
    (the gRPC server's URL, for the containers) and ``self.container_heartbeat_s``.
    """

    # -- outputs ---------------------------------------------------------------------
    def _output_event(self, call: FunctionCallRecord) -> asyncio.Event:
        events = self.__dict__.setdefault("_output_events", {})
        return events.setdefault(call.function_call_id, asyncio.Event())

    def _set_output(
        self,
        call: FunctionCallRecord,
        result: api_pb2.GenericResult,
        data_format: int = api_pb2.DATA_FORMAT_UNSPECIFIED,
        task_id: str = "",
        input_started_at: float = 0.0,
    ) -> bool:
        """Give ``call`` its output unless it has one; returns whether it was set."""
        with self.state.lock:
            if call.output is not None:
                return False
            call.output = api_pb2.FunctionGetOutputsItem(
                result=result,
                idx=0,
                input_id=call.input_id,
                data_format=data_format,
                task_id=task_id,
                input_started_at=input_started_at,
                output_created_at=self.state.now(),
            )
        self._output_event(call).set()
        return True

    # -- starting ----------------------------------------------------------------------
    def _queue_container(self, call: FunctionCallRecord) -> None:
        """
        Start a container for ``call``'s input: at once, or for a function with a GPU
        after the server's GPU queueing delay (:attr:`~.state.ServerState.
        gpu_queue_delay_s`). Modal's docs ("GPU acceleration", "Cold start
        performance") say a GPU container may wait for a GPU; the delay is not
        billed, as billing starts with the container (Modal's docs, "Pricing": "you
        only pay for ... the time your container is running"). A call cancelled, or
        whose app stopped, while it waits starts nothing.
        """
        function = self.state.functions[call.function_id]
        if self.state.faults.containers_ahead and self._assign_ahead(call):
            return
        delay = self.state.gpu_queue_delay_s
        if delay and any(function.gpus):
            with self.state.lock:
                call.queued_until = self.state.now() + delay
            asyncio.get_running_loop().call_later(delay, self._start_queued, call)
        else:
            self._start_container(call)

    def _start_queued(self, call: FunctionCallRecord) -> None:
        function = self.state.functions[call.function_id]
        app = self.state.apps[function.app_id]
        with self.state.lock:
            call.queued_until = None
        if call.output is not None or call.cancelled:
            return
        if app.state == api_pb2.APP_STATE_STOPPED:
            self._set_output(
                call, _result(_S.GENERIC_STATUS_TERMINATED, "the app was stopped")
            )
            return
        self._start_container(call)

    def _start_container(
        self, call: FunctionCallRecord | None, function: FunctionRecord | None = None
    ) -> ContainerRecord | None:
        """
        Start a container for ``call``'s input, or (``call`` None) one of
        ``function`` started ahead of its next input (:meth:`_start_ahead`); None
        (and a failure output for the input) when one of its volumes cannot be
        mounted. With the server's ``faults.start_delay_s``, Modal's entrypoint runs
        that many seconds after the container's start (billed, not yet asking for
        its input; its start-up timeout counts).
        """
        state = self.state
        if call is not None:
            function = state.functions[call.function_id]
        definition = function.definition
        app = state.apps[function.app_id]
        task_id = new_id("ta")
        folder = state.root / "containers" / task_id
        root = folder / "root"
        root.mkdir(parents=True)
        views = {}
        try:
            for mount in definition.volume_mounts:
                view = self._mount_volume(mount, folder)
                if view is not None:
                    views[mount.volume_id] = view
        except ValueError as e:
            if call is not None:
                self._set_output(call, _result(_S.GENERIC_STATUS_FAILURE, str(e)))
            return None
        self._copy_mounts(definition, root)
        args = api_pb2.ContainerArguments(
            task_id=task_id,
            function_id=function.function_id,
            app_id=app.app_id,
            function_def=definition,
            environment_name=app.environment,
            app_layout=self._app_layout(app.app_id),
        )
        args_path = folder / "container_arguments.bin"
        args_path.write_bytes(args.SerializeToString())
        secret = new_id("tk")
        env = self._container_env(definition, root)
        env.update(
            MODAL_SERVER_URL=self.url,
            MODAL_IS_REMOTE="1",
            MODAL_TASK_ID=task_id,
            MODAL_CONTAINER_ARGUMENTS_PATH=str(args_path),
            MODAL_OVERRIDE_HEADERS=(
                f"x-modal-task-id:{task_id},x-modal-task-secret:{secret}"
            ),
            MODAL_HEARTBEAT_INTERVAL=str(self.container_heartbeat_s),
            MODAL_CONFIG_PATH=str(folder / "no-modal.toml"),
            PYTHONUNBUFFERED="1",
        )
        command = [sys.executable, "-m", "modal._container_entrypoint"]
        delay = state.faults.start_delay_s
        if delay:  # started (billed), Modal's entrypoint later, in the same process
            command = ["sh", "-c", 'sleep "$0" && exec "$@"', f"{delay:g}", *command]
        if views:
            # each view bound at its mount path in the container's own mount
            # namespace, then Modal's entrypoint in the same process (exec)
            binds = [str(a) for v in views.values() for a in (v.folder, v.mount_path)]
            prefix = [*namespace_prefix(), "sh", "-c", _BIND_SCRIPT, "sh", *binds]
            command = [*prefix, "--", *command]
        with (
            open(folder / "stdout.log", "wb") as out,
            open(folder / "stderr.log", "wb") as err,
        ):
            process = subprocess.Popen(
                command,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        container = ContainerRecord(
            task_id=task_id,
            function_id=function.function_id,
            app_id=app.app_id,
            function_call_id=call.function_call_id if call is not None else "",
            input_id=call.input_id if call is not None else "",
            folder=folder,
            process=process,
            secret=secret,
            started_at=state.now(),
            views=views,
        )
        with state.lock:
            state.containers[task_id] = container
            if call is not None:
                call.task_ids.append(task_id)
        return container

    # -- containers started ahead ------------------------------------------------------
    def _start_ahead(self, app_id: str) -> None:
        """
        Start one container ahead of its input for each function of the app (not
        its ``with_options`` variants), when the server's
        ``faults.containers_ahead`` says so. Modal may hand an input to a container
        started earlier (a warm one, kept for ``scaledown_window``; docs, guide
        "Cold start performance"), whose view of a volume is the one committed when
        it started: it sees later changes only after ``Volume.reload()``
        (``_Volume``'s docstring, modal/volume.py). Such a container is billed from
        its start and waits at ``FunctionGetInputs``.
        """
        with self.state.lock:
            functions = [
                f
                for f in self.state.functions.values()
                if f.app_id == app_id and not f.base_function_id and f.definitions
            ]
        for function in functions:
            self._start_container(None, function)

    def _assign_ahead(self, call: FunctionCallRecord) -> bool:
        """
        Give ``call``'s input to a container started ahead for its function (for a
        ``with_options`` variant: for its base, whose definition the container
        runs; timeouts are the variant's, enforced here), then start the next one
        ahead. False when none waits.
        """
        function = self.state.functions[call.function_id]
        base = function.base_function_id or function.function_id
        with self.state.lock:
            idle = [
                c
                for c in self.state.containers.values()
                if c.running and not c.function_call_id and c.function_id == base
            ]
            if not idle:
                return False
            container = idle[0]
            container.function_call_id = call.function_call_id
            container.input_id = call.input_id
            container.function_id = call.function_id
            call.task_ids.append(container.task_id)
        self._assigned_event(container).set()
        self._start_container(None, self.state.functions[base])
        return True

    def _assigned_event(self, container: ContainerRecord) -> asyncio.Event:
        events = self.__dict__.setdefault("_assigned_events", {})
        return events.setdefault(container.task_id, asyncio.Event())

    def _container_env(self, definition: api_pb2.Function, root: Path) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(root), *paths])
        no_proxy = [p for p in env.get("NO_PROXY", "").split(",") if p]
        env["NO_PROXY"] = env["no_proxy"] = ",".join([*no_proxy, "127.0.0.1"])
        with self.state.lock:
            for secret_id in definition.secret_ids:
                env.update(self.state.secrets.get(secret_id, {}))
        return env

    def _mount_volume(
        self, mount: api_pb2.VolumeMount, folder: Path
    ) -> VolumeView | None:
        """
        Give the container its view of ``mount``'s volume (:mod:`.views`): a copy of
        the volume's committed files under ``folder``, to be bound at
        ``mount.mount_path`` in the container's mount namespace (an empty folder is
        made there); or, where this machine has no mount namespaces
        (:func:`namespace_prefix`), a link from ``mount.mount_path`` to the volume's
        folder (every container then sees every change at once; None).

        Raises
        ------
        ValueError
            For an unknown volume, or a path that is taken or lies outside the system's
            temporary folder and the server's folder.
        """
        volume = self.state.volume_by_id(mount.volume_id)
        if volume is None:
            raise ValueError(f"volume {mount.volume_id} not found")
        path = Path(mount.mount_path)
        allowed = (Path(tempfile.gettempdir()).resolve(), self.state.root.resolve())
        if not any(path.parent.resolve().is_relative_to(a) for a in allowed):
            raise ValueError(
                f"volume mount path {mount.mount_path}: the local Modal server mounts "
                "volumes only below the temporary folder or its own folder"
            )
        if namespace_prefix() is None:
            self.state.volume_views = False
            if path.is_symlink() and path.resolve() == volume.folder.resolve():
                return None
            if path.exists() or path.is_symlink():
                raise ValueError(f"volume mount path {mount.mount_path} is taken")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(volume.folder.resolve(), target_is_directory=True)
            return None
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise ValueError(f"volume mount path {mount.mount_path} is taken")
        path.mkdir(parents=True, exist_ok=True)
        return make_view(
            volume.volume_id,
            volume.folder,
            folder / "volumes" / volume.volume_id,
            mount.mount_path,
        )

    def _copy_mounts(self, definition: api_pb2.Function, root: Path) -> None:
        """Copy the files of the function's mounts under ``/root`` into ``root``."""
        with self.state.lock:
            mounts = [self.state.mounts.get(m) for m in definition.mount_ids]
        for req in mounts:
            for f in req.files if req is not None else ():
                rel = Path(f.filename).relative_to("/")
                if rel.parts[:1] != ("root",):
                    continue
                target = root.joinpath(*rel.parts[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.store.content_path(f.sha256_hex), target)
                if f.mode:
                    target.chmod(f.mode & 0o777)

    def _app_layout(self, app_id: str) -> api_pb2.AppLayout:
        """The app's functions as a container resolves them (modal/running_app.py)."""
        layout = api_pb2.AppLayout()
        with self.state.lock:
            functions = [
                f
                for f in self.state.functions.values()
                if f.app_id == app_id and not f.base_function_id and f.definitions
            ]
        for f in functions:
            layout.function_ids[f.name] = f.function_id
            layout.objects.append(
                api_pb2.Object(
                    object_id=f.function_id,
                    function_handle_metadata=self._handle_metadata(f),
                )
            )
        return layout

    # -- ending ------------------------------------------------------------------------
    def _kill(self, container: ContainerRecord, reason: str) -> None:
        """End the container's process group with SIGKILL (recorded with ``reason``)."""
        with self.state.lock:
            if not container.end_reason:
                container.end_reason = reason
        try:
            os.killpg(container.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _stop_app_containers(self, app_id: str) -> None:
        """Kill the app's running containers; their inputs end as terminated."""
        for container in self.state.running_containers():
            if container.app_id != app_id:
                continue
            self._kill(container, "app stopped")
            call = self.state.function_calls.get(container.function_call_id)
            if call is None:  # started ahead, no input yet
                continue
            self._set_output(
                call,
                _result(_S.GENERIC_STATUS_TERMINATED, "the app was stopped"),
                task_id=container.task_id,
            )

    def _container_of(self, stream) -> ContainerRecord:
        task_id = stream.metadata.get("x-modal-task-id", "")
        with self.state.lock:
            container = self.state.containers.get(task_id)
        if container is None:
            raise GRPCError(Status.UNAUTHENTICATED, f"unknown container {task_id!r}")
        return container

    def _ended(
        self,
        container: ContainerRecord,
        call: FunctionCallRecord | None,
        now: float,
        returncode: int,
    ) -> None:
        """
        A container's main process is gone: what is left of its process group is
        killed (the container ends with its entrypoint); its input, left without
        output, fails, or is restarted in a new container where the server
        preempted it (:class:`~.faults.Preemption`).
        """
        try:
            os.killpg(container.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        with self.state.lock:
            container.ended_at = now
            container.returncode = returncode
            container.end_reason = container.end_reason or "exited"
        if call is None:
            return
        if container.preempted_at is not None:
            app = self.state.apps[container.app_id]
            if (
                call.output is None
                and not call.cancelled
                and app.state != api_pb2.APP_STATE_STOPPED
            ):
                self._start_container(call)
            return
        self._set_output(
            call,
            _result(
                _S.GENERIC_STATUS_FAILURE,
                f"container {container.task_id} exited with status {returncode} "
                "before sending an output",
            ),
            task_id=container.task_id,
        )

    def _committed(self, volume_name: str) -> list[str]:
        """The committed paths of a volume (relative, POSIX), [] if it is missing."""
        with self.state.lock:
            volume = next(
                (v for v in self.state.volumes.values() if v.name == volume_name), None
            )
        return [] if volume is None else list(manifest(volume.folder))

    def _preempted_calls(self, preemption) -> set[str]:
        """The calls one of whose containers was preempted."""
        with self.state.lock:
            return {
                self.state.containers[t].function_call_id for t in preemption.preempted
            }

    def _preempt(self, container: ContainerRecord, now: float) -> None:
        """
        Interrupt the container (``SIGINT`` to its entrypoint, as Modal's
        preemption; :class:`~.faults.Preemption`): it is killed ``grace_s`` later if
        still running; its input restarts once it is gone (:meth:`_ended`).
        """
        with self.state.lock:
            container.preempted_at = now
            container.end_reason = "preempted"
            self.state.faults.preemption.preempted.append(container.task_id)
        try:
            os.kill(container.process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def _lose(self, container: ContainerRecord, call: FunctionCallRecord) -> None:
        """
        Lose the container as ``faults.loss`` says (:data:`~.faults.LOSSES`): its
        input ends with that loss's status (set first: what the container would
        send is dropped), then its process group, or only its entrypoint's process,
        gets ``SIGKILL``; no exit commit runs (Modal's runs in the container's own
        Python, ``lifecycle_context`` step 8, modal/_runtime/user_code_imports.py).
        """
        loss = self.state.faults.loss
        with self.state.lock:
            loss.lost.append(container.task_id)
            container.end_reason = loss.end_reason
        self._set_output(
            call,
            _result(
                _S.GenericStatus.Value(loss.status),
                f"container {container.task_id}: {loss.end_reason} (local Modal "
                "server's fault)",
            ),
            task_id=container.task_id,
            input_started_at=container.input_at or 0.0,
        )
        try:
            if loss.whole_group:
                os.killpg(container.process.pid, signal.SIGKILL)
            else:
                os.kill(container.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def watch(self) -> None:
        """
        Watch containers and apps every :data:`WATCH_INTERVAL_S` seconds until
        cancelled (see the module's docstring).
        """
        while True:
            self.watch_once()
            await asyncio.sleep(WATCH_INTERVAL_S)

    def watch_once(self) -> None:
        """One look of the watch (see the module's docstring)."""
        state = self.state
        now = state.now()
        preemption = state.faults.preemption
        committed = None  # the preemption's volume's files, listed once per look
        for container in state.running_containers():
            call = state.function_calls.get(container.function_call_id)
            function = state.functions[container.function_id]
            returncode = container.process.poll()
            if returncode is not None:
                self._ended(container, call, now, returncode)
                continue
            if call is None:  # started ahead, waiting for an input
                continue
            if container.preempted_at is not None:
                grace = preemption.grace_s if preemption is not None else 0.0
                if now - container.preempted_at >= grace:
                    self._kill(container, "preempted")
                continue
            if preemption is not None and container.input_at is not None:
                if committed is None:
                    committed = self._committed(preemption.volume)
                if call.function_call_id not in self._preempted_calls(
                    preemption
                ) and preemption.due(committed, now - container.input_at):
                    self._preempt(container, now)
                    continue
            loss = state.faults.loss
            if loss is not None and container.input_at is not None:
                files = self._committed(loss.volume) if loss.when else []
                if loss.due(files, now - container.input_at):
                    self._lose(container, call)
                    continue
            every = state.background_commit_s
            if container.views and every and container.input_at is not None:
                last = container.background_commit_at or container.input_at
                if now - last >= every:
                    # Modal's background commits, "every few seconds while your
                    # Function executes" (docs, guide "Volumes"): no reload after
                    for view in container.views.values():
                        publish(view)
                    container.background_commit_at = now
            startup = function.startup_timeout_secs
            timeout = function.timeout_secs
            if (
                container.asked_at is None
                and startup
                and now - container.started_at > startup
            ):
                self._kill(container, "startup timeout")
                self._set_output(
                    call,
                    _result(
                        _S.GENERIC_STATUS_TIMEOUT,
                        f"container did not start within startup_timeout={startup}s",
                    ),
                    task_id=container.task_id,
                )
            elif (
                container.input_at is not None
                and timeout
                and now - container.input_at > timeout
            ):
                self._kill(container, "timeout")
                self._set_output(
                    call,
                    _result(
                        _S.GENERIC_STATUS_TIMEOUT,
                        f"input {call.input_id} did not finish within "
                        f"timeout={timeout}s",
                    ),
                    task_id=container.task_id,
                    input_started_at=container.input_at,
                )
        limit = state.app_heartbeat_timeout_s
        with state.lock:
            apps = [
                a for a in state.apps.values() if a.state == api_pb2.APP_STATE_EPHEMERAL
            ]
        for app in apps:
            last = max([app.created_at, *app.heartbeats[-1:]])
            if now - last > limit:
                with state.lock:
                    app.state = api_pb2.APP_STATE_STOPPED
                    app.stopped_at = now
                    app.stop_reason = "heartbeat timeout"
                self._stop_app_containers(app.app_id)

    # -- RPCs of containers ------------------------------------------------------------
    async def ContainerHello(self, stream) -> None:
        """Answer a container's hello (``ContainerIOManager.hello``)."""
        await stream.recv_message()
        self._container_of(stream)
        await stream.send_message(empty_pb2.Empty())

    async def ContainerHeartbeat(self, stream) -> None:
        """
        Record a container's heartbeat; answer the inputs to cancel, if any
        (``_heartbeat_handle_cancellations``: the container interrupts them and sends
        a terminated output).
        """
        await stream.recv_message()
        container = self._container_of(stream)
        with self.state.lock:
            container.heartbeats.append(self.state.now())
            cancel, container.cancel_input_ids = container.cancel_input_ids, []
        response = api_pb2.ContainerHeartbeatResponse()
        if cancel:
            response.cancel_input_event.input_ids.extend(cancel)
        await stream.send_message(response)

    async def FunctionGetInputs(self, stream) -> None:
        """
        Answer a container's one input, then a ``kill_switch`` item (the container
        returns, ``_generate_inputs``); an input cancelled meanwhile is not given.
        A container started ahead waits here up to :data:`AHEAD_POLL_S` seconds
        for an input, else gets an empty answer, after which the client asks again
        (``_generate_inputs``, modal/_runtime/container_io_manager.py: no inputs,
        no ``rate_limit_sleep_duration``: the loop goes on).
        """
        await stream.recv_message()
        container = self._container_of(stream)
        with self.state.lock:
            container.asked_at = container.asked_at or self.state.now()
        if not container.function_call_id:
            try:
                await asyncio.wait_for(
                    self._assigned_event(container).wait(), timeout=AHEAD_POLL_S
                )
            except TimeoutError:
                await stream.send_message(api_pb2.FunctionGetInputsResponse())
                return
        call = self.state.function_calls[container.function_call_id]
        with self.state.lock:
            give = container.input_at is None and not call.cancelled
            if container.input_at is None:
                container.input_at = self.state.now()
        if give:
            item = api_pb2.FunctionGetInputsItem(
                input_id=call.input_id,
                input=call.function_input,
                function_call_id=call.function_call_id,
                function_call_invocation_type=call.invocation_type,
                retry_count=0,
            )
        else:
            item = api_pb2.FunctionGetInputsItem(kill_switch=True)
        await stream.send_message(api_pb2.FunctionGetInputsResponse(inputs=[item]))

    async def FunctionPutOutputs(self, stream) -> None:
        """
        Keep a container's output for its input (the first one counts: an input the
        server ended meanwhile keeps that end).
        """
        req = await stream.recv_message()
        container = self._container_of(stream)
        call = self.state.function_calls[container.function_call_id]
        for item in req.outputs:
            # a preempted container's output is dropped: its input restarts
            if item.input_id == call.input_id and container.preempted_at is None:
                self._set_output(
                    call,
                    item.result,
                    data_format=item.data_format,
                    task_id=container.task_id,
                    input_started_at=item.input_started_at,
                )
        await stream.send_message(empty_pb2.Empty())

    async def ContainerStop(self, stream) -> None:
        """Record a container's request to stop (``stop_fetching_inputs``)."""
        await stream.recv_message()
        container = self._container_of(stream)
        with self.state.lock:
            container.end_reason = container.end_reason or "stopped"
        await stream.send_message(empty_pb2.Empty())
