"""
The local Modal server (``tests/modal_server``) driven by the real, unmodified
``modal`` client (issue 37): volumes, an ephemeral app, credentials, an RPC the
server does not serve; functions as ``FunctionCreate`` carries them, spawn, get,
cancel, timeouts, and an app whose client was killed.

The client runs in a subprocess: ``modal.client`` reads its heartbeat interval when
imported and keeps one client per process (``_Client.from_env``). The subprocess gets
no other ``MODAL_*`` setting (``LocalModal.client_env``); each script checks that
``modal`` is the installed package. The server runs in a thread of the test process,
whose state the tests read directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpclib import GRPCError, Status
from modal_proto import api_pb2

from .modal_server import (
    RPC_NAMES,
    LocalModalServer,
    UnimplementedModalServer,
    implemented_rpcs,
    serve,
)
from .modal_server.volumes import BLOCK_SIZE

MiB = 1024 * 1024

#: What the client's script starts with: the real ``modal`` and an ``out`` dict that is
#: printed as JSON on its last line.
_PRELUDE = """
import json, sys
import modal
assert "site-packages" in modal.__file__, modal.__file__
arg = json.loads(sys.argv[1])
out = {"modal_file": modal.__file__}
"""


@pytest.fixture
def local_modal(tmp_path):
    """A running local Modal server (``LocalModal``), stopped after the test."""
    with serve(tmp_path / "server") as server:
        yield server


def run_client(
    server,
    script: str,
    arg=None,
    heartbeat_interval_s: float = 15.0,
    env=(),
    full: bool = False,
):
    """
    Run ``script`` with the real ``modal`` client against ``server`` in a subprocess;
    ``arg`` reaches it as ``arg`` (through JSON), ``env`` is added to its environment.
    Returns its ``out`` dict; with ``full``, that and its whole output (stdout, then
    stderr).
    """
    code = _PRELUDE + textwrap.dedent(script) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arg)],
        env={
            **server.client_env(heartbeat_interval_s=heartbeat_interval_s),
            **dict(env),
        },
        cwd=server.state.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.fail(f"client failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "site-packages" in out["modal_file"]
    return (out, proc.stdout + proc.stderr) if full else out


def test_every_rpc_is_served_or_answers_unimplemented():
    assert not LocalModalServer.__abstractmethods__
    assert len(RPC_NAMES) > 200  # the whole API of modal 1.6.4 (285 RPCs)
    assert implemented_rpcs(UnimplementedModalServer) == frozenset()
    assert implemented_rpcs(LocalModalServer) == {
        "AppClientDisconnect",
        "AppCreate",
        "AppGetInfo",
        "AppGetLifecycle",
        "AppHeartbeat",
        "AppList",
        "AppPublish",
        "AppStop",
        "BlobCreate",
        "BlobGet",
        "ClientHello",
        "ContainerHeartbeat",
        "ContainerHello",
        "ContainerStop",
        "EnvironmentGetOrCreate",
        "FunctionBindParams",
        "FunctionCallCancel",
        "FunctionCreate",
        "FunctionGetInputs",
        "FunctionGetOutputs",
        "FunctionMap",
        "FunctionPrecreate",
        "FunctionPutInputs",
        "FunctionPutOutputs",
        "ImageGetOrCreate",
        "ImageJoinStreaming",
        "MountBatchedCheckExistence",
        "MountGetOrCreate",
        "MountPutFile",
        "SecretGetOrCreate",
        "VolumeCommit",
        "VolumeGetFile2",
        "VolumeGetOrCreate",
        "VolumeListFiles",
        "VolumeListFiles2",
        "VolumePutFiles",
        "VolumePutFiles2",
        "VolumeReload",
        "VolumeRemoveFile",
        "VolumeRemoveFile2",
    }

    class Stream:
        received = 0

        async def recv_message(self):
            self.received += 1
            return api_pb2.DictGetOrCreateRequest(deployment_name="d")

    handler, stream = LocalModalServer(None, None, "").DictGetOrCreate, Stream()
    with pytest.raises(GRPCError) as caught:
        asyncio.run(handler(stream))
    assert stream.received == 1
    assert caught.value.status == Status.UNIMPLEMENTED
    assert caught.value.message.startswith("UNIMPLEMENTED: DictGetOrCreate ")


_ROUND_TRIP = """
import io
from pathlib import Path
kw = {"version": 2} if arg["v2"] else {}
vol = modal.Volume.from_name("data", create_if_missing=True, **kw)
for _ in range(arg["batches"]):
    with vol.batch_upload(force=True) as batch:
        for remote, local in arg["files"].items():
            batch.put_file(local, remote)
        batch.put_file(io.BytesIO(b"in memory"), "/mem/bytes.txt")
out["listing"] = sorted(
    [e.path, int(e.type), e.size] for e in vol.listdir("/", recursive=True)
)
out["top"] = sorted(e.path for e in vol.listdir("/"))
back = Path(arg["back"])
for e in vol.listdir("/", recursive=True):
    if e.type == modal.volume.FileEntryType.FILE:
        target = back / e.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"".join(vol.read_file(e.path)))
