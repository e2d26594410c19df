"""
Which demo settings make G(x) measured rather than Monte-Carlo noise, and at what CPU
cost: for one demo configuration, fits the encoder as the workflow does, trains one
diffusion model per variant of config/diffusion_demo.yaml (upstream's
`train_diffusion`, through `inputs.demo.training.train_demo_diffusion`), then, per
variant of config/estimator_demo.yaml, estimates G(x) and J(x) of the first test
photographs twice with independent seeds (the workflow's fast engine,
`compute.engine.estimate_image_fast`) and prints one table row: CPU seconds
(user + system, this process's threads) of training and per estimate, the
conditioning ratio of rule check_conditioning (``demo.conditioning_sensitivity`` on the
last 16 crops: same image / other image), the noise ceiling A_10 of G (its two
estimates of an image), and A_10 of G and of J with the area's ground truth
(``demo.truth.area_fisher``), means over the images (± s.e.m.).

Usage: nice -n 19 python benchmarks/demo_g_settings.py [--encoder E] [--area A]
    [--variant 'train.epochs=4;train.lr=3e-3' ...]
    [--estimator 'monte_carlo.n_samples=64' ...] [--images 2] [--threads 2]
    [--workdir DIR] [--ideal 128,512] [--seeds 42,7,2625503274]
A variant is semicolon-separated ``dotted.key=YAML value`` overrides of the file; with
--workdir, a model trained there before for the same variant is reused (its training
seconds read back). With --seeds, each variant is trained once per training seed
(``train.seed``, after the variant's own keys) and, after the rows, one line per
variant and estimator variant gives the lowest, median and highest ceiling and G vs
truth over the seeds: how reliably a setting trains (docs/measurements.md: the
ceiling of one setting ranged from 0.19 to 0.44 over six seeds). --ideal prints,
instead, the ceiling an ideal model would give at those row counts: rows of D drawn
as J_f^T g (J_f the area's own Jacobian at the image, g standard normal), two
independent draws per image, as if the diffusion model had learnt the area exactly
and x_hat were x.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def _override(settings: dict, variant: str) -> dict:
    out = copy.deepcopy(settings)
    for item in filter(None, variant.split(";")):
        key, value = item.split("=", 1)
        *parents, leaf = key.strip().split(".")
        node = out
        for p in parents:
            node = node[p]
        value = yaml.safe_load(value)
        try:  # YAML reads 1e-2 as text (it wants 1.0e-2)
            value = float(value) if isinstance(value, str) else value
        except ValueError:
            pass
        node[leaf] = value
    return out


def _a_k(u: torch.Tensor, v: torch.Tensor, k: int = 10) -> float:
    return float(((u[:k] @ v[:k].T) ** 2).sum()) / k


def _ms(values) -> str:
    v = np.asarray(values, dtype=float)
    sem = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
    return f"{v.mean():.3f} ± {sem:.3f}"


def _ideal(area: dict, tests: torch.Tensor, rows: list[int]) -> None:
    from multigeom_workflow.inputs.demo.data import load_teacher

    teacher = load_teacher(area)
    gen = torch.Generator().manual_seed(0)
    for n in rows:
        ceiling = []
        for x in tests:
            jac = torch.autograd.functional.jacobian(
                lambda v: teacher(v)[0], x.unsqueeze(0)
            ).reshape(teacher(x.unsqueeze(0)).shape[1], -1)
            vecs = [
                torch.linalg.svd(
                    torch.randn(n, jac.shape[0], generator=gen) @ jac,
                    full_matrices=False,
                )[2]
                for _ in "ab"
            ]
            ceiling.append(_a_k(*vecs))
        print(f"ideal model, {area['area']}, {n} rows: ceiling A_10 {_ms(ceiling)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--encoder", default="widecnn")
    p.add_argument("--area", default="simple")
    p.add_argument("--variant", action="append", default=None, help="k=v;k=v")
    p.add_argument("--estimator", action="append", default=None, help="k=v;k=v")
    p.add_argument("--images", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None)
    p.add_argument("--ideal", default="", help="row counts, e.g. 128,512")
    p.add_argument("--seeds", default="", help="training seeds, e.g. 42,7")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    torch.set_num_threads(args.threads)

    from multigeom.datasets import CANONICAL_TRANSFORM
    from PIL import Image

    from multigeom_workflow.compute.engine import estimate_image_fast
    from multigeom_workflow.compute.estimate import load_models, to_namespace
    from multigeom_workflow.inputs.demo.data import cut_training_crops, simulate_area
    from multigeom_workflow.inputs.demo.diagnostics import conditioning_sensitivity
    from multigeom_workflow.inputs.demo.training import (
        fit_demo_encoder,
        train_demo_diffusion,
    )
    from multigeom_workflow.inputs.demo.truth import area_fisher
    from multigeom_workflow.inputs.images import DEMO_TEST_PHOTOS, package_photo
    from multigeom_workflow.settings.files import timestep_grid

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    demo = config["demo"]
    base = yaml.safe_load((REPO / "config/diffusion_demo.yaml").read_text())
    estimator = yaml.safe_load((REPO / "config/estimator_demo.yaml").read_text())
    tests = []
    for package, name in DEMO_TEST_PHOTOS[: args.images]:
        with Image.open(package_photo(package, name)) as img:
            tests.append(CANONICAL_TRANSFORM(img.convert("RGB")))
    tests = torch.stack(tests)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="g-settings-"))
    work.mkdir(parents=True, exist_ok=True)
    crops = cut_training_crops(demo["n_train_crops"], demo["seed"])
    area = simulate_area(args.area, crops, demo["seed"], demo["noise_sigma"])
    if args.ideal:
        return _ideal(area, tests, [int(n) for n in args.ideal.split(",")])
    truth = [area_fisher(area, x.unsqueeze(0), 10)["J_eigenvectors"] for x in tests]
    enc_ckpt = work / f"encoder-{args.encoder}-{args.area}.pt"
    if not enc_ckpt.exists():
        t0 = time.process_time()
        fit = fit_demo_encoder(
            args.encoder,
            area,
            crops,
            epochs=demo["readout_epochs"],
            lr=demo["readout_lr"],
            seed=demo["seed"],
            out=enc_ckpt,
            backbone_epochs=demo["backbone_epochs"],
            backbone_lr=demo["backbone_lr"],
            backbone_batch_size=demo["backbone_batch_size"],
            backbone_readout_lr=demo["backbone_readout_lr"],
        )
        print(
            f"encoder {args.encoder}/{args.area}: corr {fit['val_corr_clean']:.3f}, "
            f"{time.process_time() - t0:.0f} CPU s",
            flush=True,
        )
    timesteps = list(timestep_grid(estimator))
    print(
        "| diffusion variant | estimator variant | UNet params | train CPU s | "
        "CPU s per estimate | ‖Δε‖/‖ε‖ same / other image | G ceiling A₁₀ | "
        "G vs truth | J vs truth |",
        "|---|---|---|---|---|---|---|---|---|",
        sep="\n",
        flush=True,
    )
    spread = {}  # (variant, estimator variant) -> [(ceiling, G vs truth)], one per seed
    runs = [
        (
            named_variant,
            f"{named_variant};train.seed={seed}" if seeds else named_variant,
        )
        for named_variant in args.variant or [""]
        for seed in seeds or [None]
    ]
    for named_variant, variant in runs:
        settings = _override(base, variant)
        named = f"{args.encoder}/{args.area}/{json.dumps(settings, sort_keys=True)}"
        key = hashlib.sha256(named.encode()).hexdigest()[:12]
        out = work / key / "final_model.pt"
        done = work / key / "train_cpu.json"
        if done.exists():
            train_cpu = json.loads(done.read_text())["cpu_seconds"]
        else:
            t0 = time.process_time()
            train_demo_diffusion(
                settings,
                enc_ckpt,
                crops,
                out,
                encoder_name=args.encoder,
                area=args.area,
            )
            train_cpu = time.process_time() - t0
            done.write_text(json.dumps({"cpu_seconds": train_cpu, "variant": variant}))
        models = load_models(enc_ckpt, out, settings, "cpu")
        cond = conditioning_sensitivity(
            models.encoder,
            models.unet,
            models.alphas_cumprod,
            crops[-16:],
            timesteps,
            estimator["monte_carlo"]["observation_noise_sigma"],
        )
        n_params = sum(p.numel() for p in models.unet.parameters()) / 1e6
        for est_variant in args.estimator or [""]:
            cfg = to_namespace(_override(estimator, est_variant))
            seconds, ceiling, g_truth, j_truth = [], [], [], []
            for i, x in enumerate(tests):
                vecs = []
                for seed in (42 + i, 42 + 10**6 + i):
                    t1 = time.process_time()
                    g, j = estimate_image_fast(
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
                    g_truth.append(_a_k(g.eigenvectors, truth[i]))
                ceiling.append(_a_k(*vecs))
                j_truth.append(_a_k(j.eigenvectors, truth[i]))
            spread.setdefault((named_variant, est_variant), []).append(
                (float(np.mean(ceiling)), float(np.mean(g_truth)))
            )
            print(
                f"| {variant or 'as is'} | {est_variant or 'as is'} | "
                f"{n_params:.2f}M | {train_cpu:.0f} | {np.median(seconds):.1f} | "
                f"{cond['pair_mean']:.1e} / {cond['other_image_mean']:.1e} | "
                f"{_ms(ceiling)} | {_ms(g_truth)} | {_ms(j_truth)} |",
                flush=True,
            )
    if seeds:
        print(
            f"\nOver the training seeds {seeds} (lowest / median / highest):",
            "| diffusion variant | estimator variant | G ceiling A₁₀ | G vs truth |",
            "|---|---|---|---|",
            sep="\n",
        )
        for (variant, est_variant), values in spread.items():
            ceil, g_truth = np.array(values).T
            print(
                f"| {variant or 'as is'} | {est_variant or 'as is'} | "
                f"{ceil.min():.3f} / {np.median(ceil):.3f} / {ceil.max():.3f} | "
                f"{g_truth.min():.3f} / {np.median(g_truth):.3f} / "
                f"{g_truth.max():.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
