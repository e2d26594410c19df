"""A small local fake of the ``modal`` package (Modal 1.x API subset) for tests.

Put the folder that holds this package first on ``sys.path``/``PYTHONPATH`` so that
``import modal`` gives the fake. It imports nothing from the real package and needs
only the standard library. Everything lives under ``$FAKE_MODAL_DIR`` (required)::

    volumes/<name>/            committed files of volume <name>
    containers/<call id>/      one folder per spawned call:
        root/                  the container's cwd and $HOME
        mounts/<n>/            the container's view of its n-th mounted volume
        spec.json, result.json, container.log (its stdout and stderr)
    calls.jsonl                one JSON line per ``Function.spawn``
                               (see ``fake_calls()``)
    locks/, tmp/               internal

Containers. ``Function.spawn`` runs ``python -m modal._container spec.json`` as a
local subprocess in its own process group (its own session), with cwd
``containers/<id>/root``. The container imports the function by ``__module__`` +
``__qualname__`` (it must be a module-level function of an importable module) and
calls it. Arguments and the return value must be JSON-serialisable (no cloudpickle),
so tuples come back as lists.

Container environment: NOT the client's. Only ``PATH`` (client's), ``HOME`` (the
container root), ``LANG=C.UTF-8``, ``PYTHONPATH`` (the fake's folder only, never the
client's), ``FAKE_MODAL_HIDDEN_PATHS`` (see below), ``FAKE_MODAL_DIR``,
``FAKE_MODAL_MOUNTS`` (JSON ``{volume name: view folder}``), ``FAKE_MODAL_CALL_ID``,
``MODAL_IS_REMOTE=1``, ``MODAL_TASK_ID``,
then the image's ``.env()`` vars, ``Secret.from_dict`` vars and
``app.function(env=...)`` vars (later wins). ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``
and everything else of the client never get in.

Local sources. As Modal mounts ``add_local_python_source`` packages under ``/root``
(the container's cwd), the fake copies them into ``containers/<id>/root`` and hides
the client's folders they came from (its editable installs) from every Python of the
container, the function's and its subprocesses' (``sitecustomize.py`` of the fake,
``FAKE_MODAL_HIDDEN_PATHS``): a subprocess started from another folder finds them
only if its ``PYTHONPATH`` names ``/root``.

Mount remapping. A local process cannot mount at ``/some/mount``, so for
``volumes={"/some/mount": vol}`` each container gets a view folder
``containers/<id>/mounts/<n>`` (a copy of the volume's committed files when the
container started, which is *before* its input: each app keeps a container started
ahead, its view taken when the app started or at the previous spawn, so that what
the client uploads or commits after that is not in the view until the container calls
``Volume.reload()``), and every string argument - positional, keyword, or nested in dict
values/lists - that equals the mount path or starts with mount path + "/" is
rewritten to the view folder; the same is done for the container's extra env var
values. Strings in the return value that point into a view folder are mapped back to
the mount path.

Volume consistency. Inside the container, ``modal.Volume.from_name(name)`` of a
mounted volume returns a handle whose ``commit()`` pushes the files
created/changed/deleted in the view since spawn (or the last commit/reload) into the
committed folder, and whose ``reload()`` pulls other commits into the view without
touching files changed locally. As Modal does, the view is committed when the
function ends (returns or raises: ``volume_commit`` in
``modal/_runtime/user_code_imports.py``), not when the container is killed, and in the
background every ``FAKE_MODAL_BACKGROUND_COMMIT_S`` seconds (default 2; 0: off) while
the function runs (volumes are mounted with ``allow_background_commits``). Clients see
committed files only.

Calls. ``FunctionCall.get`` returns the JSON value; an exception raised in the
container is pickled there and raised again here with its own class, marked with
``__line_cache__`` (as Modal does: ``modal/_utils/function_utils.py``
``_process_result``, ``modal/_traceback.py`` ``append_modal_tb``). A container
running longer than ``timeout`` is killed (``FunctionTimeoutError``); ``cancel()``
and leaving
``app.run()`` kill the process group, and a container that dies without a result
gives ``ExecutionError``. When a container's main process ends, whatever else is left
in its process group is killed (container teardown). A container outlives the client
that spawned it unless it is cancelled or its app stopped (``fake_running()`` lists
those still running, ``fake_kill_all()`` ends them: the tests' fixture does).
Records: ``cancels.jsonl`` (each ``cancel()`` that reached the "server",
``fake_cancels()``) and ``billing.jsonl`` (each container's life from its start to
its end, what Modal bills, ``fake_bill()``).

Fault injection (read by the client at spawn time):
``FAKE_MODAL_PREEMPT_AFTER_S=<seconds>`` with ``FAKE_MODAL_PREEMPT_ONCE_FILE=<path>``:
if the file does not exist yet, it is created (atomically) and this call's container
is SIGKILLed after that many seconds - one preemption in the whole test. With
``FAKE_MODAL_PREEMPT_AFTER_S`` alone, every call is preempted once. As Modal does, a
preempted input is restarted: the same call (same id, same input) in a new container
with a fresh view of the committed volume (one line per restart in
``restarts.jsonl``); ``get`` sees only the last container's result.
``FAKE_MODAL_PREEMPT_WHEN=<glob>[:<glob>...]`` (with ``FAKE_MODAL_PREEMPT_AFTER_S`` as a
fallback time): preempt as soon as every pattern matches a file, e.g. a file committed
to the volume.
``FAKE_MODAL_GET_ERRORS=<n>``: the first n ``FunctionCall.get`` of each call raise
``modal.exception.ConnectionError`` (a client transport error; the call goes on).
``FAKE_MODAL_COMMIT_ERROR=<name>`` (``TimeoutError``, ``ETIMEDOUT``, ``OSError``,
``ConnectionError``) with ``FAKE_MODAL_COMMIT_ERROR_AFTER=<n>`` (default 0):
``Volume.commit()`` in a container raises it after n commits went through (an error
raised in the container, which ``get`` raises again with its class).
``FAKE_MODAL_UPLOAD_ERRORS=<n>``: the first n ``batch_upload`` blocks of the client
process raise ``modal.exception.ConnectionError`` when they end, none of their files
put (a block's upload failed).
``FAKE_MODAL_TOKEN_REJECTED=1``: the server refuses the token (``AuthError`` at the
first request: a volume's listing or upload, an image build, an app's start).
``FAKE_MODAL_SPAWN_ERRORS=<n>``: the first n ``Function.spawn`` of the client process
raise ``modal.exception.ConnectionError`` (nothing started).
``FAKE_MODAL_GET_RAISES=<class>[:<n>]``: the first n ``get`` of each call (every one
without n) raise ``modal.exception.<class>`` (``AuthError``, ``ResourceExhaustedError``,
...): the server refused the client's request, the call goes on.
``FAKE_MODAL_CANCEL_ERRORS=<n>``: the first n ``cancel()`` of each call raise
``ConnectionError`` and cancel nothing.
``FAKE_MODAL_SPAWN_LOST_REPLIES=<n>``: the first n spawns start their container, then
raise ``ConnectionError`` (the reply was lost: the client has no call id).
``FAKE_MODAL_START_DELAY_S=<s>``: each container takes s seconds to start (billed;
its timeout counts after it).
``FAKE_MODAL_OUTPUT_EXPIRED=1``: ``get`` of a finished call raises
``OutputExpiredError`` (a subclass of ``modal.exception.TimeoutError``).
``FAKE_MODAL_BUILD_FAIL=<text>``: starting an app fails with ``ImageBuildError``
(see ``App``); ``enable_output()`` prints the build steps (and that text).
Apps: functions are added before ``app.run()``; ``Function.with_options`` takes one
GPU string (as Modal 1.6), ``app.function`` a list too.

Not implemented: GPUs (types are only checked), image builds (steps are only
printed; ``pip_install`` does not change what the container can import: it uses the
client's interpreter and its installed packages, local sources only from ``/root``),
retries (recorded only), serialized functions, ``.map``, classes, sandboxes, deployed
apps.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import exception
from ._common import atomic_write, fake_root, locked
from .exception import (
    AuthError,
    ConnectionError,
    ExecutionError,
    FunctionTimeoutError,
    ImageBuildError,
    InvalidError,
    ModuleNotMountable,
    NotFoundError,
    OutputExpiredError,
)
from .volume import FileEntry, FileEntryType, Volume, _make_view, _move_view

__version__ = "1.6.4-fake"

# the folder to put on PYTHONPATH
_FAKE_DIR = str(Path(__file__).resolve().parent.parent)


_OUTPUT = {"enabled": False}


@contextmanager
def enable_output() -> Iterator[None]:
    """
    Like ``modal.enable_output()`` (``modal/output.py``): meanwhile, image builds
    print their steps (objects print their own output: ``_Image._load``,
    ``modal/_image.py``), and an app *started* meanwhile streams the output of all
    its containers, with a status line, for its whole life, even after this block
    ends (``_run_app`` in ``modal/runner.py`` takes the output manager once, when
    the app starts, and runs ``get_app_logs_loop`` until it stops).
    """
    before, _OUTPUT["enabled"] = _OUTPUT["enabled"], True
    try:
        yield
    finally:
        _OUTPUT["enabled"] = before


def is_local() -> bool:
    """False inside a fake container, True elsewhere (like ``modal.is_local``)."""
    return os.environ.get("MODAL_IS_REMOTE") != "1"


def fake_calls() -> list[dict]:
    """Test helper: the records of all spawns so far.

    Read from ``$FAKE_MODAL_DIR/calls.jsonl``.
    """
    path = fake_root() / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Image:
    """Immutable image description.

    Each builder method returns a new Image with a step added.
    """

    def __init__(self, steps: list[dict], python_version: str | None):
        self.steps = steps
        self.python_version = python_version
        self.object_id: str | None = None  # set once built (hydrated)

    def build(self, app: App | None = None) -> Image:
        """
        Build the image now, as ``_Image.build`` (``modal/_image.py``) does: in an
        ephemeral app of its own started with ``stream_output=False`` (no app logs,
        no status line), its build steps printed under ``enable_output``. A built
        image is not built again when an app using it starts (it is hydrated).
        """
        _build(self)
        return self

    def _with(self, step: dict) -> Image:
        return Image(self.steps + [step], self.python_version)

    @staticmethod
    def debian_slim(
        python_version: str | None = None, force_build: bool = False
    ) -> Image:
        """Base image; ``python_version`` is recorded only.

        (The container uses the client's Python.)
        """
        # Modal validates the version when the image is built (the builder's series
        # come from the server): see _build
        if python_version is not None and not isinstance(python_version, str):
            raise InvalidError(
                "Python version must be specified as a string, not "
                f"{type(python_version).__name__}"
            )
        return Image(
            [{"op": "debian_slim", "python_version": python_version}], python_version
        )

    def pip_install(
        self,
        *packages: str | list[str],
        find_links: str | None = None,
        index_url: str | None = None,
        extra_index_url: str | None = None,
        pre: bool = False,
        extra_options: str = "",
        force_build: bool = False,
        env: dict | None = None,
        secrets: list | None = None,
        gpu: str | None = None,
    ) -> Image:
        flat: list[str] = []
        for p in packages:
            flat.extend([p] if isinstance(p, str) else list(p))
        return self._with({"op": "pip_install", "packages": flat})

    def run_commands(
        self,
        *commands: str | list[str],
        env: dict | None = None,
        secrets: list | None = None,
        volumes: dict | None = None,
        gpu: str | None = None,
        force_build: bool = False,
    ) -> Image:
        """Record build commands (the fake builds nothing)."""
        flat: list[str] = []
        for c in commands:
            flat.extend([c] if isinstance(c, str) else list(c))
        return self._with({"op": "run_commands", "commands": flat})

    def add_local_python_source(
        self, *modules: str, copy: bool = False, ignore: Any = None
    ) -> Image:
        return self._with(
            {"op": "add_local_python_source", "modules": list(modules), "copy": copy}
        )

    def env(self, vars: dict[str, str]) -> Image:  # noqa: A002 - Modal's parameter name
        for k, v in vars.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidError(
                    f"Image.env: keys and values must be str, got {k!r}: {v!r}"
                )
        return self._with({"op": "env", "vars": dict(vars)})

    def _env_vars(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for step in self.steps:
            if step["op"] == "env":
                out.update(step["vars"])
        return out


#: Python series of Modal's "2025.06" image builder (``SUPPORTED_PYTHON_SERIES``,
#: ``modal/_image.py``).
_PYTHON_SERIES = ["3.10", "3.11", "3.12", "3.13", "3.14", "3.14t", "3.15", "3.15t"]
#: GPU types the fake's "server" accepts (Modal validates them on the server, not in
#: the client: ``parse_gpu_config`` in ``modal/_utils/function_utils.py`` only reads
#: the string).
_GPU_TYPES = {
    "T4", "L4", "A10", "A10G", "A100", "A100-40GB", "A100-80GB", "L40S", "H100",
    "H100!", "H200", "B200", "ANY",
}  # fmt: skip


def _check_token() -> None:
    """``FAKE_MODAL_TOKEN_REJECTED=1``: the server refuses the token (``AuthError``)."""
    if os.environ.get("FAKE_MODAL_TOKEN_REJECTED") == "1":
        raise AuthError("Token ID is malformed or invalid (fake: token rejected)")


def _check_gpu(gpu: str | list[str] | None) -> None:
    """The server's check of a function's GPU: an unknown type is an InvalidError."""
    for spec in [gpu] if isinstance(gpu, str) else list(gpu or []):
        kind = spec.split(":")[0].upper()
        if kind not in _GPU_TYPES:
            raise InvalidError(f"Unknown GPU type: '{spec}' (fake server)")


def _build(image: Image) -> None:
    """
    Build an image (the fake only prints its steps under ``enable_output``).
    ``FAKE_MODAL_BUILD_FAIL=<text>`` makes the build fail with Modal's
    ``ImageBuildError`` after printing that text (``modal/_image.py``: the build's
    log is streamed, then the error names the image).
    """
    _check_token()
    python = image.python_version or "{}.{}".format(*sys.version_info)
    series = ".".join(python.split(".")[:2])
    if series not in _PYTHON_SERIES:  # modal/_image.py, _validate_python_version
        raise InvalidError(
            f"Unsupported Python version: {python!r}. When using the '2025.06' "
            f"Image builder, Modal supports the following series: {_PYTHON_SERIES!r}."
        )
    for step in image.steps:  # modal/_utils/package_utils.py, get_module_mount_info
        for module in step.get("modules", []) if step["op"].startswith("add_") else []:
            if importlib.util.find_spec(module) is None:
                raise ModuleNotMountable(
                    f"{module} has no spec - might not be installed?"
                )
    image_id = (
        "im-fake" + uuid.uuid5(uuid.NAMESPACE_OID, json.dumps(image.steps)).hex[:12]
    )
    if _OUTPUT["enabled"]:
        for step in image.steps:
            print(f"[fake modal] building {image_id}: {step}", flush=True)
    failure = os.environ.get("FAKE_MODAL_BUILD_FAIL")
    if failure:
        if _OUTPUT["enabled"]:
            print(failure, flush=True)
        raise ImageBuildError(
            f"Image build for {image_id} failed.\nView the build logs:\n"
            f"  modal image logs {image_id}",
            image_id,
        )
    image.object_id = image_id


class Secret:
    """Only ``Secret.from_dict``: its vars are set in the container's environment."""

    def __init__(self, env_dict: dict[str, str]):
        self._env = dict(env_dict)

    @staticmethod
    def from_dict(env_dict: dict[str, str]) -> Secret:
        return Secret(env_dict)


class _AppRun:
    """What ``App.run()`` returns: enter starts the ephemeral app, exit stops it."""

    def __init__(self, app: App):
        self._app = app

    def __enter__(self) -> App:
        if self._app._running:
            raise InvalidError(f"App {self._app.name!r} is already running")
        # modal/runner.py, _run_app: the output manager is taken once, at the start
        streaming = _OUTPUT["enabled"]
        if streaming:
            print(
                f"[fake modal] Initialized. View run at "
                f"https://modal.com/apps/fake/{self._app.app_id}",
                flush=True,
            )
        _check_token()
        for function in self._app._functions:  # the server creates each function
            _check_gpu(function._opts["gpu"])
        self._app._build_images()
        self._app._running = True
        self._app._start_views_ahead(
            v for f in self._app._functions for v in f._opts["volumes"].values()
        )
        if streaming:  # get_app_logs_loop: every container's output, until the stop
            self._app._logs_thread = threading.Thread(
                target=self._app._stream_logs, daemon=True
            )
            self._app._logs_thread.start()
        return self._app

    def __exit__(self, *exc: Any) -> None:
        self._app._stop()


class App:
    """An ephemeral app.

    Define functions with ``app.function``, run them inside ``app.run()``.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        tags: dict[str, str] | None = None,
        image: Image | None = None,
        secrets: list | None = None,
        volumes: dict | None = None,
        include_source: bool = True,
    ):
        self.name = name
        self._image = image
        self._running = False
        self._calls: list[FunctionCall] = []
        self._functions: list[Function] = []
        self._app_id = "ap-fake" + uuid.uuid4().hex[:12]
        self._logs_thread: threading.Thread | None = None
        #: volume name -> the view of the container started ahead for the next input
        self._ahead: dict[str, Path] = {}

    @property
    def app_id(self) -> str:
        """The running app's id (``ap-...``), as ``_App.app_id``."""
        return self._app_id

    def _start_views_ahead(self, volumes) -> None:
        """
        Start the container of the next input now, before that input exists: its
        view of each volume is the volume as committed at this moment, and stays so
        until the container calls ``Volume.reload()`` ("Make latest committed state
        of volume available in the running container": ``_Volume.reload``,
        ``modal/volume.py``; a container mounts the volume as committed when it
        starts). Modal's scheduler may hand an input to a container started earlier
        (for another input, or ahead of demand), so the fake always does: whatever
        the client commits or uploads after this moment is not in the next
        container's view until it reloads.
        """
        for vol in volumes:
            if vol.name in self._ahead:
                continue
            view = fake_root() / "ahead" / f"{self.app_id}-{uuid.uuid4().hex[:8]}"
            view.parent.mkdir(parents=True, exist_ok=True)
            _make_view(vol, view)
            self._ahead[vol.name] = view

    def _take_view_ahead(self, vol: Volume, view: Path) -> None:
        """The next container's view of `vol` (see `_start_views_ahead`), moved to
        `view`; a fresh one where none was started."""
        ahead = self._ahead.pop(vol.name, None)
        if ahead is None:
            _make_view(vol, view)
            return
        _move_view(ahead, view)

    def _stream_logs(self) -> None:
        """
        Print the output of the app's containers to this process's stdout while the
        app runs (``get_app_logs_loop``, ``modal/_output/pty.py``, started by
        ``_run_app`` in ``modal/runner.py`` when output is enabled at the start).
        """
        offsets: dict[str, int] = {}

        def drain() -> None:
            for call in list(self._calls):
                log = call._cdir / "container.log"
                if not log.exists():
                    continue
                with open(log, "rb") as fh:
                    fh.seek(offsets.get(call._id, 0))
                    data = fh.read()
                offsets[call._id] = offsets.get(call._id, 0) + len(data)
                if data:
                    sys.stdout.write(data.decode(errors="replace"))
                    sys.stdout.flush()

        while self._running:
            drain()
            time.sleep(0.2)
        drain()

    def _build_images(self) -> None:
        """
        Like Modal, build the images of the app's functions when it starts (printing
        the steps under ``enable_output``), except those already built
        (``Image.build``).
        """
        for image in {
            id(f._opts["image"]): f._opts["image"] for f in self._functions
        }.values():
            if image.object_id is None:
                _build(image)

    def function(
        self,
        *,
        image: Image | None = None,
        gpu: str | list[str] | None = None,
        timeout: int = 300,
        volumes: dict[str, Volume] | None = None,
        serialized: bool = False,
        env: dict[str, str] | None = None,
        secrets: list[Secret] | None = None,
        retries: Any = None,
        cpu: float | None = None,
        memory: int | None = None,
        ephemeral_disk: int | None = None,
        name: str | None = None,
        single_use_containers: bool = False,
        startup_timeout: int | None = None,
    ) -> Callable[[Callable], Function]:
        """Decorator turning a module-level function into a ``Function`` of this app."""
        volumes = dict(volumes or {})
        for mount, vol in volumes.items():
            if not isinstance(vol, Volume):
                raise InvalidError(f"volumes[{mount!r}] is not a modal.Volume: {vol!r}")
            if not mount.startswith("/") or mount.rstrip("/") == "":
                raise InvalidError(
                    f"mount path must be absolute and not '/': {mount!r}"
                )
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise InvalidError(f"timeout must be a positive number, got {timeout!r}")
        opts = dict(
            image=image or self._image or Image.debian_slim(),
            gpu=gpu,
            timeout=timeout,
            volumes={m.rstrip("/"): v for m, v in volumes.items()},
            serialized=serialized,
            env=dict(env or {}),
            secrets=list(secrets or []),
            retries=retries,
            cpu=cpu,
            memory=memory,
            ephemeral_disk=ephemeral_disk,
            single_use_containers=single_use_containers,
            # modal 1.6.4 (app.py, App.function): `startup_timeout or timeout`
            startup_timeout=startup_timeout or timeout,
        )
        if self._running:
            raise InvalidError("cannot add a function to an app that is running")

        def decorator(f: Callable) -> Function:
            raw = getattr(f, "_fake_raw_f", f)
            if "<locals>" in raw.__qualname__ or raw.__module__ == "__main__":
                raise InvalidError(
                    "fake modal can only run module-level functions of importable "
                    f"modules, not {raw.__module__}.{raw.__qualname__}"
                )
            function = Function(self, raw, {**opts, "name": name or raw.__name__})
            self._functions.append(function)
            return function

        return decorator

    def run(
        self,
        *,
        name: str | None = None,
        client: Any = None,
        detach: bool = False,
        interactive: bool = False,
        environment_name: str | None = None,
    ) -> _AppRun:
        """Context manager running the app; leaving it kills calls still running."""
        return _AppRun(self)

    def _stop(self) -> None:
        for call in self._calls:
            call._kill("app_stopped")
        for call in self._calls:
            call._done.wait(10)
        self._running = False
        if self._logs_thread is not None:
            self._logs_thread.join(5)


class Function:
    """A function of an ``App``; ``spawn`` runs it in a fake container."""

    def __init__(self, app: App, raw_f: Callable, opts: dict):
        self.app = app
        self._fake_raw_f = raw_f
        self._opts = opts
        self.__module__ = raw_f.__module__
        self.__qualname__ = raw_f.__qualname__
        self.__name__ = raw_f.__name__

    def __repr__(self) -> str:
        return f"<fake modal.Function {self.__module__}.{self.__qualname__}>"

    def with_options(
        self,
        *,
        cpu: float | None = None,
        memory: int | None = None,
        gpu: str | None = None,
        env: dict | None = None,
        secrets: list[Secret] | None = None,
        volumes: dict | None = None,
        retries: Any = None,
        max_containers: int | None = None,
        buffer_containers: int | None = None,
        scaledown_window: int | None = None,
        timeout: int | None = None,
        region: Any = None,
        cloud: str | None = None,
        routing_region: str | None = None,
    ) -> Function:
        """
        The same function with other resources. As Modal 1.6, ``gpu`` is one string
        here and a list is refused (``_FunctionOptions.new`` in
        ``modal/_function_variants.py``, ``parse_gpu_config`` in
        ``modal/_utils/function_utils.py``): a ranked fallback list is given only to
        ``App.function``, and an option left None keeps the base value (a function
        declared with a list keeps it).
        """
        if gpu is not None and not isinstance(gpu, str):
            raise InvalidError(
                f"Invalid GPU config: {gpu!r}. Value must be a string or `None`"
            )
        new = {"cpu": cpu, "memory": memory, "gpu": gpu, "retries": retries}
        new["timeout"] = timeout
        if secrets is not None:
            new["secrets"] = list(secrets)
        opts = {**self._opts, **{k: v for k, v in new.items() if v is not None}}
        return Function(self.app, self._fake_raw_f, opts)

    def get_raw_f(self) -> Callable:
        return self._fake_raw_f

    def local(self, *args: Any, **kwargs: Any) -> Any:
        return self._fake_raw_f(*args, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.spawn(*args, **kwargs).get()

    def spawn(self, *args: Any, **kwargs: Any) -> FunctionCall:
        """Start a container running the function with these arguments.

        The arguments must be JSON-serialisable.
        """
        if _SPAWN_ERRORS["left"] is None:
            _SPAWN_ERRORS["left"] = int(os.environ.get("FAKE_MODAL_SPAWN_ERRORS", "0"))
        if _SPAWN_ERRORS["left"] > 0:  # fault injection: the upload of the input fails
            _SPAWN_ERRORS["left"] -= 1
            raise ConnectionError("Connection lost (fake transport error at spawn)")
        if not self.app._running:
            raise InvalidError(
                f"cannot spawn {self.__qualname__}: app {self.app.name!r} is not "
                "running (use `with app.run():`)"
            )
        try:
            json.dumps([args, kwargs])
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"fake modal: arguments must be JSON-serialisable: {e}"
            ) from None
        opts = self._opts
        _check_gpu(opts["gpu"])  # the server's check of with_options' GPU
        root = fake_root()
        call_id = "fc-" + uuid.uuid4().hex
        cdir = root / "containers" / call_id
        (cdir / "root").mkdir(parents=True)
        (cdir / "mounts").mkdir()

        sources, hidden, hidden_modules = _local_sources(opts["image"])
        mapping: list[tuple[str, str]] = []  # (mount path, view folder)
        mounts: dict[str, str] = {}  # volume name -> view folder
        views: list[tuple[Volume, Path]] = []
        for n, (mount, vol) in enumerate(opts["volumes"].items()):
            view = cdir / "mounts" / str(n)
            self.app._take_view_ahead(vol, view)
            views.append((vol, view))
            mapping.append((mount, str(view)))
            mounts[vol.name] = str(view)
        mapping.sort(key=lambda mv: len(mv[0]), reverse=True)
        args_r = _remap(list(args), mapping)
        kwargs_r = _remap(kwargs, mapping)

        extra_env: dict[str, str] = dict(opts["image"]._env_vars())
        for secret in opts["secrets"]:
            extra_env.update(secret._env)
        extra_env.update(opts["env"])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(cdir / "root"),
            "LANG": "C.UTF-8",
            # the image's own Python: the client's interpreter and its installed
            # packages, never its PYTHONPATH; local sources come from /root (below)
            "PYTHONPATH": _FAKE_DIR,
            "FAKE_MODAL_HIDDEN_PATHS": json.dumps(hidden),
            "FAKE_MODAL_HIDDEN_MODULES": json.dumps(hidden_modules),
            "FAKE_MODAL_DIR": str(root),
            "FAKE_MODAL_MOUNTS": json.dumps(mounts),
            "FAKE_MODAL_CALL_ID": call_id,
            "MODAL_IS_REMOTE": "1",
            "MODAL_TASK_ID": "ta-fake-" + call_id[3:15],
        }
        env.update({k: _remap(str(v), mapping) for k, v in extra_env.items()})
        for fault in (
            "FAKE_MODAL_COMMIT_ERROR",
            "FAKE_MODAL_COMMIT_ERROR_AFTER",
            "FAKE_MODAL_BACKGROUND_COMMIT_S",
            "FAKE_MODAL_START_DELAY_S",
        ):
            if os.environ.get(fault):  # fault injection, read in the container
                env[fault] = os.environ[fault]

        spec = {
            "module": self.__module__,
            "qualname": self.__qualname__,
            "args": args_r,
            "kwargs": kwargs_r,
            "result": str(cdir / "result.json"),
        }
        atomic_write(json.dumps(spec).encode(), cdir / "spec.json")
        record = {
            "call_id": call_id,
            "app": self.app.name,
            "function": opts["name"],
            "module": self.__module__,
            "gpu": opts["gpu"],
            "timeout": opts["timeout"],
            "cpu": opts["cpu"],
            "memory": opts["memory"],
            "ephemeral_disk": opts["ephemeral_disk"],
            "single_use_containers": opts["single_use_containers"],
            "retries": opts["retries"]
            if isinstance(opts["retries"], (int, type(None)))
            else repr(opts["retries"]),
            "image_steps": opts["image"].steps,
            "python_version": opts["image"].python_version,
            "volumes": {m: v.name for m, v in opts["volumes"].items()},
            "env_keys": sorted(extra_env),
            "args": args_r,
            "kwargs": kwargs_r,
        }
        with locked("calls"), open(root / "calls.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")

        def launch(restart: bool) -> tuple[subprocess.Popen, Any]:
            if restart:  # a fresh container: a new view of the committed volume
                for vol, view in views:
                    shutil.rmtree(view)
                    _make_view(vol, view)
                shutil.rmtree(cdir / "root")
                (cdir / "root").mkdir()
            _mount_sources(sources, cdir / "root")
            log = open(cdir / "container.log", "ab")
            proc = subprocess.Popen(
                [sys.executable, "-m", "modal._container", str(cdir / "spec.json")],
                cwd=cdir / "root",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            atomic_write(str(proc.pid).encode(), cdir / "pid")
            return proc, log

        call = FunctionCall(
            call_id, launch, cdir, mapping, opts["timeout"], _preempt_after(), opts
        )
        self.app._calls.append(call)
        self.app._start_views_ahead(opts["volumes"].values())
        if _SPAWN_LOST_REPLIES["left"] is None:
            _SPAWN_LOST_REPLIES["left"] = int(
                os.environ.get("FAKE_MODAL_SPAWN_LOST_REPLIES", "0") or 0
            )
        if _SPAWN_LOST_REPLIES["left"] > 0:  # fault injection: started, reply lost
            _SPAWN_LOST_REPLIES["left"] -= 1
            raise ConnectionError(
                "Deadline exceeded (fake: the call started, its reply was lost)"
            )
        return call


#: Spawns left to fail (``FAKE_MODAL_SPAWN_ERRORS``), read at the first spawn.
_SPAWN_ERRORS: dict[str, int | None] = {"left": None}
#: Spawns left whose reply is lost (``FAKE_MODAL_SPAWN_LOST_REPLIES``): the call runs,
#: the client sees a ``ConnectionError`` and never learns its id.
_SPAWN_LOST_REPLIES: dict[str, int | None] = {"left": None}


def _local_sources(
    image: Image,
) -> tuple[list[tuple[str, Path]], list[str], list[str]]:
    """
    The local Python sources an image adds (``add_local_python_source``) as (name,
    local path) pairs, the client's ``sys.path`` folders they were found in, and the
    names of those found in a folder of installed packages: a container sees those
    packages only as Modal mounts them, under ``/root``
    (``_Mount._add_local_python_source``/``get_module_mount_info``, ``modal/mount.py``
    and ``modal/_utils/package_utils.py``), not through the client's installs, which
    ``sitecustomize`` hides in the container's processes: an editable install's
    folder is dropped from ``sys.path``; a package installed among others
    (``site-packages``) is found only under ``/root`` (its folder holds the image's
    other packages, which stay).
    """
    sources, hidden, modules = [], [], []
    for step in image.steps:
        if step["op"] != "add_local_python_source":
            continue
        for module in step["modules"]:
            spec = importlib.util.find_spec(module)
            if spec is None:
                continue  # refused when the image is built (ModuleNotMountable)
            if spec.submodule_search_locations:
                path = Path(list(spec.submodule_search_locations)[0])
            else:
                path = Path(spec.origin)
            sources.append((module, path))
            if path.parent.name in ("site-packages", "dist-packages"):
                modules.append(module.partition(".")[0])
            else:
                hidden.append(os.path.abspath(path.parent))
    return sources, hidden, modules


def _mount_sources(sources: list[tuple[str, Path]], root: Path) -> None:
    """Copy local sources into the container's ``/root`` (its cwd), as Modal mounts
    them: ``.py`` files only, no ``__pycache__``."""
    for _module, path in sources:
        if path.is_dir():
            shutil.copytree(
                path,
                root / path.name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                dirs_exist_ok=True,
            )
        else:
            shutil.copy2(path, root / path.name)


def _remap(obj: Any, mapping: list[tuple[str, str]]) -> Any:
    """Rewrite strings under a (from, to) prefix.

    Recurses into lists/tuples and dict values.
    """
    if isinstance(obj, str):
        for src, dst in mapping:
            if obj == src or obj.startswith(src + "/"):
                return dst + obj[len(src) :]
        return obj
    if isinstance(obj, (list, tuple)):
        return [_remap(x, mapping) for x in obj]
    if isinstance(obj, dict):
        return {k: _remap(v, mapping) for k, v in obj.items()}
    return obj


def _preempt_after() -> float | None:
    """Seconds after which to preempt the container being spawned, or None.

    (Fault injection.)
    """
    after = os.environ.get("FAKE_MODAL_PREEMPT_AFTER_S")
    if not after:
        return None
    once = os.environ.get("FAKE_MODAL_PREEMPT_ONCE_FILE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None
    return float(after)


_ALL_CALLS: dict[str, FunctionCall] = {}


class FunctionCall:
    """Handle of a spawned call; ``get`` waits for its result."""

    def __init__(self, call_id, launch, cdir, mapping, timeout, preempt_after, opts):
        self._id = call_id
        self._launch = launch
        self._gpu = opts.get("gpu")
        self._proc, self._log = launch(False)
        self._container_started = time.time()
        self._cdir: Path = cdir
        self.restarts = 0
        self._get_errors = int(os.environ.get("FAKE_MODAL_GET_ERRORS", "0") or 0)
        self._get_raises = _client_error_fault("FAKE_MODAL_GET_RAISES")
        self._cancel_errors = int(os.environ.get("FAKE_MODAL_CANCEL_ERRORS", "0") or 0)
        self._expired = os.environ.get("FAKE_MODAL_OUTPUT_EXPIRED") == "1"
        self._unmap = [(view, mount) for mount, view in mapping]
        self._timeout = timeout
        self._lock = threading.Lock()
        self._exited = False  # main process has exited (not yet reaped, maybe)
        self._reason: str | None = None  # why the fake killed it
        self._preempted_once = False  # fault injection: at most one preemption
        self._done = threading.Event()
        # the timeout counts from the function's start, after the container's
        delay = float(os.environ.get("FAKE_MODAL_START_DELAY_S", "0") or 0)
        self._timers = [threading.Timer(timeout + delay, self._kill, ("timeout",))]
        if preempt_after is not None:
            self._timers.append(
                threading.Timer(preempt_after, self._kill, ("preempted",))
            )
            when = os.environ.get("FAKE_MODAL_PREEMPT_WHEN", "")
            if when:
                threading.Thread(
                    target=self._preempt_when,
                    args=(when.split(os.pathsep),),
                    daemon=True,
                ).start()
        for t in self._timers:
            t.daemon = True
            t.start()
        threading.Thread(
            target=self._watch, daemon=True, name=f"fake-modal-{call_id}"
        ).start()
        _ALL_CALLS[call_id] = self

    @property
    def object_id(self) -> str:
        return self._id

    @staticmethod
    def from_id(function_call_id: str, **_ignored: Any) -> FunctionCall:
        """Look up a call spawned by this process."""
        try:
            return _ALL_CALLS[function_call_id]
        except KeyError:
            raise NotFoundError(
                f"function call {function_call_id} not found "
                "(fake: only calls of this process)"
            ) from None

    def _watch(self) -> None:
        while True:
            pid = self._proc.pid
            # exited, but not reaped: pgid still ours
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            with self._lock:
                self._exited = True
                preempted = self._reason == "preempted"
            try:
                # container teardown: leftover processes of the group
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            self._proc.wait()
            self._log.close()
            self._bill()
            if not preempted:
                break
            # Modal reschedules a preempted input: the same call, the same input,
            # in a new container (it does not count against the function's retries)
            with self._lock:
                if self._reason != "preempted":  # cancelled meanwhile
                    break
                (self._cdir / "result.json").unlink(missing_ok=True)
                self._proc, self._log = self._launch(True)
                self._container_started = time.time()
                self._exited, self._reason = False, None
                self.restarts += 1
                with locked("calls"), open(fake_root() / "restarts.jsonl", "a") as fh:
                    fh.write(json.dumps({"call_id": self._id}) + "\n")
        for t in self._timers:
            t.cancel()
        self._done.set()

    def _preempt_when(self, patterns: list[str]) -> None:
        """Preempt as soon as every glob pattern matches a file (fault injection)."""
        import glob

        while not self._done.is_set() and self._reason is None:
            if all(glob.glob(p) for p in patterns):
                self._kill("preempted")
                return
            time.sleep(0.1)

    def _kill(self, reason: str) -> None:
        with self._lock:
            if self._exited or self._reason is not None:
                return
            if reason == "preempted":
                # one preemption per call: the fallback timer of the first container
                # must not preempt the restarted one (the race that made the
                # preemption test flaky)
                if self._preempted_once:
                    return
                self._preempted_once = True
            self._reason = reason
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def _bill(self) -> None:
        """
        Record what Modal bills for the container that just ended: from its start to
        its end, whether or not anyone polls it (``billing.jsonl``: call id, GPU,
        start and end, epoch seconds; see `fake_bill`).
        """
        record = {
            "call_id": self._id,
            "gpu": self._gpu,
            "start": self._container_started,
            "end": time.time(),
        }
        with locked("calls"), open(fake_root() / "billing.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def cancel(self, terminate_containers: bool = False) -> None:
        """
        Kill the container; a later ``get`` raises ``ExecutionError`` (cancelled).
        ``FAKE_MODAL_CANCEL_ERRORS=<n>``: the first n cancels of each call raise
        ``modal.exception.ConnectionError`` and cancel nothing (the request was lost).
        Each cancel that reaches the "server" is a line of ``cancels.jsonl``.
        """
        if self._cancel_errors > 0:
            self._cancel_errors -= 1
            raise ConnectionError("Deadline exceeded (fake: the cancel was lost)")
        with locked("calls"), open(fake_root() / "cancels.jsonl", "a") as fh:
            fh.write(json.dumps({"call_id": self._id, "at": time.time()}) + "\n")
        self._kill("cancelled")

    def get(self, timeout: float | None = None, *, index: int = 0) -> Any:
        """Wait at most ``timeout`` seconds (None: forever); return the result.

        Raises if the call failed.
        """
        if self._get_errors > 0:  # fault injection: the client's connection drops
            self._get_errors -= 1
            raise ConnectionError("Deadline exceeded (fake transport error)")
        if self._get_raises is not None and self._get_raises[1] != 0:
            # fault injection: the server refuses the client's request (a rate
            # limit, a token revoked meanwhile): raised by the client, the call
            # goes on running
            kind, left = self._get_raises
            self._get_raises = (kind, left - 1)
            raise getattr(exception, kind)(f"fake: the server refused get() ({kind})")
        if not self._done.wait(timeout):
            # real Modal 1.x raises Python's TimeoutError here, bare (``raise
            # TimeoutError()`` in _FunctionCall.poll_function, modal/_functions.py),
            # not modal.exception.TimeoutError
            raise TimeoutError()
        if self._expired:
            raise OutputExpiredError()
        result_path = self._cdir / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        if result is not None and (self._proc.returncode == 0 or self._reason is None):
            if result["ok"]:
                return _remap(result["value"], self._unmap)
            raise _remote_exception(result)
        where = f"container for {self._id} (log: {self._cdir / 'container.log'})"
        if self._reason == "timeout":
            raise FunctionTimeoutError(
                f"{where} timed out after {self._timeout}s and was killed"
            )
        if self._reason == "cancelled":
            raise ExecutionError(
                f"function call {self._id} was cancelled; {where} was killed"
            )
        if self._reason == "preempted":
            raise ExecutionError(
                f"{where} was preempted (fake fault injection) and exited "
                "without a result"
            )
        if self._reason == "app_stopped":
            raise ExecutionError(
                f"{where} was killed because the ephemeral app stopped; no result"
            )
        raise ExecutionError(
            f"{where} exited without a result (preempted or killed); "
            f"exit status {self._proc.returncode}"
        )


def _remote_exception(result: dict) -> BaseException:
    """
    The exception a container raised, to be raised again here with its own class, as
    ``_process_result`` in ``modal/_utils/function_utils.py`` does: unpickled (an
    error doing so is an ``ExecutionError`` holding the remote traceback), and marked
    by ``append_modal_tb`` (``modal/_traceback.py``) with ``__line_cache__``, the
    container's traceback lines keyed by ``(<task id>:file, line number)``.
    """
    try:
        exc = pickle.loads(base64.b64decode(result["pickled"]))
    except Exception as deser_exc:
        return ExecutionError(
            "Could not deserialize remote exception due to local error:\n"
            f"{deser_exc}\nHere is the remote traceback:\n{result['traceback']}"
        )
    if not isinstance(exc, BaseException):
        return ExecutionError(f"Got remote exception of incorrect type {type(exc)}")
    exc.__line_cache__ = {(f, n): line for f, n, line in result["line_cache"]}
    return exc


def _client_error_fault(name: str) -> tuple[str, int] | None:
    """
    ``<name>=<class>[:<n>]`` (e.g. ``ResourceExhaustedError:2``): a client error of
    ``modal.exception`` raised by the first n requests (every one without n); None
    when unset.
    """
    value = os.environ.get(name)
    if not value:
        return None
    kind, _, n = value.partition(":")
    if not isinstance(getattr(exception, kind, None), type):
        raise ValueError(f"{name}={value!r}: no modal.exception.{kind}")
    return kind, int(n) if n else -1


def fake_bill() -> list[dict]:
    """
    Test helper: what the fake Modal billed, one record per container that ended
    (``call_id``, ``gpu``, ``start``, ``end``: epoch seconds), from
    ``$FAKE_MODAL_DIR/billing.jsonl``.
    """
    path = fake_root() / "billing.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fake_cancels() -> list[str]:
    """Test helper: the call ids whose ``cancel()`` reached the fake server."""
    path = fake_root() / "cancels.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["call_id"] for line in path.read_text().splitlines()]


def fake_running() -> list[str]:
    """
    Test helper: the call ids whose container still runs, in any process (from
    each container's ``pid`` file; a container outlives the client that spawned it
    until it ends, is cancelled, or its app is stopped).
    """
    running = []
    for pid_file in sorted((fake_root() / "containers").glob("*/pid")):
        try:
            os.killpg(int(pid_file.read_text()), 0)
        except (OSError, ValueError):
            continue
        running.append(pid_file.parent.name)
    return running


def fake_kill_all() -> None:
    """Test helper: kill every container still running (a test's cleanup)."""
    for pid_file in (fake_root() / "containers").glob("*/pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


__all__ = [
    "App",
    "FileEntry",
    "FileEntryType",
    "Function",
    "FunctionCall",
    "Image",
    "Secret",
    "Volume",
    "enable_output",
    "exception",
    "fake_bill",
    "fake_calls",
    "fake_cancels",
    "fake_kill_all",
    "fake_running",
    "is_local",
]
