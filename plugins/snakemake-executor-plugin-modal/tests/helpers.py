"""
Helpers of the plugin's tests: a Snakemake run, what the local Modal server was asked
to run.
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
from pathlib import Path

#: The longest one process started by a test may run, in seconds, when the test
#: gives no timeout of its own (`bound_subprocess_run`): a hang fails within it,
#: naming the command, well within the per-test bound (pytest-timeout, 600 s).
PROCESS_TIMEOUT_S = 540


class ProcessHung(AssertionError):
    """A process started by a test ran past `PROCESS_TIMEOUT_S`: its command line
    and the end of its output, so that the failure says what the test waited for."""


def bound_subprocess_run() -> None:
    """
    Give every ``subprocess.run`` of this test process a timeout
    (`PROCESS_TIMEOUT_S`) where its caller gives none; past it the process is killed
    (``subprocess.run`` kills it on ``TimeoutExpired``) and the test fails with
    `ProcessHung`, naming the command and the seconds. A caller's own ``timeout``
    keeps its own ``TimeoutExpired``. Idempotent: the workflow's tests and this
    plugin's call it both, in one process.
    """
    real = subprocess.run
    if getattr(real, "bounded", False):
        return

    @functools.wraps(real)
    def run(*popenargs, timeout=None, **kwargs):
        if timeout is not None:
            return real(*popenargs, timeout=timeout, **kwargs)
        try:
            return real(*popenargs, timeout=PROCESS_TIMEOUT_S, **kwargs)
        except subprocess.TimeoutExpired as err:
            out = err.stdout or err.output or b""
            tail = out.decode(errors="replace") if isinstance(out, bytes) else out
            raise ProcessHung(
                f"{err.cmd!r} did not end within {PROCESS_TIMEOUT_S} s (killed); "
                f"the end of its output: {tail[-2000:]!r}"
            ) from None

    run.bounded = True
    subprocess.run = run


def run_snakemake(
    workdir: Path,
    snakefile: str,
    *args: str,
    env=None,
    popen: dict | None = None,
    timeout: float | None = None,
):
    """
    Run ``snakemake --executor modal`` on `snakefile` (its text) in `workdir`, in a
    subprocess that imports the installed ``modal`` pointed at the local server (with
    the ``modal_server`` fixture).
    Returns the CompletedProcess (text), or a Popen started with the ``popen`` options;
    ``timeout`` (seconds) stops a run that would not end (raising
    ``subprocess.TimeoutExpired``; without it, `PROCESS_TIMEOUT_S` and
    `ProcessHung`).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(snakefile)
    cmd = [sys.executable, "-m", "snakemake", "--executor", "modal", "--jobs", "2"]
    cmd += ["--modal-volume", "tests", "--modal-gpu", "T4", "--latency-wait", "1"]
    # Snakemake asks for the jobs' states every 10 s by default: every 2 s here
    cmd += ["--seconds-between-status-checks", "2"]
    full_env = {**os.environ, **(env or {})}
    if popen is not None:
        return subprocess.Popen([*cmd, *args], cwd=workdir, env=full_env, **popen)
    return subprocess.run(
        [*cmd, *args],
        cwd=workdir,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawned(server) -> list[dict]:
    """
    What the local Modal server was asked to run: one record per function call, in
    the order they were made.

    Parameters
    ----------
    server : LocalModal
        The ``modal_server`` fixture's server.

    Returns
    -------
    list of dict
        ``call_id`` (``fc-...``), ``function`` (the declared function's name, such as
        ``"run_job_gpu"``), ``timeout`` and ``startup_timeout`` (seconds, what the
        call's function or ``with_options`` variant carries), ``gpus`` (per rank,
        ``"<type>:<count>"`` or ``""``), ``args`` (the call's positional arguments:
        the job's spec), ``status`` (its output's ``GenericResult`` status name, ``""``
        while unfinished), ``cancelled`` (a ``FunctionCallCancel`` came) and
        ``task_ids`` (its containers) and ``volumes`` (mount path -> volume name).

    Notes
    -----
    Arguments are pickled by the client (modal/_serialization.py, ``serialize``),
    inline or as a blob when large (``args_blob_id``); the plugin sends a dict of
    plain values, which ``pickle`` reads without Modal's unpickler.
    """
    state = server.state
    with state.lock:
        calls = sorted(state.function_calls.values(), key=lambda c: c.created_at)
        functions = dict(state.functions)
        names = {v.volume_id: v.name for v in state.volumes.values()}
    records = []
    for call in calls:
        function = functions[call.function_id]
        base = functions.get(function.base_function_id, function)
        data = call.function_input.args
        if call.function_input.args_blob_id:
            data = server.store.blob_bytes(call.function_input.args_blob_id)
        args, _kwargs = pickle.loads(data) if data else ((), {})
        records.append(
            {
                "call_id": call.function_call_id,
                "function": base.name,
                "timeout": function.timeout_secs,
                "startup_timeout": function.startup_timeout_secs,
                "gpus": function.gpus,
                "args": list(args),
                "status": call.status_name,
                "cancelled": call.cancelled,
                "task_ids": list(call.task_ids),
                "volumes": {
                    m.mount_path: names.get(m.volume_id, m.volume_id)
                    for m in function.definition.volume_mounts
                },
            }
        )
    return records


#: One job copying a local input: the container must find the uploaded file.
COPY = """
rule all:
    input: "out.txt"

rule copy:
    input: "in.txt"
    output: "out.txt"
    shell: "cp {input} {output}"
"""


def unlock(work) -> None:
    """``snakemake --unlock`` in `work`, as a user does after a killed run (its lock
    left behind); fails the test when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--unlock", "--cores", "1"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
