"""
The per-image estimation of G(x) and J(x), by one of two engines.

`load_models` loads a configuration's encoder and diffusion model the way upstream's
`multigeom.pipeline.per_image.main` does; `estimate_to_file` computes one image's G(x)
(Algorithm 1, seeded with ``seed + i``) and J(x) and writes the per-image file with
upstream's keys: with engine ``upstream`` by handing the image to upstream's
`multigeom.pipeline.per_image.estimate_images`, with engine ``fast`` by
`multigeom_workflow.compute.engine` (same estimator and draws, large batches). It writes
into a temporary folder beside the target, and the file is renamed into place only when
complete. Either engine runs in the arithmetic that ``precision`` names (IEEE float32,
or PyTorch's GPU defaults for tf32: `multigeom_workflow.compute.arithmetic`); the
provenance records the engine, the precision and the switches in force (and the fast
engine's rows per UNet call and eigen-step).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import write_error_line
from ..inputs.images import load_test_image
from ..settings.files import to_namespace
from ..settings.names import ENGINES
from .arithmetic import arithmetic_flags, check_precision, precision_context
from .engine import cpu_threads, estimate_image_fast
from .request import EstimateRequest

__all__ = [
    "Models",
    "device_provenance",
    "estimate_request",
    "estimate_to_file",
    "load_models",
]


@dataclass
class Models:
    """
    A configuration's models, on their device.

    Attributes
    ----------
    encoder : torch.nn.Module
        f(x): images (B, 1, 64, 64) in [-1, 1] -> responses (B, N).
    unet : torch.nn.Module
        The conditional diffusion model eps_theta(x_t, t, r).
    alphas_cumprod : torch.Tensor
        Of shape (T,), the DDPM schedule of the diffusion model.
    diffusion_epoch : int or None
        The training epoch of the diffusion checkpoint.
    device : torch.device
    """

    encoder: torch.nn.Module
    unet: torch.nn.Module
    alphas_cumprod: torch.Tensor
    diffusion_epoch: int | None
    device: torch.device


def load_models(
    encoder_ckpt: str | Path, diffusion_ckpt: str | Path, diffusion: dict, device: str
) -> Models:
    """
    Load a fitted encoder (upstream's `multigeom.encoders.load_encoder`: the paper's
    checkpoints and those of `NeuralEncoder.save`) and its diffusion model (upstream's
    `build_diffusion_model` and `build_scheduler` from the `diffusion` settings).
    """
    from multigeom.diffusion.model import build_diffusion_model, build_scheduler
    from multigeom.encoders import load_encoder

    device = torch.device(device)
    encoder = load_encoder(str(encoder_ckpt), device=device)
    encoder.eval()
    cfg = to_namespace(diffusion)
    unet = build_diffusion_model(cfg).to(device)
    ckpt = torch.load(diffusion_ckpt, map_location=device, weights_only=False)
    unet.load_state_dict(ckpt["model_state_dict"])
    unet.eval()
    alphas_cumprod = build_scheduler(cfg).alphas_cumprod.to(device)
    return Models(encoder, unet, alphas_cumprod, ckpt.get("epoch"), device)


def encoder_architecture(encoder: torch.nn.Module) -> str:
    """
    What upstream built `encoder` from, by upstream's name
    (`multigeom_workflow.settings.names.ARCHITECTURES`): a reference encoder's
    (`multigeom.encoders.reference.REFERENCE_ENCODERS`: inception, resnet50, onoff)
    or the registered name of a `NeuralEncoder`'s backbone (small_cnn); ``""`` for
    anything else.
    """
    from multigeom.encoders import NeuralEncoder
    from multigeom.encoders.reference import REFERENCE_ENCODERS

    for name, cls in REFERENCE_ENCODERS.items():
        if type(encoder) is cls:
            return name
    if isinstance(encoder, NeuralEncoder):
        return str(getattr(type(encoder.backbone), "_registry_name", ""))
    return ""


def check_architecture(models: Models, request: EstimateRequest) -> str:
    """
    The architecture of the request's loaded encoder (`encoder_architecture`), which
    must be the one its configuration names (config key ``configs[i].architecture``;
    ``request.architecture``, not checked when empty).

    Raises
    ------
    ValueError
        One line naming the checkpoint, the configuration, both architectures and
        what to change.
    """
    built = encoder_architecture(models.encoder)
    if request.architecture and built != request.architecture:
        label = f"{request.encoder_name}/{request.area}"
        raise ValueError(
            f"encoder checkpoint {request.encoder_ckpt!r} of {label} holds a "
            f"{built or type(models.encoder).__name__!r} encoder, but its "
            f"configuration's architecture (config key 'configs[...].architecture') "
            f"is {request.architecture!r}: correct the key or the checkpoint path"
        )
    return built


def device_provenance(device: str | torch.device) -> dict:
    """
    What the workflow adds to a per-image file's provenance: ``device`` (``"cpu"``,
    ``"cuda:0"``) and ``device_name`` (the GPU's name, or the processor's), which the
    estimate of `snakemake -n` uses to measure seconds per image on each kind.
    """
    import platform

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {"device": str(device), "device_name": name}


def estimate_to_file(
    models: Models,
    image_file: str | Path,
    index: int,
    out: str | Path,
    estimator: dict,
    *,
    encoder_name: str,
    area: str,
    provenance_record: dict | None = None,
    engine: str = "upstream",
    precision: str = "fp32",
) -> Path:
    """
    Estimate G(x) and J(x) of test image `index` and write upstream's per-image file.

    Parameters
    ----------
    models : Models
    image_file : str or Path
        The test image; read with `load_test_image` (64 x 64, pixels in [-1, 1]).
    index : int
        Its index in the test set: the Monte-Carlo draws are seeded with
        ``estimator["seed"] + index``.
    out : str or Path
        The per-image file, ``.../img{index:04d}.pt``.
    estimator : dict
        Upstream's estimator settings (``multigeom/configs/estimator.yaml`` layout).
    encoder_name, area : str
        Written into the file.
    provenance_record : dict, optional
        The file's provenance, to which ``engine``, ``precision`` and ``arithmetic``
        (`multigeom_workflow.compute.arithmetic.arithmetic_flags`, read while the
        estimator ran) are added, and with engine fast ``fast_engine`` (rows per UNet
        call, out-of-memory retries, the eigen-step's route and the seconds of each
        step).
    engine : str
        ``upstream`` or ``fast`` (`multigeom_workflow.compute.engine`).
    precision : str
        ``fp32`` or ``tf32`` (`multigeom_workflow.settings.names.PRECISIONS`), for
        either engine; tf32 needs a CUDA device.

    Returns
    -------
    Path
        `out`, holding upstream's keys (img_idx, image, encoder_name, area,
        G_eigenvalues [k], G_eigenvectors [k, 4096], J_eigenvalues, J_eigenvectors,
        estimator, sigma, elapsed_seconds, diffusion_epoch, provenance).

    Raises
    ------
    ValueError
        If `engine` or `precision` is not allowed (on this device).
    """
    from multigeom.pipeline.per_image import estimate_images

    if engine not in ENGINES:
        raise ValueError(
            f"config key 'engine' = {engine!r}: allowed: {', '.join(ENGINES)}"
        )
    check_precision(precision, models.device)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image = load_test_image(image_file)
    record = {**(provenance_record or {}), "engine": engine, "precision": precision}
    with (
        tempfile.TemporaryDirectory(prefix=f".{out.stem}.", dir=out.parent) as tmp,
        _write_errors_named(out),
        precision_context(precision, models.device),
    ):
        record["arithmetic"] = arithmetic_flags()
        if engine == "fast":
            written = _estimate_fast(
                models,
                image,
                index,
                Path(tmp),
                to_namespace(estimator),
                encoder_name=encoder_name,
                area=area,
                provenance_record=record,
                precision=precision,
            )
            Path(written).replace(out)
            return out
        (written,) = estimate_images(
            models.encoder,
            models.unet,
            models.alphas_cumprod,
            {index: image},
            [index],
            to_namespace(estimator),
            tmp,
            encoder_name=encoder_name,
            area=area,
            device=models.device,
            diffusion_epoch=models.diffusion_epoch,
            provenance_record=record,
            desc=f"{encoder_name}/{area} img{index:04d}",
        )
        Path(written).replace(out)
    return out


@contextlib.contextmanager
def _write_errors_named(out: Path):
    """A full disk or a read-only folder while writing `out`: one line naming it."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        line = write_error_line(err, out)
        if line is None:
            raise
        raise OSError(line) from err