"""


def _local_files(folder: Path, sizes: dict[str, bytes]) -> dict[str, str]:
    folder.mkdir()
    files = {}
    for remote, data in sizes.items():
        local = folder / remote.strip("/").replace("/", "_")
        local.write_bytes(data)
        files[remote] = str(local)
    return files


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_volume_batch_upload_listdir_read_file(local_modal, tmp_path, v2):
    """
    Files put with ``batch_upload(force=True)`` are listed recursively and read back
    byte-equal; on v1 a 5 MiB file goes through a blob, on v2 a file of two blocks
    (the first ending in zeros) through missing-block uploads; a second batch of the
    same files sends no bytes on v2 (every block known).
    """
    contents = {
        "/a/b/small.txt": b"hello volume\n",
        "/a/empty.bin": b"",
        "/top.bin": os.urandom(1000),
        # v1: at least LARGE_FILE_LIMIT (4 MiB), a blob; v2: two blocks, the
        # first one's tail zeros (left out of its hash and of its download)
        "/a/large.bin": (
            os.urandom(5 * MiB)
            if not v2
            else os.urandom(1000) + bytes(BLOCK_SIZE - 1000) + os.urandom(1000)
        ),
    }
    files = _local_files(tmp_path / "local", contents)
    arg = {"v2": v2, "files": files, "back": str(tmp_path / "back"), "batches": 2}
    out = run_client(local_modal, _ROUND_TRIP, arg)

    state = local_modal.state
    volume = state.volume("data")
    expected = {**contents, "/mem/bytes.txt": b"in memory"}
    assert out["listing"] == sorted(
        [
            *([p.strip("/"), 1, len(d)] for p, d in expected.items()),
            ["a", 2, 0],
            ["a/b", 2, 0],
            ["mem", 2, 0],
        ]
    )
    assert out["top"] == ["a", "mem", "top.bin"]
    for remote, data in expected.items():
        assert (volume.folder / remote.strip("/")).read_bytes() == data
        assert (tmp_path / "back" / remote.strip("/")).read_bytes() == data
    methods = state.methods()
    if v2:
        assert volume.version == api_pb2.VOLUME_FS_VERSION_V2
        puts = state.calls_of("VolumePutFiles2")
        # first batch: blocks missing, then put; second batch: put at once
        assert len(puts) == 3
        assert puts[0].requests[0].disallow_overwrite_existing_files is False
        assert "VolumeListFiles2" in methods and "VolumePutFiles" not in methods
        assert "BlobCreate" not in methods
        large = [f for f in puts[0].requests[0].files if f.path == "/a/large.bin"]
        assert len(large[0].blocks) == 2
    else:
        assert volume.version == api_pb2.VOLUME_FS_VERSION_V1
        assert len(state.calls_of("VolumePutFiles")) == 2
        assert len(state.calls_of("BlobCreate")) == 1  # the 5 MiB file, once
        assert "VolumeListFiles" in methods and "VolumePutFiles2" not in methods
    assert all(c.status == "OK" for c in state.calls)


_ERRORS = """
import io
def error(f):
    try:
        f()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None
missing = modal.Volume.from_name("never-made")
out["missing_volume"] = error(missing.hydrate)
vol = modal.Volume.from_name("data", create_if_missing=True)
with vol.batch_upload() as batch:
    batch.put_file(io.BytesIO(b"one"), "/d/one.txt")
    batch.put_file(io.BytesIO(b"two"), "/d/two.txt")
def overwrite():
    with vol.batch_upload() as batch:
        batch.put_file(io.BytesIO(b"new"), "/d/new.txt")
        batch.put_file(io.BytesIO(b"1"), "/d/one.txt")
out["overwrite"] = error(overwrite)
out["read_missing"] = error(lambda: b"".join(vol.read_file("d/nope.txt")))
out["list_missing"] = error(lambda: vol.listdir("nope/"))
out["remove_folder"] = error(lambda: vol.remove_file("d"))
vol.remove_file("/d/two.txt")
out["remove_missing"] = error(lambda: vol.remove_file("d/two.txt"))
out["after_remove"] = sorted(e.path for e in vol.listdir("d"))
out["one"] = b"".join(vol.read_file("/d/one.txt")).decode()
vol.commit()
vol.reload()
vol.remove_file("d", recursive=True)
out["after_rmtree"] = sorted(e.path for e in vol.listdir("/", recursive=True))
"""


def test_volume_errors_and_removal(local_modal):
    """
    What the client raises from the server's answers: a missing volume
    (``NotFoundError``), an upload onto an existing file without ``force``
    (``FileExistsError``, and none of the batch is put), a missing file read or
    removed (``FileNotFoundError``), a missing folder listed (``NotFoundError``), a
    folder removed without ``recursive`` (``InvalidError``); commit reloads.
    """
    out = run_client(local_modal, _ERRORS)

    assert out["missing_volume"][0] == "NotFoundError"
    assert "'never-made' not found" in out["missing_volume"][1]
    assert out["overwrite"] == ["FileExistsError", "/d/one.txt: file already exists"]
    assert out["read_missing"][0] == "FileNotFoundError"
    assert out["list_missing"][0] == "NotFoundError"
    assert out["remove_folder"][0] == "InvalidError"
    assert out["remove_missing"][0] == "FileNotFoundError"
    assert out["after_remove"] == ["d/one.txt"]  # new.txt was not put, two removed
    assert out["one"] == "one"  # not overwritten
    assert out["after_rmtree"] == []
    volume = local_modal.state.volume("data")
    assert (volume.commits, volume.reloads) == (1, 2)  # commit() reloads too
    assert list(volume.folder.iterdir()) == []
    assert ("never-made", "main") not in {
        (v.name, v.environment) for v in local_modal.state.volumes.values()
    }


_APP = """
import time
app = modal.App("local-test-app")
with app.run():
    out["app_id"] = app.app_id
    time.sleep(arg["seconds"])
failing = modal.App("failing-app")
try:
    with failing.run():
        out["failing_id"] = failing.app_id
        raise RuntimeError("the entrypoint failed")
except RuntimeError:
    pass
"""


def test_ephemeral_app_runs_heartbeats_and_stops(local_modal):
    """
    ``with app.run():`` creates an ephemeral app, publishes it, heartbeats while the
    block runs (every 0.1 s here) and disconnects at its end, which stops the app; an
    exception in the block is sent with the disconnect.
    """
    out = run_client(local_modal, _APP, {"seconds": 0.6}, heartbeat_interval_s=0.1)

    state = local_modal.state
    app = state.apps[out["app_id"]]
    assert app.description == "local-test-app"
    assert app.environment == "main"
    assert app.state_name == "APP_STATE_STOPPED"
    assert app.published == 1 and app.function_ids == {}
    assert len(app.heartbeats) >= 2  # at the start, then every 0.1 s
    assert app.created_at <= app.heartbeats[0] <= app.heartbeats[-1] <= app.stopped_at
    assert app.disconnect_reason == api_pb2.APP_DISCONNECT_REASON_ENTRYPOINT_COMPLETED
    assert app.disconnect_exception == ""
    create = state.calls_of("AppCreate")[0].requests[0]
    assert create.app_state == api_pb2.APP_STATE_EPHEMERAL
    assert create.description == "local-test-app"

    failing = state.apps[out["failing_id"]]
    assert failing.state_name == "APP_STATE_STOPPED"
    assert failing.disconnect_reason == api_pb2.APP_DISCONNECT_REASON_LOCAL_EXCEPTION
    assert "the entrypoint failed" in failing.disconnect_exception
    disconnects = [c for c in state.calls if c.method == "AppClientDisconnect"]
    assert [c.requests[0].app_id for c in disconnects] == [app.app_id, failing.app_id]
    hello = state.calls_of("AppCreate")[0].metadata
    assert hello["x-modal-client-type"] == str(api_pb2.CLIENT_TYPE_CLIENT)
    assert hello["x-modal-client-version"] == "1.6.4"
    assert "x-modal-token-secret" not in hello


_UNSERVED = """
try:
    modal.Dict.from_name("some-dict").hydrate()
