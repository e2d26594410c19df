"""
The embedded demo: everything the workflow needs, made offline and deterministically
from seeds, in upstream's run layout.

* Training crops: random square crops of `DEMO_TRAIN_PHOTOS` (never a test photograph),
  converted with upstream's canonical transform.
* Two synthetic areas of 50 neurons with a known ground truth, upstream's
  `multigeom.datasets.GaborTeacher`: ``complex`` (complex cells) and ``simple`` (simple
  cells), each with its own receptive fields; noisy responses to the crops.
* Two encoders per area, fitted with upstream's `NeuralEncoder.fit_readout`: ``onoff``
  (upstream's ON-OFF reference encoder, plenoptic's pretrained front end) and
  ``smallcnn`` (upstream's `SmallCNNBackbone` with seeded random weights, frozen).
* One conditional diffusion model per configuration, trained with upstream's
  `multigeom.diffusion.train.train_diffusion` on the crops and the encoder's responses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .files import atomic_path
from .test_images import DEMO_TRAIN_PHOTOS, package_photo

__all__ = [
    "TEACHERS",
    "build_demo_encoder",
    "cut_training_crops",
    "export_photo",
    "fit_demo_encoder",
    "simulate_area",
    "train_demo_diffusion",
]

#: Keyword arguments of upstream's `GaborTeacher` per demo area (its seed is added).
TEACHERS = {
    "complex": {"n_neurons": 50, "complex_fraction": 1.0, "seed_offset": 0},
    "simple": {"n_neurons": 50, "complex_fraction": 0.0, "seed_offset": 1},
}


def export_photo(source: Path, out: str | Path) -> None:
    """
    Write a photograph as a lossless PNG (same pixels, same mode), atomically.
    """
    with Image.open(source) as img, atomic_path(out) as tmp:
        img.save(tmp, format="PNG")


def cut_training_crops(n_crops: int, seed: int) -> torch.Tensor:
    """
    Random square crops of the demo's training photographs, as canonical images.

    Each crop picks a photograph, a side between 64 pixels and the photograph's shorter
    side, a position and a horizontal flip from ``numpy.random.default_rng(seed)``, and
    is converted with upstream's `CANONICAL_TRANSFORM`.

    Returns
    -------
    torch.Tensor
        Of shape (n_crops, 1, 64, 64), pixels in [-1, 1].
    """
    from multigeom.datasets import CANONICAL_TRANSFORM

    rng = np.random.default_rng(seed)
    photos = []
    for package, name in DEMO_TRAIN_PHOTOS:
        with Image.open(package_photo(package, name)) as img:
            photos.append(img.convert("RGB"))
    crops = torch.empty(n_crops, 1, 64, 64)
    for i in range(n_crops):
        img = photos[rng.integers(len(photos))]
        w, h = img.size
        side = int(rng.integers(min(64, w, h), min(w, h) + 1))
        left = int(rng.integers(0, w - side + 1))
        top = int(rng.integers(0, h - side + 1))
        crop = img.crop((left, top, left + side, top + side))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        crops[i] = CANONICAL_TRANSFORM(crop)
    return crops


def simulate_area(
    area: str, crops: torch.Tensor, seed: int, noise_sigma: float
) -> dict:
    """
    A synthetic area: upstream's `GaborTeacher`, calibrated on the crops (responses of
    unit standard deviation), and its responses to them.

    Parameters
    ----------
    area : {"complex", "simple"}
    crops : torch.Tensor
        Of shape (N, 1, 64, 64), pixels in [-1, 1].
    seed : int
        Seed of the receptive fields (the area's offset is added) and of the noise.
    noise_sigma : float
        Standard deviation of the trial-to-trial noise added to the clean responses.

    Returns
    -------
    dict
        ``teacher_kwargs``, ``teacher_state`` (to rebuild the ground truth), ``clean``
        and ``noisy`` responses of shape (N, 50), ``noise_sigma``.
    """
    from multigeom.datasets import GaborTeacher, make_synthetic_neural_data

    spec = dict(TEACHERS[area])
    kwargs = {
        "n_neurons": spec["n_neurons"],
        "complex_fraction": spec["complex_fraction"],
        "seed": seed + spec["seed_offset"],
    }
    teacher = GaborTeacher(**kwargs).calibrate(crops)
    noisy, clean = make_synthetic_neural_data(
        teacher, crops, noise_sigma=noise_sigma, seed=seed + 1000
    )
    return {
        "area": area,
        "teacher_kwargs": kwargs,
        "teacher_state": teacher.state_dict(),
        "clean": clean,
        "noisy": noisy,
        "noise_sigma": noise_sigma,
    }


def build_demo_encoder(name: str, seed: int, n_neurons: int = 50):
    """
    A fresh demo encoder (readout not fitted yet).

    ``onoff`` is upstream's `OnOffEncoder` (plenoptic's pretrained ON-OFF front end,
    no download); ``smallcnn`` is a `NeuralEncoder` around upstream's `SmallCNNBackbone`
    whose weights are drawn from ``torch.manual_seed(seed)``.

    Raises
    ------
    ValueError
        For another name.
    """
    from multigeom.encoders import NeuralEncoder, OnOffEncoder, SmallCNNBackbone

    torch.manual_seed(seed)
    if name == "onoff":
        return OnOffEncoder(n_neurons=n_neurons)
    if name == "smallcnn":
        return NeuralEncoder(SmallCNNBackbone(), n_neurons=n_neurons)
    raise ValueError(f"unknown demo encoder {name!r}; allowed: onoff, smallcnn")


def fit_demo_encoder(
    name: str,
    area: dict,
    crops: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    seed: int,
    out: str | Path,
) -> dict:
    """
    Fit a demo encoder's readout to an area's noisy responses with upstream's
    `NeuralEncoder.fit_readout` and save it with `NeuralEncoder.save` (atomically).

    Returns
    -------
    dict
        The metadata saved with it: area, best validation correlation, and the mean
        correlation with the area's clean (ground-truth) responses on the crops.
    """
    from multigeom.encoders.fitting import correlation_per_neuron

    encoder = build_demo_encoder(name, seed)
    report = encoder.fit_readout(crops, area["noisy"], epochs=epochs, lr=lr, seed=seed)
    truth_corr = float(
        correlation_per_neuron(encoder.predict(crops), area["clean"]).mean()
    )
    metadata = {
        "area": area["area"],
        "encoder_name": name,
        "val_corr": float(report.best_val_corr),
        "ground_truth_corr": truth_corr,
    }
    with atomic_path(out) as tmp:
        encoder.save(tmp, **metadata)
    return metadata


def train_demo_diffusion(
    diffusion_settings: dict,
    encoder_ckpt: str | Path,
    crops: torch.Tensor,
    out: str | Path,
    *,
    encoder_name: str,
    area: str,
    device: str = "cpu",
) -> dict:
    """
    Train the conditional diffusion model of a demo configuration with upstream's
    `train_diffusion`, on the crops and the encoder's predicted responses.

    Training runs in ``<out folder>/training`` (upstream's ``last.pt`` there lets an
    interrupted run resume); ``final_model.pt`` and ``train_log.json`` are moved to
    `out`'s folder only once the last epoch is done, so a killed job never leaves a
    checkpoint that looks finished.

    Returns
    -------
    dict
        Upstream's loss history, ``{"epoch": [...], "loss": [...]}``.
    """
    from multigeom.diffusion.train import train_diffusion
    from multigeom.encoders import load_encoder

    from .scenario import to_namespace

    out = Path(out)
    work = out.parent / "training"
    encoder = load_encoder(str(encoder_ckpt), device="cpu")
    responses = encoder.predict(crops)
    history = train_diffusion(
        to_namespace(diffusion_settings),
        crops,
        responses,
        work,
        device=torch.device(device),
        num_workers=0,
        save_every=10**9,
        resume=True,
        metadata={"encoder_name": encoder_name, "area": area},
        progress=False,
    )
    (work / "train_log.json").replace(out.parent / "train_log.json")
    (work / "final_model.pt").replace(out)
    shutil.rmtree(work, ignore_errors=True)
    return history
