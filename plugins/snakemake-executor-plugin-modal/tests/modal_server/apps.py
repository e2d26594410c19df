"""
Handshake, environment and app RPCs of the local Modal server.

Served, each with the client code it answers (modal 1.6.4):

- ``ClientHello``: ``Client.hello()`` / ``Client.verify`` (modal/client.py); the
  client does not send it by itself when it connects (``_Client._open`` only opens
  the channel), so credentials are checked on every RPC (:mod:`.server`).
- ``EnvironmentGetOrCreate``: the environment an app or image resolves
  (modal/_environments.py, ``_get_environment_cached``,
  ``_Environment._get_or_create``).
- ``AppCreate``, ``AppPublish``, ``AppHeartbeat``, ``AppClientDisconnect``: what
  ``with app.run():`` sends for an ephemeral app (modal/runner.py, ``_run_app``:
  ``_init_local_app_new``, a heartbeat every ``heartbeat_interval`` seconds,
  ``_create_all_objects`` then ``_publish_app``, and ``_status_based_disconnect`` at
  the end or on an error).
- ``AppStop``: ``App.stop()`` and ``modal app stop`` (modal/app.py, modal/cli/app.py).
- ``AppList``: ``modal app list`` (modal/cli/app.py, ``list_``), ``Environment.apps
  .list()`` (modal/_environments.py): every app of an environment with its state
  and running containers (:meth:`AppRpcs.AppList`).
- ``AppGetInfo`` (``App.info(refresh=True)``, modal/app.py; read by
  ``AppInfo._from_proto``, modal/types.py) and ``AppGetLifecycle`` (``modal app
  stop <app id>`` first, ``resolve_app_identifier``, modal/cli/app.py;
  ``modal.experimental.get_app_lifecycle``): the app's state and times
  (:meth:`AppRpcs._lifecycle`).

An ephemeral app is stopped, and its containers killed, when its client disconnects
("Terminates all running tasks for ephemeral apps", modal/runner.py, ``_disconnect``)
or stops heartbeating (:mod:`.containers`); a detached app keeps running
(``APP_STATE_DETACHED_DISCONNECTED``). ``AppStop`` stops any app and kills its
containers. Deployed apps are not served (UNIMPLEMENTED).
"""

from __future__ import annotations

from google.protobuf import empty_pb2
from grpclib import GRPCError, Status
from modal_proto import api_pb2

from .state import AppRecord, new_id
from .volumes import DEFAULT_ENVIRONMENT

__all__ = ["IMAGE_BUILDER_VERSION", "AppRpcs"]

#: The environment's image builder version: one the client supports (modal 1.6.4,
#: modal/_image.py, ``ImageBuilderVersion``); images are recorded, not built
#: (:mod:`.objects`).
IMAGE_BUILDER_VERSION = "2025.06"

#: App states an ``AppCreate`` or ``AppPublish`` may ask for here (``app.run()``
#: with or without ``detach``; a deployment starts ``APP_STATE_INITIALIZING``).
_RUN_STATES = (api_pb2.APP_STATE_EPHEMERAL, api_pb2.APP_STATE_DETACHED)