except Exception as e:
    out["error"] = [type(e).__name__, str(e)]
"""


def test_unserved_rpc_reaches_the_client_as_unimplemented(local_modal):
    out = run_client(local_modal, _UNSERVED)

    assert out["error"] == [
        "UnimplementedError",
        "UNIMPLEMENTED: DictGetOrCreate is not served by the local Modal test server",
    ]
    calls = local_modal.state.calls_of("DictGetOrCreate")
    assert [c.status for c in calls] == ["UNIMPLEMENTED"]  # not retried
    assert calls[0].requests[0].deployment_name == "some-dict"


_HELLO = """
try:
    modal.Client.from_env().hello()
    out["hello"] = "ok"
except Exception as e:
    out["hello"] = [type(e).__name__, str(e)]
try:
    modal.Volume.from_name(arg, create_if_missing=True).hydrate()
    out["volume"] = "ok"
except Exception as e:
    out["volume"] = [type(e).__name__, str(e)]
"""


def test_credentials_are_checked_on_every_call(local_modal):
    """
    The client's token (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``) is checked on each
    RPC: ``ClientHello`` and any other; other credentials raise ``AuthError``.
    """
    state = local_modal.state
    out = run_client(local_modal, _HELLO, "data")
    assert (out["hello"], out["volume"]) == ("ok", "ok")
    assert [(c.method, c.status) for c in state.calls] == [
        ("ClientHello", "OK"),
        ("VolumeGetOrCreate", "OK"),
    ]
    env = {"MODAL_TOKEN_SECRET": "as-another-secret"}
    out = run_client(local_modal, _HELLO, "refused", env=env)
    assert out["hello"] == ["AuthError", "Token ID or secret is invalid"]
    assert out["volume"] == ["AuthError", "Token ID or secret is invalid"]
    assert [(c.method, c.status) for c in state.calls[2:]] == [
        ("ClientHello", "UNAUTHENTICATED"),
        ("VolumeGetOrCreate", "UNAUTHENTICATED"),
    ]
    assert [v.name for v in state.volumes.values()] == ["data"]


# -- functions (phase 2) ----------------------------------------------------------

_DECLARE = """
app = modal.App("declare-app")
vol = modal.Volume.from_name("data", create_if_missing=True)
image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install("snakemake==9.27.0")
    .add_local_python_source("snakemake_executor_plugin_modal")
)
options = dict(
    image=image,
    volumes={arg["mount"]: vol},
    timeout=600,
    serialized=True,
    single_use_containers=True,
    secrets=[modal.Secret.from_dict({"SNAKEMAKE_TOKEN": "t"})],
    ephemeral_disk=20480,
)
def run_job(spec):
    return spec
cpu = app.function(**options, name="run_job")(run_job)
gpu = app.function(
    **options, gpu="A100-80GB:2", startup_timeout=120, name="run_job_gpu"
)(run_job)
fallback = app.function(**options, gpu=["H100", "A100-80GB"], name="run_job_gpu1")(
    run_job
)
image.build()
with app.run():
    out["app_id"] = app.app_id
    fallback.with_options(cpu=2.0, memory=2048, timeout=30).hydrate()
    cpu.with_options(cpu=1.0, gpu="L4", timeout=40).hydrate()
"""


def test_function_create_is_recorded_as_the_plugin_declares(local_modal, tmp_path):
    """
    What ``FunctionCreate`` carries for functions declared as the plugin declares
    them (image with local source, volume, timeout, secrets, GPU, fallback list) is
    recorded: without ``startup_timeout`` the client sends the timeout as start-up
    timeout; a fallback list arrives as ranked functions, one GPU each;
    ``with_options`` (``FunctionBindParams``) carries no start-up timeout and, for a
    fallback function, resources without a GPU.
    """
    mount = str(tmp_path / "mnt")
    out = run_client(local_modal, _DECLARE, {"mount": mount})

    state = local_modal.state
    volume = state.volume("data")
    cpu = state.function("run_job", out["app_id"])
    gpu = state.function("run_job_gpu", out["app_id"])
    fallback = state.function("run_job_gpu1", out["app_id"])
    # modal/app.py passes startup_timeout or timeout (the start-up fault)
    assert (cpu.timeout_secs, cpu.startup_timeout_secs) == (600, 600)
    assert (gpu.timeout_secs, gpu.startup_timeout_secs) == (600, 120)
    assert cpu.gpus == [""] and gpu.gpus == ["A100-80GB:2"]
    assert fallback.gpus == ["H100:1", "A100-80GB:1"]
    assert len(fallback.create_request.function_data.ranked_functions) == 2
    for f in (cpu, gpu, fallback):
        for d in f.definitions:
            assert [(m.mount_path, m.volume_id) for m in d.volume_mounts] == [
                (mount, volume.volume_id)
            ]
            assert [state.secrets[s] for s in d.secret_ids] == [
                {"SNAKEMAKE_TOKEN": "t"}
            ]
            assert d.resources.ephemeral_disk_mb == 20480
            assert d.single_use_containers and d.image_id in state.images
            assert d.definition_type == api_pb2.Function.DEFINITION_TYPE_SERIALIZED
    # the local source reached the server as a mount the function carries
    mounted = {
        f.filename for m in cpu.definition.mount_ids for f in state.mounts[m].files
    }
    assert "/root/snakemake_executor_plugin_modal/calls.py" in mounted

    variants = {
        state.functions[v].base_function_id: state.functions[v]
        for v in state.functions
        if state.functions[v].base_function_id
    }
    fb = variants[fallback.function_id]
    assert fb.options.timeout_secs == 30
    assert fb.options.resources.milli_cpu == 2000
    assert fb.options.resources.gpu_config.count == 0  # the list is not sent again
    assert fb.gpus == ["H100:1", "A100-80GB:1"]  # merged: the base's ranks kept
    assert [d.timeout_secs for d in fb.definitions] == [30, 30]
    assert [d.startup_timeout_secs for d in fb.definitions] == [600, 600]
    c = variants[cpu.function_id]
    assert c.gpus == ["L4:1"] and c.definition.startup_timeout_secs == 600
    assert state.apps[out["app_id"]].function_ids == {
        "run_job": cpu.function_id,
        "run_job_gpu": gpu.function_id,
        "run_job_gpu1": fallback.function_id,
    }
    assert all(c.status == "OK" for c in state.calls)
    assert not state.containers  # nothing was called


# -- calls and containers (phase 2) ------------------------------------------------

#: A local package the functions import in their containers (through
#: ``add_local_python_source``); ``slowstart`` stalls a container's start-up.
_PACKAGES = {
    "localpkg/__init__.py": "def double(x):\n    return 2 * x\n",
    "slowstart/__init__.py": (
        "import os, time\n"
        "if os.environ.get('MODAL_IS_REMOTE') == '1':\n"
        "    time.sleep(30)\n"
        "def ready():\n"
        "    return 'ready'\n"
    ),
}

#: Functions of the call tests, declared as the plugin declares its own.
_FUNCTIONS = """
import os, time
from pathlib import Path
import localpkg, slowstart
app = modal.App("calls-app")
vol = modal.Volume.from_name("data", create_if_missing=True)
image = modal.Image.debian_slim().add_local_python_source("localpkg", "slowstart")
options = dict(
    image=image,
    volumes={arg["mount"]: vol},
    serialized=True,
    single_use_containers=True,
    secrets=[modal.Secret.from_dict({"TOKEN": "tok"})],
)
def work(x):
    import localpkg
    Path(arg["mount"], "out.txt").write_text(f"x={x}")
    return {
        "double": localpkg.double(x),
        "pid": os.getpid(),
        "token": os.environ.get("TOKEN"),
        "localpkg": localpkg.__file__,
        "cwd": os.getcwd(),
    }
