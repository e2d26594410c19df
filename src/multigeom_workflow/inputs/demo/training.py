"""
The demo's models, trained on the crops of `multigeom_workflow.inputs.demo.data`, in
upstream's run layout.

* Encoders, each fitted to one area on the crops: ``smallcnn`` (upstream's
  `SmallCNNBackbone` and Gaussian readout) and ``widecnn`` (a wider `SmallCNNBackbone`
  and upstream's factorized readout), their backbones first trained end to end on the
  area's noisy responses, then frozen and the readout fitted with upstream's
  `NeuralEncoder.fit_readout`; and ``onoff`` (upstream's ON-OFF reference encoder,
  plenoptic's pretrained front end, readout only), which cannot predict Gabor cells
  (kept for the tests' reduced demo and as the example of an uninformative encoder).
* One conditional diffusion model per configuration, trained with upstream's
  `multigeom.diffusion.train.train_diffusion` on the crops and the encoder's responses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from ...atomic import atomic_path

__all__ = [
    "build_demo_encoder",
    "fit_demo_encoder",
    "train_backbone",
    "train_demo_diffusion",
]


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
    encoder,
    crops: torch.Tensor,
    responses: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int = 64,
    readout_lr: float | None = None,
) -> None:
    """
    Train a demo encoder end to end (backbone and readout) on an area's responses:
    Adam with a one-cycle schedule of peak `lr` for the backbone and `readout_lr` for
    the readout, mean squared error, batches of `batch_size` in an order drawn from
    torch's global generator (seed it first). The readout needs the larger rate: its
    spatial weights start flat (upstream's `FactorizedReadout` softmax logits near 0)
    and must grow by orders of magnitude to pick a neuron's receptive field; at the
    backbone's rate, widecnn/simple reached a correlation of 0.45 on the test images
    in 8 epochs, at ten times it 0.78 (benchmarks/demo_encoder_settings.py,
    docs/measurements.md). `fit_readout`
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
    lr : float
        The backbone's peak learning rate.
    batch_size : int
        Crops per step.
    readout_lr : float, optional
        The readout's peak learning rate; by default `lr`.
    """
    if epochs < 1:
        return
    readout_lr = lr if readout_lr is None else readout_lr
    steps = epochs * ((len(crops) + batch_size - 1) // batch_size)
    readout = list(encoder.readout.parameters())
    in_readout = {id(p) for p in readout}
    backbone = [p for p in encoder.parameters() if id(p) not in in_readout]
    optimizer = torch.optim.Adam(
        [{"params": backbone, "lr": lr}, {"params": readout, "lr": readout_lr}]
    )
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=[lr, readout_lr], total_steps=steps
    )
    encoder.train()
    for _ in range(epochs):
        order = torch.randperm(len(crops))
        for i in range(0, len(crops), batch_size):
            idx = order[i : i + batch_size]
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
    backbone_batch_size: int = 64,
    backbone_readout_lr: float | None = None,
    val_fraction: float = 0.1,
    test_images: torch.Tensor | None = None,
) -> dict:
    """
    Fit a demo encoder to an area and save it with `NeuralEncoder.save` (atomically).

    The last `val_fraction` of the crops are held out; on the others, a trainable
    backbone (``smallcnn``, ``widecnn``) is first trained end to end for
    `backbone_epochs` in batches of `backbone_batch_size`, the readout at peak rate
    `backbone_readout_lr` (`train_backbone`), then upstream's
    `NeuralEncoder.fit_readout` freezes it and fits the readout to the noisy responses.

    Returns
    -------
    dict
        The metadata saved with it: ``area``, ``encoder_name``, ``val_corr``
        (upstream's best validation correlation with the noisy responses),
        ``val_corr_clean`` (mean over neurons of the correlation with the area's
        noiseless responses on the held-out crops), ``ground_truth_corr`` (the same on
        the crops fitted), ``test_corr_clean`` (the same on `test_images`, when given:
        `multigeom_workflow.inputs.demo.diagnostics.test_image_correlation`),
        ``response_std`` (mean over neurons of the standard
        deviation of the predicted responses across `test_images`, or across the
        held-out crops without them) and ``noise_sigma``.
    """
    from multigeom.encoders.fitting import correlation_per_neuron

    from .diagnostics import test_image_correlation

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
            batch_size=backbone_batch_size,
            readout_lr=backbone_readout_lr,
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
        **(
            {"test_corr_clean": test_image_correlation(encoder, area, test_images)}
            if test_images is not None
            else {}
        ),
        "noise_sigma": float(area["noise_sigma"]),
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

    from ...settings.files import to_namespace

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
