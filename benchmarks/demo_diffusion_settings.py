"""
Which demo diffusion-training settings make G(x) depend on the responses, and at what
CPU cost: for one demo configuration, fits the encoder as the workflow does, then for
each variant of config/diffusion_demo.yaml trains upstream's diffusion model on one
thread and prints its CPU seconds, the conditioning metric of rule check_conditioning
(``demo.conditioning_sensitivity`` on the last 16 crops), and, with ``--estimate``,
the seconds per image of the fast estimator and A_10 between two Monte-Carlo seeds of
the same image (the noise ceiling) for a few sample counts.

Usage: python benchmarks/demo_diffusion_settings.py [--encoder E] [--area A]
    [--variant 'train.epochs=4;train.lr=3e-3' ...] [--estimate 16,32]
A variant is semicolon-separated ``dotted.key=YAML value`` overrides of the demo file.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from demo_g_settings import _a_k, _override  # one copy of each, this folder's

REPO = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--encoder", default="smallcnn")
    p.add_argument("--area", default="complex")
    p.add_argument("--crops", type=int, default=1024)
    p.add_argument("--backbone-epochs", type=int, default=8)
    p.add_argument("--variant", action="append", default=None, help="k=v;k=v")
    p.add_argument("--estimate", default="", help="sample counts, e.g. 16,32")
    p.add_argument("--images", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    from multigeom_workflow.compute.engine import estimate_image_fast
    from multigeom_workflow.compute.estimate import load_models, to_namespace
    from multigeom_workflow.inputs.demo.data import cut_training_crops, simulate_area
    from multigeom_workflow.inputs.demo.diagnostics import conditioning_sensitivity
    from multigeom_workflow.inputs.demo.training import (
        fit_demo_encoder,
        train_demo_diffusion,
    )
    from multigeom_workflow.inputs.images import DEMO_TEST_PHOTOS, package_photo
    from multigeom_workflow.settings.files import timestep_grid

    demo = yaml.safe_load((REPO / "config/config.yaml").read_text())["demo"]
    base = yaml.safe_load((REPO / "config/diffusion_demo.yaml").read_text())
    estimator = yaml.safe_load((REPO / "config/estimator_demo.yaml").read_text())
    from multigeom.datasets import CANONICAL_TRANSFORM
    from PIL import Image

    tests = []
    for package, name in DEMO_TEST_PHOTOS[: args.images]:
        with Image.open(package_photo(package, name)) as img:
            tests.append(CANONICAL_TRANSFORM(img.convert("RGB")))
    tests = torch.stack(tests)

    work = Path(tempfile.mkdtemp(prefix="diffusion-settings-"))
    t0 = time.process_time()
    crops = cut_training_crops(args.crops, demo["seed"])
    area = simulate_area(args.area, crops, demo["seed"], demo["noise_sigma"])
    fit = fit_demo_encoder(
        args.encoder,
        area,
        crops,
        epochs=demo["readout_epochs"],
        lr=demo["readout_lr"],
        seed=demo["seed"],
        out=work / "encoder.pt",
        backbone_epochs=args.backbone_epochs,
        backbone_lr=demo["backbone_lr"],
        backbone_batch_size=demo["backbone_batch_size"],
        backbone_readout_lr=demo["backbone_readout_lr"],
    )
    print(
        f"encoder {args.encoder}/{args.area}: corr {fit['val_corr_clean']:.3f} "
        f"std {fit['response_std']:.3f}, {time.process_time() - t0:.0f} CPU s",
        flush=True,
    )
    timesteps = list(timestep_grid(estimator))
    for variant in args.variant or [""]:
        settings = _override(base, variant)
        out = work / "final_model.pt"
        t0 = time.process_time()
        history = train_demo_diffusion(
            settings,
            work / "encoder.pt",
            crops,
            out,
            encoder_name=args.encoder,
            area=args.area,
        )
        cpu = time.process_time() - t0
        models = load_models(work / "encoder.pt", out, settings, "cpu")
        cond = conditioning_sensitivity(
            models.encoder,
            models.unet,
            models.alphas_cumprod,
            crops[-16:],
            timesteps,
            estimator["monte_carlo"]["observation_noise_sigma"],
        )
        n_params = sum(p.numel() for p in models.unet.parameters()) / 1e6
        print(
            f"[{variant or 'as is'}] {n_params:.2f}M params, train {cpu:.0f} CPU s, "
            f"loss {history['loss'][-1]:.4f}, eps pair {cond['pair_mean']:.2e} "
            f"other {cond['other_image_mean']:.2e} "
            f"(per t: {', '.join(f'{v:.1e}' for v in cond['other_image'])})",
            flush=True,
        )
        for n in filter(None, args.estimate.split(",")):
            est = copy.deepcopy(estimator)
            est["monte_carlo"]["n_samples"] = int(n)
            est["monte_carlo"]["batch_size"] = 16 if int(n) % 16 == 0 else int(n)
            cfg = to_namespace(est)
            seconds, ceiling = [], []
            for i, x in enumerate(tests):
                vecs = []
                for seed in (42 + i, 42 + 10**6 + i):
                    t1 = time.process_time()
                    g, _ = estimate_image_fast(
                        x.unsqueeze(0),
                        models.encoder,
                        models.unet,
                        models.alphas_cumprod,
                        cfg,
                        seed=seed,
                        device=torch.device("cpu"),
                    )
                    seconds.append(time.process_time() - t1)
                    vecs.append(g.eigenvectors)
                ceiling.append(_a_k(*vecs, 10))
            print(
                f"    n_samples {n}: {np.median(seconds):.2f} CPU s per image "
                f"(G and J), ceiling A_10 {np.mean(ceiling):.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
