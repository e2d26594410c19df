"""
A stand-in estimator for tests and benchmarks of the orchestration only: it sleeps a
fixed time instead of computing, so that 8 or 16 simulated GPUs (fake ids in
``CUDA_VISIBLE_DEVICES``) can run on two cores.

It is selected by the environment variables ``MULTIGEOM_ESTIMATOR_HOOK`` (this module's
name: `multigeom_workflow.compute.hook`) and ``MULTIGEOM_STANDIN_S`` (seconds per
image) that a test or benchmark sets (`simulated_scenario` gives both), never by a
configuration key; the production path does not import it. With
``MULTIGEOM_STANDIN_RECORD`` set to a file, every computation appends a JSON line
``{"what": "compute", "slot": ..., "pid": ..., "out": ..., "start": ..., "end": ...}``
(``time.time()`` seconds; ``"end": null`` when it starts), ``{"what": "stopped",
"pid": ..., "end": ...}`` when a worker whose job went stops, and every per-image job
``{"what": "job", ...}``, so that a test can check that no two processes computed on
one slot at once.

The per-image file it writes holds the request's identity as JSON (not upstream's
keys): equal requests give byte-equal files. It is written like the real one, in a
temporary folder beside the target, renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from ..settings.layout import RunLayout
from .hook import HOOK_ENV
from .request import EstimateRequest

__all__ = [
    "CUDA_FAULT_ENV",
    "CUDA_FAULT_TEXT",
    "RECORD_ENV",
    "STANDIN_ENV",
    "estimate",
    "estimate_standin",
    "write_test_images",
    "record",
    "simulated_configurations",
    "simulated_scenario",
    "simulated_targets",
    "standin_seconds",
]

STANDIN_ENV = "MULTIGEOM_STANDIN_S"
RECORD_ENV = "MULTIGEOM_STANDIN_RECORD"
#: ``<slot>:<times>`` (``gpu0:1``): the stand-in raises the error PyTorch raises for a
#: broken CUDA context on that slot, the first `times` computations asked of it in
#: the run (counted in ``<record file>.faults``; needs `RECORD_ENV`).
CUDA_FAULT_ENV = "MULTIGEOM_STANDIN_CUDA_FAULT"
#: What PyTorch (2.8, ``c10_cuda_check_implementation``) raises after an illegal
#: memory access: ``torch.AcceleratorError`` with this text; the context is unusable.
CUDA_FAULT_TEXT = (
    "CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so "
    "the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def standin_seconds() -> float | None:
    """The stand-in's seconds per image, or None when the real estimator runs."""
    value = os.environ.get(STANDIN_ENV)
    return float(value) if value else None


