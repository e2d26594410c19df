"""
The per-image estimation of G(x) and J(x), through upstream's own code.

`load_models` loads a configuration's encoder and diffusion model the way upstream's
`multigeom.pipeline.per_image.main` does; `estimate_to_file` hands one image to
upstream's `multigeom.pipeline.per_image.estimate_images`, which computes G(x)
(Algorithm 1, seeded with ``seed + i``) and J(x) and writes the per-image file with
upstream's keys. It writes into a temporary folder beside the target, and the file is
renamed into place only when complete.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .request import EstimateRequest
from .scenario import to_namespace
from .test_images import load_test_image

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

    Returns
    -------
    Path
        `out`, holding upstream's keys (img_idx, image, encoder_name, area,
        G_eigenvalues [k], G_eigenvectors [k, 4096], J_eigenvalues, J_eigenvectors,
        estimator, sigma, elapsed_seconds, diffusion_epoch, provenance).
    """
    from multigeom.pipeline.per_image import estimate_images

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image = load_test_image(image_file)
    with tempfile.TemporaryDirectory(prefix=f".{out.stem}.", dir=out.parent) as tmp:
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
            provenance_record=provenance_record,
            desc=f"{encoder_name}/{area} img{index:04d}",
        )
        Path(written).replace(out)
    return out


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
        `device_provenance` is added.

    Returns
    -------
    Path
        The per-image file.
    """
    from multigeom.utils import provenance

    record = provenance(request.settings_files, seed=request.seed)
    return estimate_to_file(
        models,
        request.image,
        request.index,
        request.out,
        request.estimator,
        encoder_name=request.encoder_name,
        area=request.area,
        provenance_record=record | device_provenance(models.device),
    )
