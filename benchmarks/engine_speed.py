"""
Seconds per image of the two engines, upstream and fast, run side by side in one
process on the same models, image and seed (and how closely they agree).

CPU (default): the demo UNet (config/diffusion_demo.yaml, random weights: the time does
not depend on them) with the demo's estimator settings and with the paper's, 1 and 2
threads; the paper-size UNet (upstream's packaged "diffusion", 68M parameters) on the
paper's grid with fewer samples; the eigen-step alone (upstream's thin SVD of a
4800 x 4096 D against the fast engine's float64 Gram eigendecomposition).

CUDA (--device cuda): the paper-size UNet, random weights, the paper's settings:
upstream once, then fast in fp32, tf32 and bf16, with the ratios and the agreement with
upstream (max relative eigenvalue error, min A_k over k). About 3 minutes on an H200.

Usage:
    python benchmarks/engine_speed.py [--cases demo paper paper-unet eigen]
        [--threads 1 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def settings(name: str, **monte_carlo) -> object:
    from multigeom_workflow.settings.files import resolve_settings_file, to_namespace

    est = yaml.safe_load(resolve_settings_file(name, "estimator", REPO).read_text())
    est["monte_carlo"].update(monte_carlo)
    est.setdefault("fisher_baseline", {"enabled": True, "top_k": 50})
    return to_namespace(est)


def models(diffusion: str, device: torch.device):
    """A random-weight encoder (small CNN + Gaussian readout, 50 neurons) and UNet."""
    from multigeom.diffusion.model import build_diffusion_model, build_scheduler
    from multigeom.encoders.backbones import SmallCNNBackbone
    from multigeom.encoders.neural import NeuralEncoder

    from multigeom_workflow.settings.files import resolve_settings_file, to_namespace

    torch.manual_seed(0)
    cfg = to_namespace(
        yaml.safe_load(resolve_settings_file(diffusion, "diffusion", REPO).read_text())
    )
    unet = build_diffusion_model(cfg).to(device).eval()
    encoder = NeuralEncoder(SmallCNNBackbone(), n_neurons=50).to(device).eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    ac = build_scheduler(cfg).alphas_cumprod.to(device)
    return encoder, unet, ac


def image(device):
    g = torch.Generator().manual_seed(1)
    return (torch.rand(1, 1, 64, 64, generator=g) * 2 - 1).to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(engine, x, encoder, unet, ac, cfg, device, precision="fp32"):
    """(G output, J output, seconds) of one image by `engine`."""
    from multigeom.pipeline.per_image import estimate_image

    from multigeom_workflow.compute.engine import estimate_image_fast

    sync(device)
    t0 = time.perf_counter()
    if engine == "upstream":
        g, j = estimate_image(x, encoder, unet, ac, cfg, seed=42, device=device)
    else:
        g, j = estimate_image_fast(
            x, encoder, unet, ac, cfg, seed=42, device=device, precision=precision
        )
    values = g.eigenvalues.cpu()
    sync(device)
    return g, j, time.perf_counter() - t0, values


def agreement(g_a, g_b) -> tuple[float, float]:
    """(max relative eigenvalue error, min over k of A_k) of two G outputs."""
    va, vb = g_a.eigenvalues.cpu().double(), g_b.eigenvalues.cpu().double()
    rel = float(((va - vb).abs() / vb.abs()).max())
    Ua, Ub = g_a.eigenvectors.cpu().double(), g_b.eigenvectors.cpu().double()
    M = (Ua @ Ub.T).pow(2)
    a_k = [float(M[:k, :k].sum() / k) for k in range(1, len(va) + 1)]
    return rel, min(a_k)


def compare(label, x, enc, unet, ac, cfg, device, threads):
    for n in threads:
        torch.set_num_threads(n)
        g_u, _, t_u, _ = run("upstream", x, enc, unet, ac, cfg, device)
        g_f, _, t_f, _ = run("fast", x, enc, unet, ac, cfg, device)
        rel, min_a = agreement(g_f, g_u)
        print(
            f"{label:<34} {n} thread(s): upstream {t_u:8.2f} s  fast {t_f:8.2f} s  "
            f"ratio {t_u / t_f:5.2f}  (max rel eig err {rel:.1e}, min A_k {min_a:.6f})",
            flush=True,
        )


def eigen_step(threads):
    from multigeom_workflow.compute.engine import top_eigenpairs

    g = torch.Generator().manual_seed(0)
    D = torch.randn(4800, 4096, generator=g) * torch.logspace(0, -3, 4096)
    for n in threads:
        torch.set_num_threads(n)
        t0 = time.perf_counter()
        _, S, Vh = torch.linalg.svd(D, full_matrices=False)
        t_svd = time.perf_counter() - t0
        t0 = time.perf_counter()
        values, vectors = top_eigenpairs(D, 50, "gram")
        t_fast = time.perf_counter() - t0
        rel = float(((values - S[:50] ** 2).abs() / S[:50] ** 2).max())
        print(
            f"{'eigen-step, D 4800 x 4096, top 50':<34} {n} thread(s): upstream SVD "
            f"{t_svd:6.2f} s  fast Gram64+eigh {t_fast:6.2f} s  ratio "
            f"{t_svd / t_fast:5.2f}  (max rel eig err {rel:.1e})",
            flush=True,
        )


def cuda(args):
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    enc, unet, ac = models("diffusion", device)
    x = image(device)
    cfg = settings("estimator")
    # Warm-up: kernels, cuDNN autotuning, the allocator.
    run("fast", x, enc, unet, ac, settings("estimator", n_samples=25), device)
    g_u, _, t_u, _ = run("upstream", x, enc, unet, ac, cfg, device)
    print(f"upstream fp32: {t_u:.2f} s per image", flush=True)
    for precision in ("fp32", "tf32", "bf16"):
        times = []
        for _ in range(args.repeats):
            g_f, _, t_f, _ = run("fast", x, enc, unet, ac, cfg, device, precision)
            times.append(t_f)
        t_f = min(times)
        rel, min_a = agreement(g_f, g_u)
        print(
            f"fast {precision}: {t_f:.2f} s per image (best of {args.repeats}), "
            f"{t_u / t_f:.1f}x upstream; vs upstream: max rel eig err {rel:.1e}, "
            f"min A_k {min_a:.6f}",
            flush=True,
        )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument(
        "--cases",
        nargs="+",
        default=["demo", "paper", "paper-unet", "eigen"],
        choices=["demo", "paper", "paper-unet", "eigen"],
    )
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=2, help="fast runs per precision")
    args = p.parse_args(argv)
    print(
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    )
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible")
        return cuda(args)
    cpu = torch.device("cpu")
    x = image(cpu)
    if "demo" in args.cases:
        enc, unet, ac = models("config/diffusion_demo.yaml", cpu)
        cfg = settings("config/estimator_demo.yaml")
        compare("demo settings, demo UNet", x, enc, unet, ac, cfg, cpu, args.threads)
    if "paper" in args.cases:
        enc, unet, ac = models("config/diffusion_demo.yaml", cpu)
        cfg = settings("estimator")
        compare("paper settings, demo UNet", x, enc, unet, ac, cfg, cpu, args.threads)
    if "paper-unet" in args.cases:
        enc, unet, ac = models("diffusion", cpu)
        cfg = settings("estimator", n_samples=4, batch_size=4)
        label = "paper grid x 4 samples, paper UNet"
        compare(label, x, enc, unet, ac, cfg, cpu, args.threads[:1])
    if "eigen" in args.cases:
        eigen_step(args.threads)


if __name__ == "__main__":
    main()