def record(**entry) -> None:
    """Append one JSON line to the file ``MULTIGEOM_STANDIN_RECORD`` names, if set."""
    path = os.environ.get(RECORD_ENV)
    if path:
        line = json.dumps({"pid": os.getpid(), **entry}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: lines never mix
        finally:
            os.close(fd)


def estimate(request: EstimateRequest, slot: str) -> Path:
    """
    The hook's estimate (`multigeom_workflow.compute.hook`): `estimate_standin` with
    ``MULTIGEOM_STANDIN_S`` seconds (0 when unset), or the error of a broken CUDA
    context where `CUDA_FAULT_ENV` asks for one.

    Raises
    ------
    torch.AcceleratorError
        `CUDA_FAULT_TEXT`, as PyTorch raises it (a RuntimeError where torch is not
        installed).
    """
    _maybe_cuda_fault(slot)
    return estimate_standin(request, standin_seconds() or 0.0, slot)


def _maybe_cuda_fault(slot: str) -> None:
    where, _, times = os.environ.get(CUDA_FAULT_ENV, "").partition(":")
    record_file = os.environ.get(RECORD_ENV)
    if not where or where != slot or not record_file:
        return
    count = Path(f"{record_file}.faults")
    with open(count, "a+") as f:  # one worker per slot at a time: no race
        f.seek(0)
        done = f.read().split().count(slot)
        if done >= int(times or 1):
            return
        f.write(f"{slot}\n")
    try:
        from torch import AcceleratorError as error
    except ImportError:
        error = RuntimeError
    raise error(CUDA_FAULT_TEXT)


def estimate_standin(request: EstimateRequest, seconds: float, slot: str) -> Path:
    """
    Sleep `seconds` as if estimating `request` on `slot`, then write its per-image file.

    Returns
    -------
    Path
        ``request.out``.
    """
    out = Path(request.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    record(what="compute", slot=slot, out=request.out, start=start, end=None)
    with tempfile.TemporaryDirectory(prefix=f".{out.stem}.", dir=out.parent) as tmp:
        time.sleep(seconds)
        part = Path(tmp) / out.name
        identity = {
            "image": Path(request.image).name,
            "index": request.index,
            "encoder_name": request.encoder_name,
            "area": request.area,
            "seed": request.estimator.get("seed"),
            "engine": request.engine,
            "precision": request.precision,
        }
        part.write_text(json.dumps(identity, sort_keys=True) + "\n")
        part.replace(out)
    record(what="compute", slot=slot, out=request.out, start=start, end=time.time())
    return out


def simulated_scenario(root: Path, n_configs: int, n_images: int) -> tuple[Path, dict]:
    """
    A scenario for the stand-in in folder `root`: `n_configs` configurations
    (`simulated_configurations`) with empty checkpoint
    files, `n_images` empty test image files, ``device: cuda``, and torchvision's
    weight files (empty) in a private ``TORCH_HOME``. Nothing reads them: the stand-in
    does not compute. Returns the configuration file (written there) and the
    environment variables to run it with (``TORCH_HOME``, and
    ``MULTIGEOM_ESTIMATOR_HOOK`` naming this module).

    Run it with ``CUDA_VISIBLE_DEVICES`` set to fake ids and ``MULTIGEOM_STANDIN_S``
    set, targets `simulated_targets`.
    """
    import yaml

    root = Path(root)
    weights = root / "torch" / "hub" / "checkpoints"
    weights.mkdir(parents=True, exist_ok=True)
    for name in ("inception_v3_google-0cc3c7bd.pth", "resnet50-11ad3fa6.pth"):
        (weights / name).touch()
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    write_test_images(images, n_images)
    configs = []
    for encoder, area in simulated_configurations(n_configs):
        ckpts = {}
        for kind in ("encoder", "diffusion"):
            path = root / "ckpt" / f"{kind}-{encoder}-{area}.pt"
            path.parent.mkdir(exist_ok=True)
            path.touch()
            ckpts[f"{kind}_ckpt"] = str(path)
        configs.append({"encoder": encoder, "area": area, **ckpts})
    config = {
        "configs": configs,
        "n_images": n_images,
        "device": "cuda",
        "test_images": {"source": "folder", "path": str(images)},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, {"TORCH_HOME": str(root / "torch"), HOOK_ENV: __name__}


def write_test_images(folder: Path, n: int) -> None:
    """
    `n` readable 64 x 64 grayscale PNG test images ``im00000.png`` ... in `folder`
    (one written, the others hard links to it): the configuration check opens every
    test image of a run.
    """
    from PIL import Image

    first = folder / "im00000.png"
    Image.new("L", (64, 64), 128).save(first)
    for i in range(1, n):
        other = folder / f"im{i:05d}.png"
        if not other.exists():
            os.link(first, other)


def simulated_configurations(n_configs: int) -> list[tuple[str, str]]:
    """(encoder, area) of `simulated_scenario` (at most 4): the paper's four."""
    return [(e, a) for a in ("V1", "V4") for e in ("inception", "resnet50")][:n_configs]


def simulated_targets(n_configs: int, n_images: int) -> list[str]:
    """The per-image files of `simulated_scenario` (default runs folder)."""
    layout = RunLayout()
    return [
        layout.per_image_file(encoder, area, i)
        for encoder, area in simulated_configurations(n_configs)
        for i in range(n_images)
    ]
