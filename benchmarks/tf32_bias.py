"""
The bias of TF32 on trained models, emulated on the CPU: for each configuration of a
runs folder (the demo's, or the tests' reduced demo), one test image by upstream and by
the fast engine in IEEE fp32 (the reference: upstream) and by both with the operands of
every convolution rounded to TF32 (`multigeom_workflow.compute.arithmetic.
emulated_tf32`, what ``precision: tf32`` runs on a GPU). Prints, against the
reference, the largest relative change of G's eigenvalues, the change of the k-th
(the smallest kept), and the least per-image A_k over k.

Usage:
    python benchmarks/tf32_bias.py RUNS_DIR [--diffusion FILE] [--estimator FILE]
        [--image N] [--top-k K]
(RUNS_DIR holds encoders/<enc>/<area>/best_model.pt, diffusion/<enc>/<area>/
final_model.pt and demo/test_images/imgNNNN.png; --diffusion: the settings the UNets
were built with, default config/diffusion_demo.yaml.)
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))  # this checkout's code, installed or not

import torch  # noqa: E402
import yaml  # noqa: E402


def agreement(a, b) -> tuple[float, float, float]:
    """(max relative eigenvalue change, change of the last, min over k of A_k)."""
    va, vb = a.eigenvalues.double(), b.eigenvalues.double()
    M = (a.eigenvectors.double() @ b.eigenvectors.double().T).pow(2)
    a_k = min(float(M[:k, :k].sum() / k) for k in range(1, len(va) + 1))
    return float(((va - vb).abs() / vb).max()), float(va[-1] / vb[-1] - 1), a_k


def main(argv=None):
    from multigeom.pipeline.per_image import estimate_image

    from multigeom_workflow.compute.arithmetic import emulated_tf32
    from multigeom_workflow.compute.engine import estimate_image_fast
    from multigeom_workflow.compute.estimate import load_models
    from multigeom_workflow.inputs.images import load_test_image
    from multigeom_workflow.settings.files import to_namespace

    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("runs", type=Path)
    p.add_argument("--diffusion", default=str(REPO / "config/diffusion_demo.yaml"))
    p.add_argument("--estimator", default=str(REPO / "config/estimator_demo.yaml"))
    p.add_argument("--image", type=int, default=1)
    p.add_argument("--top-k", type=int, default=50)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    diffusion = yaml.safe_load(Path(args.diffusion).read_text())
    est = yaml.safe_load(Path(args.estimator).read_text())
    est["top_k"] = est["fisher_baseline"]["top_k"] = args.top_k
    cfg = to_namespace(est)
    mc = est["monte_carlo"]
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}; "
        f"{args.runs}, image {args.image}, seed {42 + args.image}, estimator "
        f"{Path(args.estimator).name} ({mc['n_samples']} samples), top {args.top_k}"
    )
    print(
        f"{'configuration':<18}{'engine':<10}{'IEEE: max rel':>14}{'min A_k':>10}"
        f"{'TF32: max rel':>15}{'last eig':>10}{'min A_k':>9}"
    )
    x = load_test_image(
        args.runs / f"demo/test_images/img{args.image:04d}.png"
    ).unsqueeze(0)
    for enc_file in sorted(args.runs.glob("encoders/*/*/best_model.pt")):
        encoder, area = enc_file.parts[-3], enc_file.parts[-2]
        diff_file = args.runs / f"diffusion/{encoder}/{area}/final_model.pt"
        m = load_models(enc_file, diff_file, diffusion, "cpu")
        call = (x, m.encoder, m.unet, m.alphas_cumprod, cfg)
        seed = 42 + args.image
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref, _ = estimate_image(*call, seed=seed, device=m.device)
            runs = {
                name: partial(fn, *call, seed=seed, device=m.device)
                for name, fn in (
                    ("upstream", estimate_image),
                    ("fast", estimate_image_fast),
                )
            }
            for name, fn in runs.items():
                ieee = ref if name == "upstream" else fn()[0]
                with emulated_tf32():
                    tf32 = fn()[0]
                rel, _, a_k = agreement(ieee, ref)
                t_rel, t_last, t_a = agreement(tf32, ref)
                print(
                    f"{encoder + '/' + area:<18}{name:<10}{rel:>14.1e}{a_k:>10.5f}"
                    f"{t_rel:>15.1e}{t_last:>+10.1%}{t_a:>9.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