def fail(x):
    raise ValueError(f"bad input {x}")
# pid files go beside the volume: a container's writes to its volume stay in its
# own view until it commits (tests/modal_server/views.py)
SIGNALS = Path(arg["mount"] + "-signals")
SIGNALS.mkdir(parents=True, exist_ok=True)
def sleeper(name):
    SIGNALS.joinpath(name).write_text(str(os.getpid()))
    time.sleep(60)
work = app.function(**options, timeout=60, name="work")(work)
fail = app.function(**options, timeout=60, name="fail")(fail)
sleeper = app.function(**options, timeout=arg.get("timeout", 60), name="sleeper")(
    sleeper
)
slow = app.function(**options, timeout=60, startup_timeout=2, name="slow")(
    slowstart.ready
)
def pid_of(name, within=20.0):
    path = SIGNALS / name
    end = time.time() + within
    while not path.exists() or not path.read_text():
        assert time.time() < end, f"no {name}"
        time.sleep(0.05)
    return int(path.read_text())
def gone_after(pid, within=5.0):
    t0 = time.time()
    while time.time() - t0 < within:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return time.time() - t0
        time.sleep(0.02)
    return None
def error(f):
    try:
        f()
    except BaseException as e:
        return [type(e).__name__, str(e)]
    return None
"""


@pytest.fixture
def packages(tmp_path):
    """The client's environment with :data:`_PACKAGES` importable."""
    root = tmp_path / "packages"
    for rel, text in _PACKAGES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return {"PYTHONPATH": str(root)}


_SPAWN = (
    _FUNCTIONS
    + """
with app.run():
    out["app_id"] = app.app_id
    running = sleeper.spawn("left.pid")
    call = work.spawn(21)
    out["poll"] = error(lambda: running.get(timeout=0))
    out["result"] = call.get(timeout=30)
    out["fail"] = error(lambda: fail.spawn(3).get(timeout=30))
    out["read"] = b"".join(vol.read_file("out.txt")).decode()
    out["left_pid"] = pid_of("left.pid")
"""
)


def test_spawn_runs_the_function_in_a_container(local_modal, tmp_path, packages):
    """
    ``spawn`` runs the function in a container (a process of Modal's container
    entrypoint): ``get`` returns its real return value, computed with the mounted
    local package, the secret's variable, and a file written to the mounted volume;
    an exception reaches ``get`` as itself; ``get(timeout=0)`` on a running call
    raises ``TimeoutError``; the app's end kills the container still running.
    """
    mount = str(tmp_path / "mnt")
    out = run_client(local_modal, _SPAWN, {"mount": mount}, env=packages)

    state = local_modal.state
    result = out["result"]
    assert result["double"] == 42 and result["token"] == "tok"
    work = state.function("work", out["app_id"])
    (container,) = [
        c for c in state.containers.values() if c.function_id == work.function_id
    ]
    assert result["pid"] == container.pid != os.getpid()
    # the package came from the mount, copied into the container's /root
    assert result["localpkg"] == str(container.folder / "root/localpkg/__init__.py")
    assert result["cwd"] == str(container.folder / "root")
    assert out["read"] == "x=21"
    assert (state.volume("data").folder / "out.txt").read_text() == "x=21"
    assert out["poll"] == ["TimeoutError", ""]
    assert out["fail"] == ["ValueError", "bad input 3"]
    assert container.end_reason == "exited" and container.returncode == 0
    assert container.input_at is not None and container.billed_s() > 0
    (left,) = [c for c in state.containers.values() if c.pid == out["left_pid"]]
    assert left.end_reason == "app stopped" and left.returncode == -9
    assert state.function_calls[left.function_call_id].status_name == (
        "GENERIC_STATUS_TERMINATED"
    )
    assert not state.running_containers()
    assert all(c.status == "OK" for c in state.calls), [
        (c.method, c.status) for c in state.calls if c.status != "OK"
    ]


_CANCEL = (
    _FUNCTIONS
    + """
with app.run():
    killed, interrupted = sleeper.spawn("killed.pid"), sleeper.spawn("interrupted.pid")
    pid, other = pid_of("killed.pid"), pid_of("interrupted.pid")
    killed.cancel(terminate_containers=True)
    out["killed_gone_s"] = gone_after(pid)
    out["killed_get"] = error(lambda: killed.get(timeout=5))
    interrupted.cancel()  # reaches the container at its next heartbeat
    out["interrupted_gone_s"] = gone_after(other)
    out["interrupted_get"] = error(lambda: interrupted.get(timeout=5))
    out["pids"] = [pid, other]
"""
)


