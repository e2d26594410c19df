"""
The plugin's tests run its real code and the installed ``modal`` client against a
local server of Modal's API (``modal_server/``: containers are local processes of
Modal's own entrypoint, a volume a folder each container sees through its own view),
through the ``modal_server`` fixture; faults are injected by the server
(``modal_server/faults.py``), never by a stand-in for the client.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from .helpers import bound_subprocess_run
from .modal_server import serve

# Every process a test starts ends within a bound (helpers.PROCESS_TIMEOUT_S).
bound_subprocess_run()


def reset_modal_client() -> None:
    """
    Forget what the installed ``modal`` client keeps per process across servers: the
    client made from the environment (``_Client._client_from_env``, modal/client.py:
    one per process, connected to the server it first met) and the environments
    looked up (``ENVIRONMENT_CACHE``, modal/_environments.py: ids of that server).
    """
    import modal._environments
    import modal.client

    modal.client._Client._client_from_env = None
    modal._environments.ENVIRONMENT_CACHE.clear()


@pytest.fixture
def modal_server(tmp_path, monkeypatch):
    """
    A local Modal server for the test (``modal_server.LocalModal``), the installed
    ``modal`` client of this process and of every process the test starts pointed at
    it (``MODAL_SERVER_URL``, its credentials, no other ``MODAL_*`` setting:
    ``LocalModal.client_env``; heartbeats every second), and the plugin's volume
    mount path moved below the test's folder (``SNAKEMAKE_MODAL_TEST_MOUNT``, and
    ``limits.MOUNT`` of this process's plugin): the server mounts volumes only there.
    Containers find this interpreter's ``python`` first on PATH (as an image would
    have its own); a container's cancel reaches it within a second.

    Yields
    ------
    LocalModal
        The running server (``state``: apps, volumes, function calls, containers,
        ``bill()``), with ``mount`` (pathlib.Path) the plugin's mount path.
    """
    from snakemake_executor_plugin_modal import limits

    with serve(tmp_path / "modal-server", container_heartbeat_s=1.0) as server:
        env = server.client_env(heartbeat_interval_s=1.0)
        for k in [k for k in os.environ if k.startswith("MODAL_") or k == "PYTHONPATH"]:
            monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv(
            "PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        )
        mount = tmp_path / "mnt" / "snakemake-volume"
        monkeypatch.setenv("SNAKEMAKE_MODAL_TEST_MOUNT", str(mount))
        monkeypatch.setattr(limits, "MOUNT", str(mount))  # read there at each use
        server.mount = mount
        reset_modal_client()
        try:
            yield server
        finally:
            reset_modal_client()
