"""Entry point of a fake container: ``python -m modal._container <spec.json>``.

Imports ``spec["module"]``, resolves ``spec["qualname"]`` (a fake ``Function``
object found there is unwrapped to its raw function), calls it with the JSON args and
writes
``{"ok": true, "value": ...}`` or ``{"ok": false, "type", "message", "traceback",
"pickled", "line_cache"}`` atomically to ``spec["result"]``. It always exits 0 once the
result file is written.

As Modal's container does (``handle_input_exception`` and ``_format_exception`` in
``modal/_runtime/container_io_manager.py``, ``pickle_exception`` and
``pickle_traceback`` in ``modal/_serialization.py``): the exception is printed to the
container's output, pickled (an exception that cannot be pickled is replaced by
``modal.exception.SerializationError`` naming it), and sent with its traceback's
lines, each file name prefixed with ``<task id>:`` (``extract_traceback`` in
``modal/_traceback.py``).
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import pickle
import sys
import threading
import time
import traceback


def main(spec_path: str) -> int:
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    with open(spec_path) as fh:
        spec = json.load(fh)
    print(
        f"[fake modal] container {os.environ.get('FAKE_MODAL_CALL_ID')}: "
        f"{spec['module']}.{spec['qualname']}",
        flush=True,
    )
    # FAKE_MODAL_START_DELAY_S: the container's start (image load, imports) takes
    # this long; Modal bills it, and the function's timeout counts only after it
    time.sleep(float(os.environ.get("FAKE_MODAL_START_DELAY_S", "0") or 0))
    _start_background_commits()
    try:
        obj = importlib.import_module(spec["module"])
        for part in spec["qualname"].split("."):
            obj = getattr(obj, part)
        func = getattr(obj, "_fake_raw_f", obj)
        value = func(*spec["args"], **spec["kwargs"])
        try:
            text = json.dumps({"ok": True, "value": value})
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"fake modal: return value is not JSON-serialisable: {e}"
            ) from None
    except BaseException as e:  # noqa: BLE001 - SystemExit etc. are reported too
        traceback.print_exc()
        try:
            pickled = pickle.dumps(e)
        except Exception as serialization_exc:  # modal/_serialization.py
            from .exception import SerializationError

            pickled = pickle.dumps(
                SerializationError(
                    f"Failed to serialize exception {e} of type {type(e)}: "
                    f"{serialization_exc}"
                )
            )
        task = os.environ.get("MODAL_TASK_ID", "ta-fake")
        line_cache = [
            [f"<{task}>:{frame.filename}", frame.lineno, frame.line]
            for frame in traceback.extract_tb(e.__traceback__)
        ]
        text = json.dumps(
            {
                "ok": False,
                "type": type(e).__name__,
                "message": str(e),
                "traceback": traceback.format_exc(),
                "pickled": base64.b64encode(pickled).decode(),
                "line_cache": line_cache,
            }
        )
    _commit_at_exit()
    tmp = spec["result"] + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, spec["result"])
    return 0


def _start_background_commits() -> None:
    """
    Commit the mounted volumes every ``FAKE_MODAL_BACKGROUND_COMMIT_S`` seconds
    (default 2) while the function runs, as Modal's worker does for a volume mounted
    with ``allow_background_commits=True`` (what ``_Volume`` mounts ask for:
    ``modal/volume.py``; Modal's Volumes guide: "background commits ... every few
    seconds"): whatever the container has written by then reaches other containers
    and the client, finished or not; 0 turns them off.
    """
    from .volume import Volume, _mounted_views

    every = float(os.environ.get("FAKE_MODAL_BACKGROUND_COMMIT_S", "2") or 0)
    if every <= 0:
        return

    def loop() -> None:
        while True:
            time.sleep(every)
            for name, view in _mounted_views().items():
                try:
                    Volume(name, view)._push()
                except Exception as e:  # logged, as Modal's background commit
                    print(f"modal.Volume background commit failed for {name}: {e}")

    threading.Thread(target=loop, daemon=True, name="background-commits").start()


def _commit_at_exit() -> None:
    """
    Commit the mounted volumes when the function has ended (returned or raised), as
    Modal does on a container's graceful exit on the user's behalf
    (``volume_commit`` in ``modal/_runtime/user_code_imports.py`` and
    ``modal/_runtime/task_lifecycle_manager.py``: failures logged, not raised). A
    container that is killed (preempted, timed out, cancelled) commits nothing.
    """
    from .volume import Volume, _mounted_views

    for name, view in _mounted_views().items():
        try:
            Volume(name, view)._push()
        except Exception as e:  # logged, as Modal's background commit
            print(f"modal.Volume background commit failed for {name}: {e}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
