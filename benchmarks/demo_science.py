"""
What a finished demo run shows: per configuration, the encoder's fit (correlation with
the area's noiseless responses on held-out crops and on the test images, computed here
from the run's files by `inputs.demo.diagnostics.test_image_correlation`, so that a run
of an older commit is scored the same way; response std on the test images), how
much its diffusion model's prediction depends on the responses, the noise ceiling, and
the alignment of G(x) and J(x) with the area's ground truth, as the Markdown table of
README.md; then A_k of every pair.

Usage: python benchmarks/demo_science.py [WORKDIR] [--k 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def _at(curve: dict | None, k: int) -> str:
    if not curve:
        return "-"
    i = min(k, len(curve["k"])) - 1
    return f"{curve['alignment_mean'][i]:.3f} ± {curve['alignment_sem'][i]:.3f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("workdir", nargs="?", default=".")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args(argv)
    runs = Path(args.workdir) / args.runs_dir
    k = args.k

    def read(path):
        path = runs / path
        return json.loads(path.read_text()) if path.exists() else {}

    from multigeom.encoders import load_encoder

    from multigeom_workflow.inputs.demo.diagnostics import test_image_correlation
    from multigeom_workflow.inputs.images import load_test_image

    torch.set_num_threads(1)
    tests = torch.stack(
        [load_test_image(f) for f in sorted(runs.glob("demo/test_images/img*.png"))]
    )

    def test_corr(enc, area):
        ckpt = runs / f"encoders/{enc}/{area}/best_model.pt"
        simulated = torch.load(runs / f"demo/areas/{area}.pt", weights_only=False)
        encoder = load_encoder(str(ckpt), device="cpu")
        return test_image_correlation(encoder, simulated, tests)

    ceiling = read("metrics/noise_ceiling.json").get("configurations", {})
    truth = read("metrics/ground_truth.json").get("configurations", {})
    print(f"A at k = {k}, mean ± s.e.m. over images")
    print(
        "| configuration | corr. with noiseless responses (held-out crops) | the same "
        f"({len(tests)} test images) | response std (test images) | "
        "‖ε(r₁) − ε(r₂)‖/‖ε‖ same image / other image | noise ceiling of G (2 seeds) "
        "| G vs truth | J vs truth |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for report in sorted(runs.glob("encoders/*/*/fit_report.json")):
        enc, area = report.parent.parent.name, report.parent.name
        label = f"{enc}/{area}"
        fit = json.loads(report.read_text())
        cond = read(f"diffusion/{enc}/{area}/conditioning.json")
        print(
            f"| {label} | {fit['val_corr_clean']:.3f} | {test_corr(enc, area):.3f} | "
            f"{fit['response_std']:.2f} | "
            f"{cond.get('pair_mean', float('nan')):.1e} / "
            f"{cond.get('other_image_mean', float('nan')):.1e} | "
            f"{_at(ceiling.get(label, {}).get('G'), k)} | "
            f"{_at(truth.get(label, {}).get('G'), k)} | "
            f"{_at(truth.get(label, {}).get('J'), k)} |"
        )
    metrics = read("metrics/cross_encoder_metrics.json").get("pairs", {})
    for label, pair in sorted(metrics.items()):
        print(f"{label:60} A_{k} = {_at(pair, k)}")


if __name__ == "__main__":
    main()