def test_cancel_ends_the_container(local_modal, tmp_path, packages):
    """
    ``FunctionCall.cancel(terminate_containers=True)`` kills the container's process
    at once; a plain ``cancel()`` reaches the container at its next heartbeat, which
    interrupts the function and exits; ``get`` then raises for both.
    """
    local_modal.servicer.container_heartbeat_s = 0.2
    out = run_client(
        local_modal, _CANCEL, {"mount": str(tmp_path / "mnt")}, env=packages
    )

    state = local_modal.state
    by_pid = {c.pid: c for c in state.containers.values()}
    killed, interrupted = (by_pid[p] for p in out["pids"])
    assert out["killed_gone_s"] is not None and out["killed_gone_s"] < 1.0
    assert killed.end_reason == "cancelled" and killed.returncode == -9
    assert out["interrupted_gone_s"] is not None
    assert interrupted.end_reason == "exited" and interrupted.returncode == 0
    for c, get in ((killed, out["killed_get"]), (interrupted, out["interrupted_get"])):
        call = state.function_calls[c.function_call_id]
        assert call.cancelled and call.status_name == "GENERIC_STATUS_TERMINATED"
        assert get is not None and get[0] != "TimeoutError"
    cancels = state.calls_of("FunctionCallCancel")
    assert [c.requests[0].terminate_containers for c in cancels] == [True, False]


_TIMEOUTS = (
    _FUNCTIONS
    + """
with app.run():
    t0 = time.time()
    call = sleeper.spawn("timeout.pid")
    pid = pid_of("timeout.pid")
    out["timeout"] = error(lambda: call.get(timeout=20))
    out["timeout_s"] = time.time() - t0
    out["timeout_gone_s"] = gone_after(pid)
    t0 = time.time()
    out["startup"] = error(lambda: slow.spawn().get(timeout=20))
    out["startup_s"] = time.time() - t0
"""
)


def test_timeouts_end_the_container(local_modal, tmp_path, packages):
    """
    A call running past its function's ``timeout`` is ended, its container killed,
    and ``get`` raises ``FunctionTimeoutError``; a container not started within its
    ``startup_timeout`` (its import stalls) is killed the same way.
    """
    # 4 s, not 1: on a loaded machine a container took more than a second from
    # receiving its input to the function's first line, and was killed before it
    # wrote its pid (the full suite, 2026-12-03)
    arg = {"mount": str(tmp_path / "mnt"), "timeout": 4}
    out = run_client(local_modal, _TIMEOUTS, arg, env=packages)

    state = local_modal.state
    assert out["timeout"][0] == "FunctionTimeoutError"
    assert out["timeout_gone_s"] is not None
    assert 4.0 < out["timeout_s"] < 15.0
    assert out["startup"][0] == "FunctionTimeoutError"
    assert "startup_timeout=2" in out["startup"][1]
    assert 2.0 < out["startup_s"] < 10.0
    reasons = {
        state.functions[c.function_id].name: c for c in state.containers.values()
    }
    assert reasons["sleeper"].end_reason == "timeout"
    assert reasons["sleeper"].returncode == -9
    assert reasons["slow"].end_reason == "startup timeout"
    assert reasons["slow"].input_at is None  # killed before it asked for its input
    assert not state.running_containers()


# -- app lifetime (phase 2) ----------------------------------------------------------

_ORPHAN = (
    _FUNCTIONS
    + """
with app.run():
    call = sleeper.spawn("orphan.pid")
    pid = pid_of("orphan.pid")
    time.sleep(arg["alive_s"])  # longer than the server's limit: heartbeats keep it
    print(json.dumps({"app_id": app.app_id, "pid": pid}), flush=True)
    time.sleep(60)
"""
)


@pytest.mark.modal_server
def test_client_killed_stops_its_app_and_containers(tmp_path, packages):
    """
    An ephemeral app whose client is killed (SIGKILL: no disconnect) is stopped once
    no heartbeat came for the server's limit, and its containers are killed; while
    the client heartbeats, the app outlives that limit.
    """
    limit = 1.0
    with serve(tmp_path / "server", app_heartbeat_timeout_s=limit) as server:
        code = _PRELUDE + textwrap.dedent(_ORPHAN)
        arg = {"mount": str(tmp_path / "mnt"), "alive_s": 1.5 * limit}
        client = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(arg)],
            env={**server.client_env(heartbeat_interval_s=0.2), **packages},
            cwd=server.state.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = client.stdout.readline()
            assert line, client.stderr.read()[-4000:]
            ready = json.loads(line)
            state = server.state
            app = state.apps[ready["app_id"]]
            (container,) = state.containers.values()
            assert container.pid == ready["pid"]
            assert app.state_name == "APP_STATE_EPHEMERAL" and container.running
            assert app.created_at + limit < app.heartbeats[-1]
            client.kill()  # SIGKILL: no AppClientDisconnect
            client.wait()
            killed_at = time.time()
            while container.running and time.time() < killed_at + limit + 5:
                time.sleep(0.02)
            gone_s = time.time() - killed_at
        finally:
            client.kill()
            client.wait()
        assert not container.running, "the container outlived its client"
        assert gone_s < limit + 1.0
        assert app.state_name == "APP_STATE_STOPPED"
        assert app.stop_reason == "heartbeat timeout"
        assert app.disconnect_reason is None
        assert app.stopped_at - app.heartbeats[-1] > limit
        assert container.end_reason == "app stopped" and container.returncode == -9
        with pytest.raises(ProcessLookupError):
            os.kill(container.pid, 0)
        call = state.function_calls[container.function_call_id]
        assert call.status_name == "GENERIC_STATUS_TERMINATED"


# -- volumes as containers see them; GPU queueing; billing ---------------------------