class AppRpcs:
    """
    Mixin of the local Modal server serving the handshake, environments and apps (see
    the module's docstring).

    Needs ``self.state`` (:class:`~.state.ServerState`), ``self.base_url`` (the
    HTTP server's URL, for the app page URLs it answers) and
    ``self._stop_app_containers`` (:class:`~.containers.ContainerRpcs`).
    """

    def _app(self, app_id: str) -> AppRecord:
        with self.state.lock:
            app = self.state.apps.get(app_id)
        if app is None:
            raise GRPCError(Status.NOT_FOUND, f"App {app_id} not found")
        return app

    async def ClientHello(self, stream) -> None:
        """Answer an empty hello: no server warnings (modal/client.py, ``hello``)."""
        await stream.recv_message()
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def EnvironmentGetOrCreate(self, stream) -> None:
        """
        Look an environment up by name (``""``: the default, ``main``), creating it
        with ``create_if_missing``.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a missing environment without ``create_if_missing``.
        """
        req = await stream.recv_message()
        name = req.deployment_name or DEFAULT_ENVIRONMENT
        with self.state.lock:
            env_id = self.state.environments.get(name)
            if env_id is None:
                if (
                    req.object_creation_type
                    != api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING
                ):
                    raise GRPCError(Status.NOT_FOUND, f"Environment '{name}' not found")
                env_id = self.state.environments[name] = new_id("en")
        await stream.send_message(
            api_pb2.EnvironmentGetOrCreateResponse(
                environment_id=env_id,
                metadata=api_pb2.EnvironmentMetadata(
                    name=name,
                    settings=api_pb2.EnvironmentSettings(
                        image_builder_version=IMAGE_BUILDER_VERSION
                    ),
                ),
            )
        )

    async def AppCreate(self, stream) -> None:
        """
        Create an app in the state asked (``APP_STATE_EPHEMERAL`` for ``app.run()``,
        ``APP_STATE_DETACHED`` for ``app.run(detach=True)``).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a missing environment; UNIMPLEMENTED for another state.
        """
        req = await stream.recv_message()
        if req.app_state not in _RUN_STATES:
            raise GRPCError(
                Status.UNIMPLEMENTED,
                "UNIMPLEMENTED: AppCreate in state "
                f"{api_pb2.AppState.Name(req.app_state)}",
            )
        env = req.environment_name or DEFAULT_ENVIRONMENT
        if env not in self.state.environments:
            raise GRPCError(Status.NOT_FOUND, f"Environment '{env}' not found")
        app = AppRecord(
            app_id=new_id("ap"),
            description=req.description,
            environment=env,
            state=req.app_state,
            created_at=self.state.now(),
        )
        with self.state.lock:
            self.state.apps[app.app_id] = app
        await stream.send_message(
            api_pb2.AppCreateResponse(
                app_id=app.app_id,
                app_page_url=f"{self.base_url}/apps/{app.app_id}",
                app_logs_url=f"{self.base_url}/apps/{app.app_id}/logs",
            )
        )

    async def AppPublish(self, stream) -> None:
        """
        Record an app's functions and classes and its state (``_publish_app``,
        modal/runner.py); answer ``deployed_at`` (now, seconds since the epoch).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app; UNIMPLEMENTED for a deployment (a name, or
            ``APP_STATE_DEPLOYED``).
        """
        req = await stream.recv_message()
        app = self._app(req.app_id)
        if req.name or req.app_state not in _RUN_STATES:
            raise GRPCError(
                Status.UNIMPLEMENTED,
                "UNIMPLEMENTED: AppPublish of a deployment "
                f"({api_pb2.AppState.Name(req.app_state)}, name {req.name!r})",
            )
        with self.state.lock:
            app.published += 1
            app.state = req.app_state
            app.function_ids = dict(req.function_ids)
        if self.state.faults.containers_ahead and app.published == 1:
            self._start_ahead(app.app_id)  # a container per function, no input yet
        await stream.send_message(
            api_pb2.AppPublishResponse(deployed_at=self.state.now())
        )

    async def AppHeartbeat(self, stream) -> None:
        """
        Record the time of an app's heartbeat (``_heartbeat``, modal/runner.py).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app.
        """
        req = await stream.recv_message()
        app = self._app(req.app_id)
        with self.state.lock:
            app.heartbeats.append(self.state.now())
        await stream.send_message(empty_pb2.Empty())

    async def AppClientDisconnect(self, stream) -> None:
        """
        Record the client's disconnect (reason, exception text); stop an ephemeral
        app, mark a detached one ``APP_STATE_DETACHED_DISCONNECTED``
        (``_disconnect``, modal/runner.py).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app.
        """
        req = await stream.recv_message()
        app = self._app(req.app_id)
        with self.state.lock:
            app.disconnect_reason = req.reason
            app.disconnect_exception = req.exception
            stopping = app.state not in (
                api_pb2.APP_STATE_DETACHED,
                api_pb2.APP_STATE_STOPPED,
            )
            if app.state == api_pb2.APP_STATE_DETACHED:
                app.state = api_pb2.APP_STATE_DETACHED_DISCONNECTED
            elif stopping:
                app.state = api_pb2.APP_STATE_STOPPED
                app.stopped_at = self.state.now()
                app.stop_reason = "disconnect"
        if stopping:
            self._stop_app_containers(app.app_id)
        await stream.send_message(empty_pb2.Empty())

    def _lifecycle(self, app: AppRecord) -> api_pb2.AppLifecycle:
        """
        The app's ``AppLifecycle``: its state, created and stopped at (seconds since
        the epoch; 0 while it runs: "Unset timestamps come back from the server as
        0", modal/experimental/__init__.py). ``stopped_by`` names who stopped it
        where a user did (``AppStop``), empty otherwise ("None if still running or
        finished normally", ``AppLifecycle``, modal/types.py).
        """
        with self.state.lock:
            return api_pb2.AppLifecycle(
                app_state=app.state,
                created_at=app.created_at,
                created_by="local-user",
                stopped_at=app.stopped_at or 0.0,
                stopped_by="local-user" if app.stop_reason == "stop" else "",
            )

    async def AppGetInfo(self, stream) -> None:
        """
        Answer an app's description, environment, lifecycle and functions
        (``App.info(refresh=True)``, modal/app.py).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app.
        """
        req = await stream.recv_message()
        app = self._app(req.app_id)
        info = api_pb2.AppHandleMetadata(
            description=app.description,
            app_id=app.app_id,
            environment_name=app.environment,
            lifecycle=self._lifecycle(app),
        )
        with self.state.lock:
            info.functions.update(app.function_ids)
        await stream.send_message(api_pb2.AppGetInfoResponse(info=info))

    async def AppGetLifecycle(self, stream) -> None:
        """
        Answer an app's lifecycle (``modal app stop <app id>``,
        ``resolve_app_identifier``, modal/cli/app.py).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app.
        """
        req = await stream.recv_message()
        app = self._app(req.app_id)
        await stream.send_message(
            api_pb2.AppGetLifecycleResponse(lifecycle=self._lifecycle(app))
        )

    async def AppStop(self, stream) -> None:
        """
        Stop an app (``App.stop``, modal/app.py).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app.
        """
        req = await stream.recv_message()
        app = self._app(req.app_id)
        with self.state.lock:
            if app.state != api_pb2.APP_STATE_STOPPED:
                app.state = api_pb2.APP_STATE_STOPPED
                app.stopped_at = self.state.now()
                app.stop_reason = "stop"
        self._stop_app_containers(app.app_id)
        await stream.send_message(empty_pb2.Empty())

    async def AppList(self, stream) -> None:
        """
        List the apps of an environment (``""``: the default, ``main``), as
        ``modal app list`` reads them (modal/cli/app.py, ``list_``): id,
        description (the name given to ``modal.App``), state, created and stopped
        at (seconds since the epoch; 0 while it runs), ``n_running_tasks`` (its
        containers whose process has not been seen gone) and ``name`` (empty: only
        a deployed app has one, and none is served).
        """
        req = await stream.recv_message()
        env = req.environment_name or DEFAULT_ENVIRONMENT
        with self.state.lock:
            apps = [a for a in self.state.apps.values() if a.environment == env]
            running = [c.app_id for c in self.state.containers.values() if c.running]
        items = [
            api_pb2.AppListResponse.AppListItem(
                app_id=a.app_id,
                description=a.description,
                state=a.state,
                created_at=a.created_at,
                stopped_at=a.stopped_at or 0.0,
                n_running_tasks=running.count(a.app_id),
            )
            for a in apps
        ]
        await stream.send_message(api_pb2.AppListResponse(apps=items))
