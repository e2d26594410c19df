"""
The embedded demo: everything the workflow needs, made offline and deterministically
from seeds, in upstream's run layout.

* Training crops: random square crops of `DEMO_TRAIN_PHOTOS` (never a test photograph),
  converted with upstream's canonical transform.
* Two synthetic areas of 50 neurons with a known ground truth, upstream's
  `multigeom.datasets.GaborTeacher`: ``complex`` (complex cells) and ``simple`` (simple
  cells), each with its own receptive fields; noisy responses to the crops.
* Encoders, each fitted to one area on the crops: ``smallcnn`` (upstream's
  `SmallCNNBackbone` and Gaussian readout) and ``widecnn`` (a wider `SmallCNNBackbone`
  and upstream's factorized readout), their backbones first trained end to end on the
  area's noisy responses, then frozen and the readout fitted with upstream's
  `NeuralEncoder.fit_readout`; and ``onoff`` (upstream's ON-OFF reference encoder,
  plenoptic's pretrained front end, readout only), which cannot predict Gabor cells
  (kept for the tests' reduced demo and as the example of an uninformative encoder).
* Checks that surface in the run's output: `encoder_warnings` (an encoder too poor to
  inform the estimator) and `conditioning_sensitivity` (does a diffusion model's
  prediction depend on the responses at all).
* The ground truth of each area: `area_fisher`, the Fisher information of its
  `GaborTeacher`, per test image.
* One conditional diffusion model per configuration, trained with upstream's
  `multigeom.diffusion.train.train_diffusion` on the crops and the encoder's responses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..files import atomic_path
from .images import DEMO_TRAIN_PHOTOS, package_photo

__all__ = [
    "TEACHERS",
    "area_fisher",
    "build_demo_encoder",
    "conditioning_sensitivity",
    "encoder_warnings",
    "load_teacher",
    "cut_training_crops",
    "export_photo",
    "fit_demo_encoder",
    "simulate_area",
    "train_demo_diffusion",
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


def build_demo_encoder(name: str, seed: int, n_neurons: int = 50):
    """
    A fresh demo encoder (readout not fitted yet).

    ``onoff`` is upstream's `OnOffEncoder` (plenoptic's pretrained ON-OFF front end,
    no download); ``smallcnn`` a `NeuralEncoder` around upstream's `SmallCNNBackbone`
    (channels 16, 32, 32) with the Gaussian readout; ``widecnn`` one around a wider
    `SmallCNNBackbone` (channels 32, 32, 32) with the factorized readout. Weights are
    drawn from ``torch.manual_seed(seed)``.

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
    if name == "widecnn":
        return NeuralEncoder(
            SmallCNNBackbone((32, 32, 32)), n_neurons=n_neurons, readout="factorized"
        )
    raise ValueError(
        f"unknown demo encoder {name!r}; allowed: onoff, smallcnn, widecnn"
    )