_VIEWS = """
import os, time
from pathlib import Path
app = modal.App("views-app")
vol = modal.Volume.from_name("views", create_if_missing=True)
SIGNALS = Path(arg["mount"] + "-signals")
SIGNALS.mkdir(parents=True, exist_ok=True)
options = dict(
    image=modal.Image.debian_slim(),
    volumes={arg["mount"]: vol},
    serialized=True,
    single_use_containers=True,
    timeout=60,
)
def wait_for(name, within=30.0):
    end = time.time() + within
    while not SIGNALS.joinpath(name).exists():
        assert time.time() < end, f"no {name}"
        time.sleep(0.05)
def viewer():
    seen = {}
    SIGNALS.joinpath("started").touch()
    wait_for("uploaded")
    seed = Path(arg["mount"], "seed.txt")
    seen["before_reload"] = seed.read_text()
    vol.reload()
    seen["after_reload"] = seed.read_text()
    Path(arg["mount"], "mine.txt").write_text("mine")
    SIGNALS.joinpath("written").touch()
    wait_for("checked")
    vol.commit()
    return seen
faulty = modal.Volume.from_name("faulty", create_if_missing=True)
def committer():
    errors = []
    for name in ("first.txt", "second.txt"):
        Path(arg["mount"] + "-faulty", name).write_text(name)
        try:
            faulty.commit()
            errors.append(None)
        except Exception as e:
            errors.append([type(e).__name__, str(e)])
    return errors
def exiter():
    Path(arg["mount"], "exit.txt").write_text("at exit")
def lost():
    Path(arg["mount"], "lost.txt").write_text("never committed")
    SIGNALS.joinpath("lost").touch()
    time.sleep(60)
viewer = app.function(**options, name="viewer")(viewer)
committer = app.function(
    **{**options, "volumes": {arg["mount"] + "-faulty": faulty}}, name="committer"
)(committer)
exiter = app.function(**options, name="exiter")(exiter)
lost = app.function(**options, name="lost")(lost)
def names():
    return sorted(e.path for e in vol.listdir("/"))
def upload(text):
    Path("seed.txt").write_text(text)
    with vol.batch_upload(force=True) as batch:
        batch.put_file("seed.txt", "/seed.txt")
upload("v1")
with app.run():
    call = viewer.spawn()
    wait_for("started")
    upload("v2")
    SIGNALS.joinpath("uploaded").touch()
    wait_for("written")
    out["before_commit"] = names()
    SIGNALS.joinpath("checked").touch()
    out["seen"] = call.get(timeout=30)
    out["after_commit"] = names()
    out["commit_errors"] = committer.spawn().get(timeout=30)
    out["faulty"] = sorted(e.path for e in faulty.listdir("/"))
    exiter.spawn().get(timeout=30)
    # the exit commit comes after the output is sent (user_code_imports.py, step 8)
    end = time.time() + 10
    while "exit.txt" not in names() and time.time() < end:
        time.sleep(0.05)
    out["after_exit"] = names()
    killed = lost.spawn()
    wait_for("lost")
    killed.cancel(terminate_containers=True)
    out["after_kill"] = names()
"""


@pytest.mark.modal_server
def test_a_containers_view_is_fixed_until_it_reloads_and_commits_publish(tmp_path):
    """
    A container sees the volume as it was at its start until it reloads; what it
    writes reaches the volume when it commits (explicitly, or at its function's end,
    after its output was sent), never when it is killed first; a commit that fails
    once raises in the container (``RuntimeError`` from the client's
    ``ConflictError``) and the next one works.
    """
    from .modal_server import CommitFault, Faults
    from .modal_server.containers import namespace_prefix

    if namespace_prefix() is None:
        pytest.skip("no mount namespaces here: containers share the volume's folder")
    fault = CommitFault(mode="once", volume="faulty")
    with serve(tmp_path / "server", faults=Faults(commit=fault)) as server:
        out = run_client(server, _VIEWS, {"mount": str(tmp_path / "mnt")})
        state = server.state
        assert out["seen"] == {"before_reload": "v1", "after_reload": "v2"}
        assert out["before_commit"] == ["seed.txt"]
        assert out["after_commit"] == ["mine.txt", "seed.txt"]
        first, second = out["commit_errors"]
        assert first[0] == "RuntimeError" and "fault set by the test" in first[1]
        assert second is None
        assert fault.failed == 1 and fault.seen >= 2
        assert out["faulty"] == ["first.txt", "second.txt"]
        assert "exit.txt" in out["after_exit"]
        assert "lost.txt" not in out["after_kill"]
        assert not (state.volume("views").folder / "lost.txt").exists()
        # the mount path outside every container stays empty
        assert not any((tmp_path / "mnt").iterdir())


_QUEUED = """
import time
from pathlib import Path
app = modal.App("gpu-app")
vol = modal.Volume.from_name("bg", create_if_missing=True)
options = dict(
    image=modal.Image.debian_slim(),
    volumes={arg["mount"]: vol},
    serialized=True,
    single_use_containers=True,
    timeout=60,
)
def busy(seconds, name):
    Path(arg["mount"], name).write_text("written, not committed")
    time.sleep(seconds)
    return "done"
gpu = app.function(**options, gpu="T4", name="gpu")(busy)
cpu = app.function(**options, name="cpu")(busy)
with app.run():
    t0 = time.time()
    out["gpu"] = gpu.spawn(1.0, "gpu.txt").get(timeout=30)
    out["gpu_s"] = time.time() - t0
    call = cpu.spawn(30.0, "bg.txt")
    end = time.time() + 20
    while "bg.txt" not in [e.path for e in vol.listdir("/")]:
        assert time.time() < end, "no background commit"
        time.sleep(0.1)
    out["cpu_call"] = call.object_id
    call.cancel(terminate_containers=True)
"""


@pytest.mark.modal_server
def test_gpu_calls_queue_unbilled_and_background_commits_publish(tmp_path):
    """
    A call of a GPU function waits the server's GPU queueing delay before its
    container starts; billing starts with the container, so the bill holds the
    container's seconds, not the wait; a CPU function starts at once. A running
    container's writes reach the volume by the server's background commits.
    """
    from .modal_server.containers import namespace_prefix

    if namespace_prefix() is None:
        pytest.skip("no mount namespaces here: containers share the volume's folder")
    delay = 2.0
    with serve(
        tmp_path / "server", gpu_queue_delay_s=delay, background_commit_s=0.3
    ) as server:
        out = run_client(server, _QUEUED, {"mount": str(tmp_path / "mnt")})
        state = server.state
        assert out["gpu"] == "done" and out["gpu_s"] > delay + 1.0
        bill = {b["gpu"]: b for b in state.bill()}
        gpu, cpu = bill["T4:1"], bill[""]
        gpu_call = state.function_calls[gpu["function_call_id"]]
        assert gpu["start"] - gpu_call.created_at >= delay
        # billed from the container's start: up to its output (after the 1 s the
        # function sleeps) within what the client waited less the queueing delay;
        # its end, after the output (the exit commit: step 8 of
        # modal/_runtime/user_code_imports.py), is billed too, however late
        output_at = gpu_call.output.output_created_at
        assert 1.0 < output_at - gpu["start"] <= out["gpu_s"] - delay + 0.1
        assert gpu["seconds"] == pytest.approx(gpu["end"] - gpu["start"])
        assert gpu["end"] >= output_at
        cpu_call = state.function_calls[out["cpu_call"]]
        assert cpu["start"] - cpu_call.created_at < 1.0  # no GPU: no queue
        assert cpu["end"] is not None and cpu["seconds"] < 25
        (container,) = [
            c
            for c in state.containers.values()
            if c.function_call_id == out["cpu_call"]
        ]
        (view,) = container.views.values()
        assert view.commits >= 1 and container.end_reason == "cancelled"


