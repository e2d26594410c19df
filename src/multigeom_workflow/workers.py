"""
Warm estimator workers: the expensive start happens once per slot (imports, device
initialisation) and once per (slot, configuration) (loading the encoder and the
diffusion model) in a run, not once per image.

A per-image job holds a slot (a GPU, or a share of the CPU; `multigeom_workflow.gpus`)
and hands its image, with the identity of its configuration's models, to the worker
bound to that slot, over a Unix socket; it starts the worker when there is none. The
worker keeps the models of the last `MAX_MODELS` configurations it served loaded, so a
slot that alternates between configurations does not reload them. It computes with the
same code as a cold job (`multigeom_workflow.estimate.estimate_request`, same thread
count), so the per-image file holds the same tensors. Only the job holding the slot
talks to its worker, so a worker serves one request at a time.

A worker ends when the Snakemake process that started the run ends (it watches its
pid: success, failure, Ctrl-C or a kill), and after `IDLE_S` seconds without work. It
logs to ``logs/workers/``. If it dies during a request, the job fails with the tail of
that log, and Snakemake's ``--retries`` can run the job again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from .gpus import lock_dir

__all__ = [
    "IDLE_S",
    "MAX_MODELS",
    "model_spec",
    "request_estimate",
    "serve",
    "slot_spec",
    "worker_socket",
]

#: Seconds a worker waits for work before it ends.
IDLE_S = 120.0
#: Configurations whose models a worker keeps loaded (least recently used goes first):
#: the paper's four fit on one GPU (a 68M-parameter UNet and an encoder each).
MAX_MODELS = 4
#: Seconds a job waits for a new worker to load its models.
START_TIMEOUT_S = 900.0


def worker_socket(spec: dict) -> Path:
    """
    The socket of the worker for `spec` (`slot_spec`: slot, device, threads, and the
    run: the pid of the Snakemake process it serves). A worker ends with its run, so
    two runs at once (two working directories, or Modal containers of a test on one
    machine) never share one; the slot's lock still gives each job its GPU alone.
    """
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    folder = lock_dir() / "workers"
    folder.mkdir(exist_ok=True)
    path = folder / f"{key}.sock"
    if len(str(path)) > 100:  # the limit of a Unix socket's path is about 107 bytes
        path = Path("/tmp") / f"multigeom-workflow-{os.getuid()}-{key}.sock"
    return path


def slot_spec(slot_key: str, device: str, threads: int) -> dict:
    """What identifies a worker: its slot (``gpu0``, ``cpu1``), device, thread count."""
    return {"slot": slot_key, "device": device, "threads": int(threads)}


def model_spec(encoder: str, diffusion: str, settings) -> dict:
    """
    What identifies a configuration's models: the absolute checkpoint paths, their
    modification times (a rewritten checkpoint is loaded again) and the diffusion
    settings.
    """
    files = {
        k: Path(v).resolve()
        for k, v in (("encoder", encoder), ("diffusion", diffusion))
    }
    return {
        **{k: str(p) for k, p in files.items()},
        **{f"{k}_mtime": p.stat().st_mtime_ns for k, p in files.items()},
        "diffusion_settings": settings,
    }


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-n:])
    except OSError:
        return ""


def request_estimate(
    spec: dict,
    models: dict,
    request: dict,
    *,
    log: Path,
    watch_pid: int,
    idle_s: float = IDLE_S,
) -> dict:
    """
    Hand one image to the worker of `spec`, starting it if there is none, and wait for
    its answer.

    Parameters
    ----------
    spec : dict
        The worker, from `slot_spec`.
    models : dict
        The configuration's models, from `model_spec`.
    request : dict
        Arguments of `estimate_to_file`: ``image``, ``index``, ``out`` (absolute
        paths), ``estimator``, ``encoder_name``, ``area``; and ``settings_files``,
        ``seed`` for upstream's provenance record.
    log : Path
        The worker's log, if it has to be started.
    watch_pid : int
        The worker ends when this process (the run's Snakemake) ends.

    Returns
    -------
    dict
        The worker's answer: ``{"ok": True, "elapsed_seconds": ...}``.

    Raises
    ------
    RuntimeError
        If the worker cannot start, dies during the request, or the estimate failed;
        the message holds the end of the worker's log.
    """
    path = worker_socket({**spec, "run": watch_pid})
    sock = _connect(path)
    if sock is None:
        path.unlink(missing_ok=True)  # a worker that died left its socket
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "multigeom_workflow.workers",
            "--socket",
            str(path),
        ]
        cmd += ["--spec", json.dumps(spec), "--watch-pid", str(watch_pid)]
        cmd += ["--idle-s", str(idle_s)]
        with open(log, "a") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while sock is None:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the estimator worker ended while starting; {log}:\n{_tail(log)}"
                )
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the estimator worker did not start; see {log}")
            time.sleep(0.1)
            sock = _connect(path)
    with sock, sock.makefile("rw") as stream:
        stream.write(json.dumps({**request, "models": models}) + "\n")
        stream.flush()
        answer = stream.readline()
    if not answer:
        raise RuntimeError(
            f"the estimator worker died during the request; {log}:\n{_tail(log)}"
        )
    reply = json.loads(answer)
    if not reply.get("ok"):
        raise RuntimeError(f"the estimator worker failed: {reply.get('error')}")
    return reply


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(path: Path, spec: dict, watch_pid: int, idle_s: float = IDLE_S) -> None:
    """
    The worker of slot `spec`: import torch and set up the device once, then answer
    requests on the Unix socket `path`, loading a configuration's models the first
    time they are asked for (keeping the `MAX_MODELS` most recently used), until
    `watch_pid` ends or `idle_s` seconds pass without a request.
    """
    from collections import OrderedDict

    import torch

    from .estimate import estimate_request, load_models

    torch.set_num_threads(spec["threads"])
    print(f"worker started on {spec['device']} (pid {os.getpid()})", flush=True)
    cache: OrderedDict[str, object] = OrderedDict()

    def models_for(m: dict):
        key = json.dumps(m, sort_keys=True)
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        while len(cache) >= MAX_MODELS:
            cache.popitem(last=False)
            if spec["device"].startswith("cuda"):
                torch.cuda.empty_cache()
        t0 = time.monotonic()
        cache[key] = load_models(
            m["encoder"], m["diffusion"], m["diffusion_settings"], spec["device"]
        )
        print(
            f"models loaded: {m['encoder']} and {m['diffusion']} on {spec['device']}"
            f" in {time.monotonic() - t0:.1f} s",
            flush=True,
        )
        return cache[key]

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(0.5)
    last = time.monotonic()
    try:
        while _alive(watch_pid) and time.monotonic() - last < idle_s:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn, conn.makefile("rw") as stream:
                request = json.loads(stream.readline())
                t = time.monotonic()
                try:
                    estimate_request(models_for(request.pop("models")), request)
                    reply = {"ok": True, "seconds": time.monotonic() - t}
                except Exception as err:  # reported to the job, which fails
                    reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
                print(f"{request['out']}: {reply}", flush=True)
                stream.write(json.dumps(reply) + "\n")
                stream.flush()
            last = time.monotonic()
    finally:
        server.close()
        path.unlink(missing_ok=True)
        why = "the run ended" if not _alive(watch_pid) else f"idle {idle_s:g} s"
        print(f"worker ends: {why}", flush=True)


def main(argv=None) -> None:
    """Entry point of a worker process (started by `request_estimate`)."""
    p = argparse.ArgumentParser()
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--watch-pid", type=int, required=True)
    p.add_argument("--idle-s", type=float, default=IDLE_S)
    args = p.parse_args(argv)
    serve(args.socket, json.loads(args.spec), args.watch_pid, args.idle_s)


if __name__ == "__main__":
    main()
