"""
The demo's checks that surface in the run's output: `encoder_warnings` (an encoder too
poor to inform the estimator) and `conditioning_sensitivity` (does a diffusion model's
prediction depend on the responses at all), and `write_conditioning_reports`, the
latter's files for every demo configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    import torch

__all__ = [
    "conditioning_sensitivity",
    "encoder_warnings",
    "test_image_correlation",
    "write_conditioning_reports",
]


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
    import torch  # here: encoder_warnings is read at parse time, without torch

    encoder.eval()
    unet.eval()
    with torch.no_grad():
        return _sensitivity(
            encoder, unet, alphas_cumprod, images, timesteps, sigma, seed
        )


def _sensitivity(encoder, unet, alphas_cumprod, images, timesteps, sigma, seed):
    """`conditioning_sensitivity`'s computation, gradients off."""
    import torch

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


def test_image_correlation(encoder, area: dict, images: torch.Tensor) -> float:
    """
    How well an encoder predicts its area on the test images: the mean over neurons of
    the Pearson correlation, across `images`, between the encoder's responses and the
    area's noiseless ones (its `GaborTeacher`; upstream's
    `multigeom.encoders.fitting.correlation_per_neuron`, which gives 0 for a neuron
    constant on the images).

    Parameters
    ----------
    encoder : multigeom.encoders.NeuralEncoder
        f: images (B, 1, 64, 64) -> responses (B, N), with ``predict``.
    area : dict
        A demo area, as `multigeom_workflow.inputs.demo.data.simulate_area` returns it.
    images : torch.Tensor
        Of shape (B, 1, 64, 64), pixels in [-1, 1], B >= 2 (the demo: its 16 test
        photographs).

    Returns
    -------
    float
        In [-1, 1].
    """
    import torch
    from multigeom.encoders.fitting import correlation_per_neuron

    from .data import load_teacher

    with torch.no_grad():
        clean = load_teacher(area)(images)
    return float(np.mean(correlation_per_neuron(encoder.predict(images), clean)))


def write_conditioning_reports(
    configurations: Sequence[Sequence[str]],
    encoder_files: Sequence[str | Path],
    diffusion_files: Sequence[str | Path],
    out_files: Sequence[str | Path],
    images: torch.Tensor,
    diffusion: dict,
    timesteps: list[int],
    sigma: float,
    *,
    load_models: Callable,
    per_configuration: Sequence[dict] | None = None,
) -> list[dict]:
    """
    The conditioning check of every demo configuration's diffusion model (rule
    check_conditioning): `conditioning_sensitivity` of configuration i, its models
    loaded from ``encoder_files[i]`` and ``diffusion_files[i]`` on the CPU by
    `load_models`, written as
    JSON with its ``encoder`` and ``area`` to ``out_files[i]``, each file whole or not
    at all.

    One process for all of them: a check takes a few seconds, starting a process and
    importing torch and upstream's models as many. Each check draws from a generator
    of its own (`conditioning_sensitivity`'s seed, 0), so it is the same whichever
    checks share the process.

    Parameters
    ----------
    configurations : sequence of (str, str)
        The (encoder, area) of each check.
    encoder_files, diffusion_files : sequence of str or Path
        Each configuration's encoder and diffusion checkpoints.
    out_files : sequence of str or Path
        Where each configuration's report goes.
    images : torch.Tensor
        Of shape (B, 1, 64, 64), pixels in [-1, 1]: the held-out crops.
    diffusion : dict
        The diffusion settings (the model's architecture and schedule).
    timesteps : list of int
        The estimator's timesteps.
    sigma : float
        The observation noise.
    load_models : callable
        ``load_models(encoder_file, diffusion_file, diffusion, device)`` returning the
        models (``encoder``, ``unet``, ``alphas_cumprod``): the per-image job's own,
        `multigeom_workflow.compute.estimate.load_models`, passed by the rule's script
        (inputs sit below compute in the package's layers).
    per_configuration : sequence of dict, optional
        Where configurations have settings of their own (config keys
        ``configs[i].estimator``, ``.diffusion``, ``.sigma``): for configuration i,
        its ``diffusion``, ``timesteps`` and ``sigma``, replacing the three above.

    Returns
    -------
    list of dict
        The reports, in the order of `configurations`.

    Raises
    ------
    ValueError
        When the four sequences (five, with `per_configuration`) differ in length.
    """
    import json

    from ...atomic import atomic_path

    if per_configuration is None:
        shared = {"diffusion": diffusion, "timesteps": timesteps, "sigma": sigma}
        per_configuration = [shared] * len(configurations)
    lengths = {
        len(x)
        for x in (configurations, encoder_files, diffusion_files, per_configuration)
    }
    if lengths != {len(out_files)}:
        raise ValueError(
            f"{len(configurations)} configurations, {len(encoder_files)} encoders, "
            f"{len(diffusion_files)} diffusion models and {len(out_files)} reports"
        )
    results = []
    for (encoder, area), encoder_file, diffusion_file, out, own in zip(
        configurations,
        encoder_files,
        diffusion_files,
        out_files,
        per_configuration,
        strict=True,
    ):
        models = load_models(encoder_file, diffusion_file, own["diffusion"], "cpu")
        result = conditioning_sensitivity(
            models.encoder,
            models.unet,
            models.alphas_cumprod,
            images,
            list(own["timesteps"]),
            float(own["sigma"]),
        )
        result |= {"encoder": encoder, "area": area}
        with atomic_path(out) as tmp:
            with open(tmp, "w") as f:
                json.dump(result, f, indent=1)
        results.append(result)
    return results
