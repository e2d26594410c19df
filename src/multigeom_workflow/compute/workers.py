"""
Warm estimator workers: the expensive start happens once per slot (imports, device
initialisation) and once per (slot, configuration) (loading the encoder and the
diffusion model) in a run, not once per image.

A per-image job (`multigeom_workflow.compute.client`) holds a slot (a GPU, or a share of
the CPU; `multigeom_workflow.compute.gpus`) and hands its `EstimateRequest` to the
worker bound to that slot and run, over a Unix socket in the run's folder; it starts the
worker when there is none. The worker keeps the models of the last `MAX_MODELS`
configurations it served loaded, so a slot that alternates between configurations does
not reload them. It computes with the same code as a cold job
(`multigeom_workflow.compute.estimate.estimate_request`, same thread count), so the
per-image file holds the same tensors. Only the job holding the slot talks to its
worker, so a worker serves one request at a time.

A worker computes only while its slot is held for it:

- it holds the slot's compute lock (`multigeom_workflow.compute.gpus.compute_lock`)
  while it loads models and computes, so no two processes ever compute on one GPU;
- it watches the connection of the job that asked: if that job goes (the job or the
  whole run killed, SIGKILL included), the worker logs one line, removes the
  temporary folder of the unfinished per-image file and ends at once, before the slot
  can go to another job, and writes nothing.

A worker also ends when the Snakemake process of its run ends (it watches its pid), and
after `IDLE_S` seconds without work. It logs to ``logs/workers/``. If it dies during a
request, the job fails with the tail of that log, and Snakemake's ``--retries`` can run
the job again.

A worker whose CUDA context fails (`cuda_context_lost`: an illegal memory access, a
device-side assert, an Xid or ECC fault: every later CUDA call of the process fails
too, pytorch issue #105359) answers the job with the error, marked, and ends before it
can serve another image: its slot's compute lock goes with it, and the job
(`multigeom_workflow.compute.client`) asks a fresh worker (a new process, a new
context) once (`ContextLost`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .gpus import _alive, clean_ended_runs, compute_lock, run_dir, slot_file_name
from .hook import estimator_hook, record
from .request import EstimateRequest

__all__ = [
    "IDLE_S",
    "MAX_MODELS",
    "ContextLost",
    "clean_after_killed_runs",
    "cuda_context_lost",
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


#: What CUDA says of an error after which the process's CUDA context is unusable
#: (sticky: every later CUDA call fails with it), as PyTorch raises it
#: (``torch.AcceleratorError``, a RuntimeError: "CUDA error: <this>"): CUDA Runtime
#: API, ``cudaError`` 700, 710, 714-719, 214, 702, 999; cuBLAS after such a fault.
STICKY_CUDA_ERRORS = (
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "hardware stack error",
    "an illegal instruction was encountered",
    "misaligned address",
    "operation not supported on global/shared address space",
    "invalid program counter",
    "unspecified launch failure",
    "uncorrectable ECC error encountered",
    "the launch timed out and was terminated",
    "CUDA error: unknown error",
    "CUBLAS_STATUS_EXECUTION_FAILED",
)


def cuda_context_lost(err: BaseException) -> bool:
    """
    Whether `err` (or an error it was raised from) says the process's CUDA context is
    unusable (`STICKY_CUDA_ERRORS`); an out-of-memory error is not (the context
    stays usable).
    """
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RuntimeError) and any(
            m in str(err) for m in STICKY_CUDA_ERRORS
        ):
            return True
        err = err.__cause__ or err.__context__
    return False


class ContextLost(RuntimeError):
    """The worker's CUDA context failed during the request; the worker has ended."""


def slot_spec(
    kind: str, slot_id: str, device: str, threads: int, run_id, env=None
) -> dict:
    """
    What identifies a worker: its slot (`kind` ``"gpu"`` or ``"cpu"`` and id), the
    torch device, the thread count, its run (the pid of the run's Snakemake
    process: a worker ends with its run, so two runs never share one) and, for a
    GPU slice, what its environment must hold (`env`:
    `multigeom_workflow.compute.gpus.Slot.environment`, ``CUDA_VISIBLE_DEVICES`` of
    the slice alone, so that its device ``cuda:0`` is the slice).
    """
    spec = {
        "kind": kind,
        "slot_id": str(slot_id),
        "device": device,
        "threads": int(threads),
        "run": str(run_id),
    }
    if env:
        spec["env"] = {str(k): str(v) for k, v in env.items()}
    return spec