# -- faults (issue 37, phase 3) ------------------------------------------------------

_ERROR = """
import time
from pathlib import Path
def error(f):
    try:
        f()
    except BaseException as e:
        return [type(e).__name__, str(e)]
    return None
"""

_RPC_FAULTS = (
    _ERROR
    + """
app = modal.App("faults-app")
options = dict(serialized=True, single_use_containers=True, timeout=60)
def double(x):
    return 2 * x
def sleeper():
    time.sleep(60)
double = app.function(**options, name="double")(double)
sleeper = app.function(**options, name="sleeper")(sleeper)
with app.run():
    out["spawn"] = error(lambda: double.spawn(1))
    call = double.spawn(21)
    out["get"] = call.get(timeout=30)
    for key in ("lost", "auth", "limited"):
        out[key] = error(lambda: call.get(timeout=5))
    out["again"] = call.get(timeout=5)
    running = sleeper.spawn()
    out["cancel_lost"] = error(lambda: running.cancel(terminate_containers=True))
    out["cancel"] = error(lambda: running.cancel(terminate_containers=True))
    out["running"] = running.object_id
"""
)


def test_rpc_faults_reach_the_client_after_its_own_retries(local_modal):
    """
    Statuses the client retries (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``: 3 retries
    by default, modal/_utils/grpc_utils.py) reach ``spawn``, ``get`` and ``cancel``
    only from the fourth failure on, as ``ServiceError``; 3 failures are absorbed.
    ``UNAUTHENTICATED`` and ``RESOURCE_EXHAUSTED`` are not retried: ``AuthError``
    and ``ResourceExhaustedError`` at once. A failed spawn starts nothing; a failed
    cancel leaves the container running, the next one stops it.
    """
    faults = local_modal.faults
    faults.fail_rpc("FunctionMap", times=4)
    faults.fail_rpc("FunctionGetOutputs", times=3)  # absorbed by the retries
    faults.fail_rpc("FunctionGetOutputs", "DEADLINE_EXCEEDED", times=4, after=1)
    faults.fail_rpc("FunctionGetOutputs", "UNAUTHENTICATED", message="revoked")
    faults.fail_rpc("FunctionGetOutputs", "RESOURCE_EXHAUSTED", message="slow down")
    cancel = faults.fail_rpc("FunctionCallCancel", times=4)
    out = run_client(local_modal, _RPC_FAULTS)

    assert out["spawn"] == [
        "ServiceError",
        "FunctionMap: UNAVAILABLE (fault injected by the test)",
    ]
    assert out["get"] == out["again"] == 42
    assert out["lost"] == [
        "ServiceError",
        "FunctionGetOutputs: DEADLINE_EXCEEDED (fault injected by the test)",
    ]
    assert out["auth"] == ["AuthError", "revoked"]
    assert out["limited"] == ["ResourceExhaustedError", "slow down"]
    assert out["cancel_lost"][0] == "ServiceError" and out["cancel"] is None
    state = local_modal.state
    statuses = [c.status for c in state.calls_of("FunctionGetOutputs")]
    assert statuses == ["UNAVAILABLE"] * 3 + ["OK"] + ["DEADLINE_EXCEEDED"] * 4 + [
        "UNAUTHENTICATED",
        "RESOURCE_EXHAUSTED",
        "OK",
    ]
    maps = state.calls_of("FunctionMap")
    assert [c.status for c in maps] == ["UNAVAILABLE"] * 4 + ["OK", "OK"]
    assert len(state.function_calls) == 2  # the failed spawn made no call
    assert cancel.failed == 4
    cancels = state.calls_of("FunctionCallCancel")
    assert [c.status for c in cancels] == ["UNAVAILABLE"] * 4 + ["OK"]
    assert {c.requests[0].function_call_id for c in cancels} == {out["running"]}
    (sleeping,) = [
        c for c in state.containers.values() if c.function_call_id == out["running"]
    ]
    assert sleeping.end_reason == "cancelled"


_UPLOAD_FAULTS = (
    _ERROR
    + """
vol = modal.Volume.from_name("up", create_if_missing=True)
def put(name, data):
    Path(name).write_bytes(data)
    with vol.batch_upload(force=True) as batch:
        batch.put_file(name, "/" + name)
big = 5 * 1024 * 1024
out["retried"] = error(lambda: put("a.bin", b"a" * big))
out["failed"] = error(lambda: put("b.bin", b"b" * big))
out["midway"] = error(lambda: put("c.txt", b"c"))
out["listed"] = sorted(e.path for e in vol.listdir("/"))
out["again"] = error(lambda: put("c.txt", b"c"))
"""
)


def test_upload_faults_fail_the_batch_and_put_nothing(local_modal):
    """
    A blob's PUT failing twice is retried by the client (3 tries,
    ``_upload_to_s3_url``); failing 3 times it raises ``ExecutionError``. A batch
    whose ``VolumePutFiles`` fails past the client's retries raises
    ``ServiceError`` and puts none of its files; sent again, it is put.
    """
    from .modal_server import HttpFault

    faults = local_modal.faults
    faults.http += [HttpFault(times=2), HttpFault(times=3, after=1)]
    # the first batch (a.bin) is put; the second fails at its blob, before it
    faults.fail_rpc("VolumePutFiles", "DEADLINE_EXCEEDED", times=4, after=1)
    out = run_client(local_modal, _UPLOAD_FAULTS)

    assert out["retried"] is None
    kind, text = out["failed"]
    assert kind == "ExecutionError" and "failed with status 500" in text
    assert out["midway"] == [
        "ServiceError",
        "VolumePutFiles: DEADLINE_EXCEEDED (fault injected by the test)",
    ]
    assert out["listed"] == ["a.bin"] and out["again"] is None
    folder = local_modal.state.volume("up").folder
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin", "c.txt"]
    assert [f.failed for f in faults.http] == [2, 3]


_BUILD = (
    _ERROR
    + """
image = modal.Image.debian_slim().pip_install("torch")
with modal.enable_output():
    out["first"] = error(image.build)
    print("SECOND BUILD", flush=True)
    out["second"] = error(image.build)
out["image_id"] = image.object_id
"""
)