def train_backbone(
    encoder, crops: torch.Tensor, responses: torch.Tensor, *, epochs: int, lr: float
) -> None:
    """
    Train a demo encoder end to end (backbone and readout) on an area's responses:
    Adam with a one-cycle schedule of peak `lr`, mean squared error, batches of 64
    in an order drawn from torch's global generator (seed it first). `fit_readout`
    then freezes the backbone and fits the readout again, as for a pretrained one.

    Parameters
    ----------
    encoder : multigeom.encoders.NeuralEncoder
        With a trainable backbone (``smallcnn``, ``widecnn``).
    crops : torch.Tensor
        Of shape (n, 1, 64, 64), pixels in [-1, 1].
    responses : torch.Tensor
        Of shape (n, n_neurons), the noisy responses.
    epochs : int
        Passes over the crops; 0 leaves the encoder as it is.
    """
    if epochs < 1:
        return
    batch = 64
    steps = epochs * ((len(crops) + batch - 1) // batch)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=lr, total_steps=steps
    )
    encoder.train()
    for _ in range(epochs):
        order = torch.randperm(len(crops))
        for i in range(0, len(crops), batch):
            idx = order[i : i + batch]
            loss = torch.nn.functional.mse_loss(encoder(crops[idx]), responses[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    encoder.eval()


def fit_demo_encoder(
    name: str,
    area: dict,
    crops: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    seed: int,
    out: str | Path,
    backbone_epochs: int = 0,
    backbone_lr: float = 3e-3,
    val_fraction: float = 0.1,
    test_images: torch.Tensor | None = None,
) -> dict:
    """
    Fit a demo encoder to an area and save it with `NeuralEncoder.save` (atomically).

    The last `val_fraction` of the crops are held out; on the others, a trainable
    backbone (``smallcnn``, ``widecnn``) is first trained end to end for
    `backbone_epochs` (`train_backbone`), then upstream's `NeuralEncoder.fit_readout`
    freezes it and fits the readout to the noisy responses.

    Returns
    -------
    dict
        The metadata saved with it: ``area``, ``encoder_name``, ``val_corr``
        (upstream's best validation correlation with the noisy responses),
        ``val_corr_clean`` (mean over neurons of the correlation with the area's
        noiseless responses on the held-out crops), ``ground_truth_corr`` (the same on
        the crops fitted), ``response_std`` (mean over neurons of the standard
        deviation of the predicted responses across `test_images`, or across the
        held-out crops without them) and ``noise_sigma``.
    """
    from multigeom.encoders.fitting import correlation_per_neuron

    n_val = max(2, int(round(val_fraction * len(crops))))
    fit, held = slice(0, len(crops) - n_val), slice(len(crops) - n_val, None)
    encoder = build_demo_encoder(name, seed)
    if name != "onoff":
        train_backbone(
            encoder,
            crops[fit],
            area["noisy"][fit],
            epochs=backbone_epochs,
            lr=backbone_lr,
        )
    report = encoder.fit_readout(
        crops[fit], area["noisy"][fit], epochs=epochs, lr=lr, seed=seed
    )
    scored = test_images if test_images is not None else crops[held]
    metadata = {
        "area": area["area"],
        "encoder_name": name,
        "val_corr": float(report.best_val_corr),
        "val_corr_clean": float(
            np.nanmean(
                correlation_per_neuron(
                    encoder.predict(crops[held]), area["clean"][held]
                )
            )
        ),
        "ground_truth_corr": float(
            np.nanmean(
                correlation_per_neuron(encoder.predict(crops[fit]), area["clean"][fit])
            )
        ),
        "response_std": float(encoder.predict(scored).std(dim=0).mean()),
        "noise_sigma": float(area["noise_sigma"]),
    }
    with atomic_path(out) as tmp:
        encoder.save(tmp, **metadata)
    return metadata


def encoder_warnings(
    label: str, metadata: dict, min_corr: float, figures: str
) -> list[str]:
    """
    One warning line for an encoder too poor to inform the estimator, or none.

    An encoder informs G(x) only if its responses vary across images well above the
    observation noise and follow the area: the line is given when ``val_corr_clean`` is
    below `min_corr` or ``response_std`` below ``noise_sigma`` (keys of the metadata
    `fit_demo_encoder` saves; a missing key is not checked).

    Parameters
    ----------
    label : str
        The configuration, ``"<encoder>/<area>"``.
    metadata : dict
        The encoder's fit report.
    min_corr : float
        The least validation correlation with the area's noiseless responses.
    figures : str
        The figures whose lines of this configuration say little, named in the line.

    Returns
    -------
    list of str
        Zero or one line.
    """
    problems = []
    corr, std = metadata.get("val_corr_clean"), metadata.get("response_std")
    sigma = metadata.get("noise_sigma")
    if corr is not None and not corr >= min_corr:
        problems.append(
            f"validation correlation {corr:.3f} with the area's noiseless responses "
            f"< {min_corr} (demo.min_val_corr)"
        )
    if std is not None and sigma is not None and not std >= sigma:
        problems.append(
            f"response std {std:.3f} on the test images < sigma = {sigma} "
            "(demo.noise_sigma)"
        )
    if not problems:
        return []
    return [
        f"warning: encoder {label}: {' and '.join(problems)}: too low to inform the "
        f"estimator; this configuration's lines in {figures} say little about it"
    ]


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

    from ..settings.files import to_namespace

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


@torch.no_grad()
def conditioning_sensitivity(
    encoder,
    unet,
    alphas_cumprod: torch.Tensor,
    images: torch.Tensor,
    timesteps: list[int],
    sigma: float,
    seed: int = 0,
) -> dict:
    """
    How much a conditional diffusion model's prediction depends on the responses.

    For each timestep t and image x: x_t = sqrt(abar_t) x + sqrt(1 - abar_t) z and
    r1, r2 = f(x) + sigma xi (two draws, as the pair of Algorithm 1, Azeglio et al.
    2026); ``pair`` is the mean over images of
    ||eps(x_t, t, r1) - eps(x_t, t, r2)|| / ||eps(x_t, t, r1)||, and ``other_image``
    the same with r2 drawn around the responses to another image (a cyclic shift of
    the batch). A model that ignores its conditioning gives 0 for both.

    Parameters
    ----------
    encoder : torch.nn.Module
        f: images (B, 1, 64, 64) -> responses (B, N).
    unet : torch.nn.Module
        eps_theta(x_t, t, r).
    alphas_cumprod : torch.Tensor
        Of shape (T,), the schedule.
    images : torch.Tensor
        Of shape (B, 1, 64, 64), pixels in [-1, 1], B >= 2.
    timesteps : list of int
        The estimator's timesteps.
    sigma : float
        The observation noise.
    seed : int
        Seeds z and xi.

    Returns
    -------
    dict
        ``timesteps``, ``pair`` and ``other_image`` (one value per timestep), and their
        means ``pair_mean``, ``other_image_mean``.
    """
    encoder.eval()
    unet.eval()
    gen = torch.Generator().manual_seed(seed)
    mu = encoder(images)
    pair, other = [], []
    for t in timesteps:
        abar = alphas_cumprod[t].cpu()
        z = torch.randn(images.shape, generator=gen)
        x_t = abar.sqrt() * images + (1 - abar).sqrt() * z
        t_batch = torch.full((len(images),), int(t), dtype=torch.long)
        r1, r2, r3 = (mu + sigma * torch.randn(mu.shape, generator=gen) for _ in "123")
        eps1 = unet(x_t, t_batch, r1).flatten(1)
        eps2 = unet(x_t, t_batch, r2).flatten(1)
        eps3 = unet(x_t, t_batch, r3.roll(1, dims=0)).flatten(1)
        norm = eps1.norm(dim=1)
        pair.append(float(((eps1 - eps2).norm(dim=1) / norm).mean()))
        other.append(float(((eps1 - eps3).norm(dim=1) / norm).mean()))
    return {
        "timesteps": [int(t) for t in timesteps],
        "pair": pair,
        "other_image": other,
        "pair_mean": float(np.mean(pair)),
        "other_image_mean": float(np.mean(other)),
    }


def load_teacher(area: dict):
    """The `GaborTeacher` of a demo area (as `simulate_area` returns it), rebuilt."""
    from multigeom.datasets import GaborTeacher

    teacher = GaborTeacher(**area["teacher_kwargs"])
    teacher.load_state_dict(area["teacher_state"])
    return teacher.eval()


def area_fisher(area: dict, image: torch.Tensor, top_k: int) -> dict:
    """
    The ground truth of a demo area at one image: the Fisher information
    J_area(x) = sigma^-2 J_f^T J_f of its `GaborTeacher` f (J_f the N x P Jacobian),
    by upstream's `multigeom.geometry.fisher.fisher_eigendecomposition`.

    Parameters
    ----------
    area : dict
        A demo area, as `simulate_area` returns it (its ``noise_sigma`` is sigma).
    image : torch.Tensor
        Of shape (1, 1, 64, 64), pixels in [-1, 1].
    top_k : int
        Eigenpairs kept.

    Returns
    -------
    dict
        ``area``, ``J_eigenvalues`` of shape (top_k,), in decreasing order, and
        ``J_eigenvectors`` of shape (top_k, 4096), orthonormal rows, ``sigma``.
    """
    from multigeom.geometry.fisher import fisher_eigendecomposition

    sigma = float(area["noise_sigma"])
    out = fisher_eigendecomposition(
        image, load_teacher(area), sigma=sigma, top_k=top_k, device=torch.device("cpu")
    )
    return {
        "area": area["area"],
        "J_eigenvalues": out.eigenvalues.detach().cpu(),
        "J_eigenvectors": out.eigenvectors.detach().cpu(),
        "sigma": sigma,
    }