def worker_socket(spec: dict) -> Path:
    """The socket of the worker for `spec` (`slot_spec`), in its run's folder."""
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    name = slot_file_name(spec["kind"], spec["slot_id"])
    path = run_dir(spec["run"]) / f"{name}-{key}.sock"
    if len(str(path)) > 100:  # the limit of a Unix socket's path is about 107 bytes
        folder = Path("/tmp") / f"mgw-{os.getuid()}-run-{spec['run']}"
        folder.mkdir(exist_ok=True)
        path = folder / f"{key}.sock"
    return path


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


def _read_line(sock: socket.socket) -> bytes:
    """One line from `sock` (without buffering past it), b"" if it closed first."""
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)


def request_estimate(
    spec: dict,
    request: EstimateRequest,
    *,
    log: Path,
    idle_s: float = IDLE_S,
) -> dict:
    """
    Hand one image to the worker of `spec`, starting it if there is none, and wait for
    its answer.

    Parameters
    ----------
    spec : dict
        The worker, from `slot_spec`; the caller holds its slot.
    request : EstimateRequest
    log : Path
        The worker's log, if it has to be started.
    idle_s : float
        Seconds a new worker waits for work before it ends.

    Returns
    -------
    dict
        The worker's answer: ``{"ok": True, "seconds": ...}``.

    Raises
    ------
    ContextLost
        If the worker's CUDA context failed (`cuda_context_lost`): it has ended, and
        the next request starts a fresh one.
    RuntimeError
        If the worker cannot start, dies during the request, or the estimate failed;
        the message holds the end of the worker's log.
    """
    path = worker_socket(spec)
    sock = _connect(path)
    if sock is None:
        path.unlink(missing_ok=True)  # a worker that died left its socket
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "multigeom_workflow.compute.workers"]
        cmd += ["--socket", str(path), "--spec", json.dumps(spec)]
        cmd += ["--idle-s", str(idle_s)]
        with open(log, "a") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **spec.get("env", {})},  # a GPU slice: it alone
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
            time.sleep(0.01)
            sock = _connect(path)
    with sock:
        sock.sendall(request.to_json().encode() + b"\n")
        answer = _read_line(sock)
    if not answer:
        raise RuntimeError(
            f"the estimator worker died during the request; {log}:\n{_tail(log)}"
        )
    reply = json.loads(answer)
    if reply.get("context_lost"):
        raise ContextLost(
            f"the estimator worker's CUDA context failed: {reply.get('error')}"
        )
    if not reply.get("ok"):
        raise RuntimeError(f"the estimator worker failed: {reply.get('error')}")
    return reply


def _stop_when_client_goes(
    conn: socket.socket, done: threading.Event, request, socket_path: Path, t0: float
):
    """
    Wait until the job's connection closes; unless the answer is being sent (`done`),
    the job is gone: log one line, remove the unfinished file's temporary folder, and
    end this worker at once (the slot's compute lock goes with the process).
    """
    try:
        conn.recv(1, socket.MSG_PEEK)  # the job sends nothing more: this is its end
    except OSError:
        pass
    if done.is_set():
        return
    out = Path(request.out)
    for tmp in out.parent.glob(f".{out.stem}.*"):
        try:
            if tmp.is_dir() and tmp.stat().st_mtime >= t0 - 1:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass
    socket_path.unlink(missing_ok=True)
    print(
        f"worker stops: the job asking for {out.name} ({request.encoder_name}/"
        f"{request.area}) is gone (killed); nothing written",
        flush=True,
    )
    record(what="stopped", out=request.out, end=time.time())
    os._exit(0)


