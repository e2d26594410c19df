"""
What a finished demo run shows: per configuration, the encoder's fit (correlation with
the area's noiseless responses on held-out crops and on the test images, computed here
from the run's files by `inputs.demo.diagnostics.test_image_correlation`, so that a run
of an older commit is scored the same way; response std on the test images), how
much its diffusion model's prediction depends on the responses, the noise ceiling, and
the alignment of G(x) and J(x) with the area's ground truth, as the Markdown table of
README.md; then A_k of every pair, and every compared pair against its noise ceiling
(`results.science.against_ceiling`: how many standard errors under it).

With ``--check MIN``, the verdict of issue 40 on the run, as the exit status: 0 when
every configuration's G ceiling A_k is at least MIN and at least one compared G pair
lies more than 3 standard errors under its ceiling, else 1, with one line per
shortfall (``.ci/science-demo`` runs it on the science demo).

Usage: python benchmarks/demo_science.py [WORKDIR] [--runs-dir runs] [--k 10]
    [--check 0.5]
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
    p.add_argument(
        "--check",
        type=float,
        metavar="MIN",
        help="exit 1 unless every G ceiling is >= MIN and a G pair is > 3 s.e. under",
    )
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

    from multigeom_workflow.results.science import against_ceiling

    rows = against_ceiling({"pairs": metrics}, {"configurations": ceiling}, k)
    print(f"\nAgainst the noise ceiling (A_{k}; z: standard errors under it)")
    print("| metric | kind | pair | A | ceiling | A / ceiling | z |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['metric']} | {r['kind']} | {r['pair']} | {r['a']:.3f} ± "
            f"{r['a_sem']:.3f} | {r['ceiling']:.3f} ± {r['ceiling_sem']:.3f} | "
            f"{r['fraction']:.0%} | {r['z']:.1f} |"
        )
    if args.check is None:
        return 0
    problems = []
    for label, curves in sorted(ceiling.items()):
        value = _value(curves.get("G"), k)
        if not value >= args.check:  # NaN (no curve) fails too
            problems.append(f"G ceiling of {label}: A_{k} = {value:.3f} < {args.check}")
    if not ceiling:
        problems.append(f"no noise ceiling in {runs / 'metrics/noise_ceiling.json'}")
    if not any(r["metric"] == "G" and r["z"] > 3 for r in rows):
        problems.append("no compared G pair lies more than 3 s.e. under its ceiling")
    for line in problems:
        print(f"check failed: {line}")
    if not problems:
        print(f"check passed: every G ceiling >= {args.check}, a G pair > 3 s.e. under")
    return 1 if problems else 0


def _value(curve: dict | None, k: int) -> float:
    if not curve:
        return float("nan")
    return float(curve["alignment_mean"][min(k, len(curve["k"])) - 1])


if __name__ == "__main__":
    raise SystemExit(main())