def test_a_build_fault_fails_the_build_with_its_log_line(local_modal):
    """
    A layer build streams this server's output line, which the client prints under
    ``enable_output``; a build fault prints its log line too and fails the build:
    ``ImageBuildError`` naming ``modal image logs <id>``. The failed layer is not
    cached: the next build of the same image builds again, and succeeds.
    """
    from .modal_server import BuildFault
    from .modal_server.objects import BUILD_LOG

    local_modal.faults.build = BuildFault(
        log="ERROR: No matching distribution for torch", times=1
    )
    proc = run_client(local_modal, _BUILD, full=True)
    out, text = proc
    kind, message = out["first"]
    assert kind == "ImageBuildError"
    assert "modal image logs im-" in message and "failed" in message
    assert out["second"] is None
    first, second = text.split("SECOND BUILD")
    assert "ERROR: No matching distribution for torch" in first
    assert "ERROR: No matching" not in second
    image_id = out["image_id"]
    assert BUILD_LOG.format(image_id=image_id).strip() in second
    assert local_modal.faults.build.failed == 1
    joins = local_modal.state.calls_of("ImageJoinStreaming")
    assert len(joins) >= 3  # the base layer, the failed one built again


_CONTAINER_FAULTS = (
    _ERROR
    + """
import os, signal
app = modal.App("container-faults")
vol = modal.Volume.from_name("pre", create_if_missing=True)
SIGNALS = Path(arg["mount"] + "-signals")
SIGNALS.mkdir(parents=True, exist_ok=True)
options = dict(
    volumes={arg["mount"]: vol},
    serialized=True,
    single_use_containers=True,
    timeout=60,
)
def stubborn():
    # each start counted beside the volume; the first ignores the interrupt
    starts = SIGNALS / "starts"
    with open(starts, "a") as f:
        f.write(f"{os.getpid()}\\n")
    if Path(arg["mount"], "first.txt").exists():
        return {"starts": len(starts.read_text().split()), "entered": time.time()}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Path(arg["mount"], "first.txt").write_text("committed before the preemption")
    vol.commit()
    time.sleep(60)
def sees(path, reload):
    if reload:
        vol.reload()
    return os.path.exists(path)
def entered():
    return {"entered": time.time()}
stubborn = app.function(**options, name="stubborn")(stubborn)
entered = app.function(**options, name="entered")(entered)
sees = app.function(**options, startup_timeout=arg.get("startup", 60), name="sees")(
    sees
)
def put(name):
    Path(name).write_text(name)
    with vol.batch_upload(force=True) as batch:
        batch.put_file(name, "/" + name)
with app.run():
    if arg["case"] == "preempt":
        out["result"] = stubborn.spawn().get(timeout=60)
    elif arg["case"] == "delay":
        out["result"] = entered.spawn().get(timeout=60)
        out["startup"] = error(lambda: sees.spawn("/", False).get(timeout=60))
    else:
        time.sleep(1)
        out["uploaded_at"] = time.time()
        put("in.txt")
        path = arg["mount"] + "/in.txt"
        out["without"] = sees.spawn(path, False).get(timeout=60)
        out["with"] = sees.spawn(path, True).get(timeout=60)
"""
)


@pytest.mark.modal_server
def test_a_preempted_input_restarts_in_a_new_container(tmp_path):
    """
    Preemption once a file is committed: the container is interrupted (``SIGINT``);
    one that ignores it is killed after the grace period; the same input then runs
    in a new container whose view holds the committed file, and its output is the
    call's. Both containers are billed.
    """
    from .modal_server import Faults, Preemption

    preemption = Preemption(volume="pre", when=("first.txt",), grace_s=1.0)
    with serve(tmp_path / "server", faults=Faults(preemption=preemption)) as server:
        arg = {"mount": str(tmp_path / "mnt"), "case": "preempt"}
        out = run_client(server, _CONTAINER_FAULTS, arg)
        state = server.state
        assert out["result"]["starts"] == 2
        (call,) = state.function_calls.values()
        first, second = (state.containers[t] for t in call.task_ids)
        assert preemption.preempted == [first.task_id]
        assert first.end_reason == "preempted" and first.returncode == -9
        assert first.ended_at - first.preempted_at >= 1.0  # the grace period
        assert second.started_at >= first.ended_at
        assert call.status_name == "GENERIC_STATUS_SUCCESS"
        assert call.output.task_id == second.task_id
        assert len(state.bill()) == 2


@pytest.mark.modal_server
def test_a_start_up_delay_is_billed_and_counts_against_the_start_up_timeout(
    tmp_path,
):
    """
    With a start-up delay, a container is billed from its start while Modal's
    entrypoint waits; it asks for its input only after the delay, and a start-up
    timeout shorter than the delay ends it (``FunctionTimeoutError``).
    """
    from .modal_server import Faults

    with serve(tmp_path / "server", faults=Faults(start_delay_s=3.0)) as server:
        arg = {"mount": str(tmp_path / "mnt"), "case": "delay", "startup": 2}
        out = run_client(server, _CONTAINER_FAULTS, arg)
        state = server.state
        by_name = {
            state.functions[c.function_id].name: c for c in state.containers.values()
        }
        delayed = by_name["entered"]
        assert delayed.asked_at - delayed.started_at >= 3.0
        assert out["result"]["entered"] - delayed.started_at >= 3.0
        assert delayed.billed_s() >= 3.0
        kind, text = out["startup"]
        assert kind == "FunctionTimeoutError" and "startup_timeout=2" in text
        assert by_name["sees"].end_reason == "startup timeout"


@pytest.mark.modal_server
def test_a_container_started_ahead_sees_an_upload_only_after_reloading(tmp_path):
    """
    A container started ahead of its input (at the app's start) has the volume's
    view of that moment: a file uploaded later is not there until it reloads. Each
    input goes to the waiting container, another starts ahead; the app's end stops
    the one left waiting.
    """
    from .modal_server import Faults

    with serve(tmp_path / "server", faults=Faults(containers_ahead=True)) as server:
        arg = {"mount": str(tmp_path / "mnt"), "case": "ahead"}
        out = run_client(server, _CONTAINER_FAULTS, arg)
        state = server.state
        assert out["without"] is False and out["with"] is True
        sees = state.function("sees")
        containers = [
            c
            for c in state.containers.values()
            if state.functions[c.function_id].name == "sees"
        ]
        assert len(containers) == 3  # two given inputs, one left waiting
        used, second, idle = sorted(containers, key=lambda c: c.started_at)
        assert (
            used.started_at < out["uploaded_at"] and used.input_at > out["uploaded_at"]
        )
        assert used.function_call_id and second.function_call_id
        assert idle.function_call_id == "" and idle.end_reason == "app stopped"
        assert all(c.function_id == sees.function_id for c in containers)