def serve(path: Path, spec: dict, idle_s: float = IDLE_S) -> None:
    """
    The worker of slot `spec`: import torch and set up the device once, then answer
    requests on the Unix socket `path`, loading a configuration's models the first
    time they are asked for (keeping the `MAX_MODELS` most recently used), until its
    run's Snakemake process ends or `idle_s` seconds pass without a request.
    """
    from collections import OrderedDict

    hook = estimator_hook()  # a test's or benchmark's stand-in, else None
    if hook is None:
        import torch

        from .estimate import estimate_request, load_models

        torch.set_num_threads(spec["threads"])
    print(f"worker started on {spec['device']} (pid {os.getpid()})", flush=True)
    cache: OrderedDict[str, object] = OrderedDict()

    def models_for(request: EstimateRequest):
        key = request.model_key()
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        while len(cache) >= MAX_MODELS:
            cache.popitem(last=False)
            if spec["device"].startswith("cuda"):
                torch.cuda.empty_cache()
        t0 = time.monotonic()
        cache[key] = load_models(
            request.encoder_ckpt,
            request.diffusion_ckpt,
            request.diffusion,
            spec["device"],
        )
        print(
            f"models loaded: {request.encoder_ckpt} and {request.diffusion_ckpt} on "
            f"{spec['device']} in {time.monotonic() - t0:.1f} s",
            flush=True,
        )
        return cache[key]

    def compute(request: EstimateRequest):
        with compute_lock(spec["kind"], spec["slot_id"], spec["run"]):
            if hook is not None:
                hook.estimate(request, f"{spec['kind']}{spec['slot_id']}")
            else:
                estimate_request(models_for(request), request)

    watch_pid = int(spec["run"])
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(0.5)
    last = time.monotonic()
    lost = None  # the error that broke this process's CUDA context
    try:
        while lost is None and _alive(watch_pid) and time.monotonic() - last < idle_s:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            with conn:
                line = _read_line(conn)
                if not line:  # the job went before asking
                    continue
                request = EstimateRequest.from_json(line)
                done = threading.Event()
                t = time.monotonic()
                threading.Thread(
                    target=_stop_when_client_goes,
                    args=(conn, done, request, path, time.time()),
                    daemon=True,
                ).start()
                try:
                    compute(request)
                    reply = {"ok": True, "seconds": time.monotonic() - t}
                except Exception as err:  # reported to the job, which fails
                    reply = {"ok": False, "error": f"{type(err).__name__}: {err}"}
                    if cuda_context_lost(err):
                        # no later image in this process: the next request finds no
                        # socket and starts a fresh worker (a new CUDA context)
                        lost = reply["error"].splitlines()[0]
                        reply["context_lost"] = True
                        server.close()
                        path.unlink(missing_ok=True)
                done.set()
                print(f"{request.out}: {reply}", flush=True)
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                    conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher
                except OSError:
                    print(f"the job asking for {request.out} is gone", flush=True)
            last = time.monotonic()
    finally:
        server.close()
        if lost is None:  # else unlinked already: the path may be a fresh worker's
            path.unlink(missing_ok=True)
        if lost is not None:
            why = f"its CUDA context failed ({lost}); a fresh worker serves next"
        elif not _alive(watch_pid):
            why = "the run ended"
        else:
            why = f"idle {idle_s:g} s"
        print(f"worker ends: {why}", flush=True)


def clean_after_killed_runs(per_image_dirs) -> list[Path]:
    """
    What runs that were killed (SIGKILL) left behind, removed at the start of a run:
    the folders of ended runs (CPU share locks, workers' sockets;
    `multigeom_workflow.compute.gpus.clean_ended_runs`) and the temporary folders of
    unfinished per-image files (``.img0005.xxxx/`` beside ``img0005.pt``) in
    `per_image_dirs`. Called only once the run holds its working directory (Snakemake's
    lock), so no other run is writing there.

    Returns
    -------
    list of Path
        What was removed.
    """
    removed = clean_ended_runs()
    for folder in per_image_dirs:
        for tmp in Path(folder).glob(".img*.*"):
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
    return removed


def main(argv=None) -> None:
    """Entry point of a worker process (started by `request_estimate`)."""
    p = argparse.ArgumentParser()
    p.add_argument("--socket", type=Path, required=True)
    p.add_argument("--spec", required=True)
    p.add_argument("--idle-s", type=float, default=IDLE_S)
    args = p.parse_args(argv)
    serve(args.socket, json.loads(args.spec), args.idle_s)


if __name__ == "__main__":
    main()