def _estimate_fast(
    models: Models,
    image: torch.Tensor,
    index: int,
    out_dir: Path,
    cfg,
    *,
    encoder_name: str,
    area: str,
    provenance_record: dict,
    precision: str,
) -> Path:
    """
    The fast engine's `estimate_images` for one image: the same file (keys, dtypes,
    shapes, ``elapsed_seconds`` the time of G(x) and J(x)) in `out_dir`.
    """
    x = image.unsqueeze(0)  # [1, 1, 64, 64] in [-1, 1]
    stats = {}
    t0 = time.time()
    g_out, j_out = estimate_image_fast(
        x,
        models.encoder,
        models.unet,
        models.alphas_cumprod,
        cfg,
        seed=int(cfg.seed) + index,
        device=models.device,
        precision=precision,
        stats=stats,
    )
    g_values, g_vectors = g_out.eigenvalues.cpu(), g_out.eigenvectors.cpu()
    elapsed = time.time() - t0
    provenance_record = provenance_record | {"fast_engine": stats}
    path = out_dir / f"img{index:04d}.pt"
    torch.save(
        {
            "img_idx": index,
            "image": x.cpu(),
            "encoder_name": encoder_name,
            "area": area,
            "G_eigenvalues": g_values,
            "G_eigenvectors": g_vectors,
            "J_eigenvalues": j_out.eigenvalues.cpu() if j_out is not None else None,
            "J_eigenvectors": j_out.eigenvectors.cpu() if j_out is not None else None,
            "estimator": "conditional_pair",
            "sigma": float(cfg.monte_carlo.observation_noise_sigma),
            "elapsed_seconds": elapsed,
            "diffusion_epoch": models.diffusion_epoch,
            "provenance": provenance_record,
        },
        path,
    )
    return path


def estimate_request(models: Models, request: EstimateRequest) -> Path:
    """
    `estimate_to_file` for one request of a per-image job, the same whether a warm
    worker, the job itself or a Modal container computes it.

    Parameters
    ----------
    models : Models
        The request's configuration, loaded (`load_models`).
    request : EstimateRequest
        The image, its index, the target, the estimator settings, and
        ``settings_files``, ``seed`` for upstream's provenance record, to which
        `device_provenance` and the encoder's ``architecture`` (`check_architecture`)
        are added.
        ``engine`` and ``precision`` choose the implementation; on a GPU, torch's
        CPU-side work gets this process's share of the cores
        (`multigeom_workflow.compute.engine.cpu_threads`).

    Returns
    -------
    Path
        The per-image file.
    """
    from multigeom.utils import provenance

    architecture = check_architecture(models, request)
    record = provenance(request.settings_files, seed=request.seed)
    record |= device_provenance(models.device) | {"architecture": architecture}
    with cpu_threads(models.device):
        return estimate_to_file(
            models,
            request.image,
            request.index,
            request.out,
            request.estimator,
            encoder_name=request.encoder_name,
            area=request.area,
            provenance_record=record,
            engine=request.engine,
            precision=request.precision,
        )
