"""
Helpers of the plugin's tests: a Snakemake run, what the local Modal server was asked
to run.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path


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
    ``subprocess.TimeoutExpired``).
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
