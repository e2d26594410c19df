"""
The demo's data, made offline and deterministically from seeds: the photographs as
lossless PNGs, random training crops of `DEMO_TRAIN_PHOTOS` (never a test photograph)
converted with upstream's canonical transform, and two synthetic areas of 50 neurons
with a known ground truth (upstream's `multigeom.datasets.GaborTeacher`): ``complex``
(complex cells) and ``simple`` (simple cells), each with its own receptive fields, and
their noisy responses to the crops.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ...atomic import atomic_path
from ..images import DEMO_TRAIN_PHOTOS, package_photo

__all__ = [
    "TEACHERS",
    "cut_training_crops",
    "export_photo",
    "load_teacher",
    "simulate_area",
]


#: Keyword arguments of upstream's `GaborTeacher` per demo area (its seed is added).
#: The simple cells have 1.5 to 4 cycles per image (upstream's default: 3 to 8): a
#: phase-sensitive cell of finer grating is out of reach of a small CNN fitted on a few
#: hundred crops (validation correlation 0.35 instead of 0.46 in our trials).
TEACHERS = {
    "complex": {"n_neurons": 50, "complex_fraction": 1.0, "seed_offset": 0},
    "simple": {
        "n_neurons": 50,
        "complex_fraction": 0.0,
        "seed_offset": 1,
        "cycles_range": (1.5, 4.0),
    },
}


def export_photo(source: Path, out: str | Path) -> None:
    """Write a photograph as a lossless PNG (same pixels, same mode), atomically."""
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
    if "cycles_range" in spec:
        kwargs["cycles_range"] = spec["cycles_range"]
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


def load_teacher(area: dict):
    """The `GaborTeacher` of a demo area (as `simulate_area` returns it), rebuilt."""
    from multigeom.datasets import GaborTeacher

    teacher = GaborTeacher(**area["teacher_kwargs"])
    teacher.load_state_dict(area["teacher_state"])
    return teacher.eval()
