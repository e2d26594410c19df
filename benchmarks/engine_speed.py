"""
The two per-image engines, upstream and fast, side by side in one process on the same
models, image and seed: seconds per image and per step, rows per UNet call, peak
memory, and how closely each run agrees with the IEEE-fp32 reference (upstream, fp32).

Side by side (``--device cuda``, the default when a GPU is visible; or ``--device cpu
--side-by-side`` for a rehearsal): upstream and fast at IEEE fp32, at TF32 (PyTorch's
GPU defaults; on the CPU emulated: convolution operands rounded to TF32), fast in bf16
(refused in a configuration: printed for the record), and on a GPU fast with the CPU's
TF32 emulation (does the emulation give the bias of the real thing?); then the
eigen-step alone by each route. Defaults on a GPU: the paper-size UNet (upstream's
packaged "diffusion", 68M parameters), random weights (the time does not depend on
them), the paper's estimator settings (24 timesteps x 200 samples): about 3 minutes on
an H200.

CPU cases (``--device cpu``, the default without a GPU): the demo UNet with the demo's
and the paper's estimator settings, 1 and 2 threads; the paper-size UNet on the paper's
grid with fewer samples; the eigen-step of a 4800 x 4096 D.

Starts from a bare checkout: the checkout's ``src`` is put first on ``sys.path`` (no
``PYTHONPATH=src``); upstream ``multigeom`` and ``diffusers`` must be importable (on a
GPU machine: the device kit's wheels, see benchmarks/gpu_lease.sh).

Usage:
    python benchmarks/engine_speed.py [--device cuda|cpu] [--side-by-side]
        [--diffusion NAME|FILE] [--estimator NAME|FILE] [--samples N] [--batch B]
        [--grid START STOP STEP] [--cases demo paper paper-unet eigen] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # this checkout's code, installed or not

import torch  # noqa: E402
import yaml  # noqa: E402


def settings(name: str, **monte_carlo) -> object:
    from multigeom_workflow.settings.files import resolve_settings_file, to_namespace

    est = yaml.safe_load(resolve_settings_file(name, "estimator", REPO).read_text())
    for key, value in monte_carlo.items():
        if value is not None:
            est["monte_carlo"][key] = value
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


def run(engine, x, encoder, unet, ac, cfg, device, precision="fp32", emulate=False):
    """
    One image by `engine` in `precision` (with `emulate`, fp32 and the CPU's TF32
    emulation): (G output, J output, the steps' figures).
    """
    import warnings

    from multigeom.geometry.estimator import conditional_pair_estimate
    from multigeom.geometry.fisher import fisher_eigendecomposition
    from multigeom.utils import make_generator

    from multigeom_workflow.compute.arithmetic import emulated_tf32, precision_context
    from multigeom_workflow.compute.engine import estimate_image_fast

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    stats = {}
    mode = emulated_tf32() if emulate else contextlib.nullcontext()
    sync(device)
    t0 = time.perf_counter()
    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # upstream's contract notes on random weights
        if engine == "upstream":
            with precision_context(precision, device):
                g = conditional_pair_estimate(
                    x, encoder, unet, ac, cfg, device, make_generator(42, device)
                )
                sync(device)
                t1 = time.perf_counter()
                sigma = float(cfg.monte_carlo.observation_noise_sigma)
                j = fisher_eigendecomposition(x, encoder, sigma, 50, device)
                sync(device)
            stats.update(
                unet_seconds=t1 - t0,
                fisher_seconds=time.perf_counter() - t1,
                rows_per_call=int(cfg.monte_carlo.batch_size),
                eigen_method="svd@cpu*",
            )
        else:
            g, j = estimate_image_fast(
                x, encoder, unet, ac, cfg, seed=42, device=device,
                precision=precision, stats=stats,
            )  # fmt: skip
    g.eigenvalues.cpu()
    sync(device)
    stats["seconds"] = time.perf_counter() - t0
    stats["peak_gib"] = (
        torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else None
    )
    return g, j, stats


def agreement(g_a, g_b) -> tuple[float, float, float]:
    """
    (max relative eigenvalue error, min over k of A_k, ratio of the last eigenvalues)
    of two G outputs.
    """
    va, vb = g_a.eigenvalues.cpu().double(), g_b.eigenvalues.cpu().double()
    rel = float(((va - vb).abs() / vb.abs()).max())
    Ua, Ub = g_a.eigenvectors.cpu().double(), g_b.eigenvectors.cpu().double()
    M = (Ua @ Ub.T).pow(2)
    a_k = [float(M[:k, :k].sum() / k) for k in range(1, len(va) + 1)]
    return rel, min(a_k), float(va[-1] / vb[-1])


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


HEADER = (
    f"{'engine':<9}{'precision':<17}{'s/image':>9}{'UNet s':>9}{'eigen s':>9}"
    f"{'J(x) s':>8}{'rows':>6}{'peak GiB':>9}  {'G vs IEEE ref: max rel':>23}"
    f"{'min A_k':>10}{'last eig':>9}  eigen route"
)


def line(engine, label, stats, agree):
    rel, a_k, last = agree
    return (
        f"{engine:<9}{label:<17}{stats['seconds']:>9.2f}"
        f"{fmt(stats.get('unet_seconds'), '.2f'):>9}"
        f"{fmt(stats.get('eigen_seconds'), '.2f'):>9}"
        f"{fmt(stats.get('fisher_seconds'), '.2f'):>8}"
        f"{stats.get('rows_per_call_final', stats.get('rows_per_call')):>6}"
        f"{fmt(stats.get('peak_gib'), '.2f'):>9}  {rel:>23.1e}{a_k:>10.5f}"
        f"{last:>9.3f}  {stats.get('eigen_method', '-')}"
    )


def side_by_side(args, device):
    from multigeom_workflow.compute.engine import (
        activation_elements,
        device_memory,
        eigen_method,
        rows_per_call,
    )

    enc, unet, ac = models(args.diffusion, device)
    grid = dict(zip(("start", "stop", "step"), args.grid, strict=False)) or None
    cfg = settings(
        args.estimator,
        n_samples=args.samples,
        batch_size=args.batch,
        timestep_grid=grid,
    )
    mc = cfg.monte_carlo
    n_t = len(
        range(mc.timestep_grid.start, mc.timestep_grid.stop + 1, mc.timestep_grid.step)
    )
    R = n_t * int(mc.n_samples)
    x = image(device)
    n_params = sum(p.numel() for p in unet.parameters()) / 1e6
    largest, total = activation_elements(unet, 50, device)
    rows = rows_per_call(unet, 50, R, device, int(mc.batch_size))
    print(
        f"UNet {args.diffusion} ({n_params:.1f}M parameters, random weights), "
        f"estimator {args.estimator}: {n_t} timesteps x {mc.n_samples} samples = "
        f"{R} rows of D; activations per sample {total:,} elements (largest "
        f"{largest:,}); total memory {fmt(device_memory(device), ',')} bytes; rows "
        f"per call {rows}; eigen-step auto: {eigen_method(device)}",
        flush=True,
    )
    gpu = device.type == "cuda"
    tf32 = ("tf32", False, "tf32") if gpu else ("fp32", True, "tf32 (emulated)")
    cases = [
        ("upstream", "fp32", False, "fp32 (IEEE)"),
        ("upstream", *tf32),
        ("fast", "fp32", False, "fp32 (IEEE)"),
        ("fast", *tf32),
        ("fast", "bf16", False, "bf16 (refused)"),
    ]
    if gpu:
        cases.append(("fast", "fp32", True, "tf32 (emulated)"))
    if gpu:  # warm-up: kernels, cuDNN's choices, the allocator (fewer samples)
        warm = settings(args.estimator, n_samples=mc.batch_size,
                        batch_size=mc.batch_size, timestep_grid=grid)  # fmt: skip
        for engine, precision, emulate, _ in cases:
            run(engine, x, enc, unet, ac, warm, device, precision, emulate)
    svd_seconds = eigen_routes(device, R)
    print(
        "upstream's UNet s: its G(x) less the CPU SVD of the same size timed above "
        "(its eigen s, marked *)"
    )
    print(HEADER, flush=True)
    reference = None
    for engine, precision, emulate, label in cases:
        g, _, stats = run(engine, x, enc, unet, ac, cfg, device, precision, emulate)
        if engine == "upstream":
            stats["unet_seconds"] -= svd_seconds
            stats["eigen_seconds"] = svd_seconds
        if reference is None:
            reference = g
        print(line(engine, label, stats, agreement(g, reference)), flush=True)


def eigen_routes(device, rows, k=50) -> float:
    """
    The eigen-step alone, each route, on a D of G's shape (rows x 4096); returns the
    seconds of upstream's (the CPU's float32 SVD).
    """
    from multigeom_workflow.compute.engine import top_eigenpairs

    k = min(k, rows)
    upstream_seconds = None
    g = torch.Generator().manual_seed(0)
    D = (torch.randn(rows, 4096, generator=g) * torch.logspace(0, -3, 4096)).to(device)
    ref, ref_vectors = top_eigenpairs(D.cpu(), k, "gram")
    routes = [("svd", D.cpu(), "upstream's: float32 SVD on the CPU")]
    if device.type == "cuda":
        routes += [
            ("gram", D, "float64 Gram + eigh on the GPU"),
            ("gram32", D, "float32 Gram + eigh, refined in float64, on the GPU"),
            ("svd", D, "float32 SVD on the GPU"),
        ]
    else:
        routes += [("gram", D, "float64 Gram + eigh on the CPU")]
    for method, matrix, label in routes:
        sync(device)
        t0 = time.perf_counter()
        values, vectors = top_eigenpairs(matrix, k, method)
        values.cpu()
        sync(device)
        seconds = time.perf_counter() - t0
        upstream_seconds = upstream_seconds or seconds
        rel = float(((values.cpu().double() - ref.double()).abs() / ref.double()).max())
        M = (vectors.cpu().double() @ ref_vectors.double().T).pow(2)
        a_k = min(float(M[:i, :i].sum() / i) for i in range(1, k + 1))
        print(
            f"eigen-step {rows} x 4096, top {k}, {label}: {seconds:.2f} s "
            f"(vs the CPU's float64 Gram: max rel {rel:.1e}, min A_k {a_k:.6f})",
            flush=True,
        )
    return upstream_seconds


def compare(label, x, enc, unet, ac, cfg, device, threads):
    for n in threads:
        torch.set_num_threads(n)
        g_u, _, s_u = run("upstream", x, enc, unet, ac, cfg, device)
        g_f, _, s_f = run("fast", x, enc, unet, ac, cfg, device)
        rel, min_a, _ = agreement(g_f, g_u)
        t_u, t_f = s_u["seconds"], s_f["seconds"]
        print(
            f"{label:<34} {n} thread(s): upstream {t_u:8.2f} s  fast {t_f:8.2f} s  "
            f"ratio {t_u / t_f:5.2f}  (max rel eig err {rel:.1e}, min A_k {min_a:.6f})",
            flush=True,
        )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--side-by-side", action="store_true", help="the GPU's table")
    p.add_argument("--diffusion", default="diffusion", help="UNet settings")
    p.add_argument("--estimator", default="estimator", help="estimator settings")
    p.add_argument("--samples", type=int, default=None, help="Monte-Carlo samples")
    p.add_argument("--batch", type=int, default=None, help="upstream's batch size")
    p.add_argument(
        "--grid", type=int, nargs=3, default=(), metavar=("START", "STOP", "STEP")
    )
    p.add_argument(
        "--cases",
        nargs="+",
        default=["demo", "paper", "paper-unet", "eigen"],
        choices=["demo", "paper", "paper-unet", "eigen"],
    )
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    args = p.parse_args(argv)
    device = torch.device(
        args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(
            f"{props.name}, compute capability {props.major}.{props.minor}, "
            f"{props.total_memory / 2**30:.1f} GiB, CUDA {torch.version.cuda}, "
            f"cuDNN {torch.backends.cudnn.version()}"
        )
    if device.type == "cuda" or args.side_by_side:
        return side_by_side(args, device)
    x = image(device)
    if "demo" in args.cases:
        enc, unet, ac = models("config/diffusion_demo.yaml", device)
        cfg = settings("config/estimator_demo.yaml")
        compare("demo settings, demo UNet", x, enc, unet, ac, cfg, device, args.threads)
    if "paper" in args.cases:
        enc, unet, ac = models("config/diffusion_demo.yaml", device)
        cfg = settings("estimator")
        compare(
            "paper settings, demo UNet", x, enc, unet, ac, cfg, device, args.threads
        )
    if "paper-unet" in args.cases:
        enc, unet, ac = models("diffusion", device)
        cfg = settings("estimator", n_samples=4, batch_size=4)
        label = "paper grid x 4 samples, paper UNet"
        compare(label, x, enc, unet, ac, cfg, device, args.threads[:1])
    if "eigen" in args.cases:
        for n in args.threads:
            torch.set_num_threads(n)
            print(f"{n} thread(s):")
            eigen_routes(device, 4800)


if __name__ == "__main__":
    main()
