"""
Where the time of a finished run went: prints, from a working directory where the
workflow ran, the seconds per image inside upstream's estimator (`elapsed_seconds` of
the per-image files), the wall-clock of the per-image jobs (Snakemake's benchmark
files), the share of the per-image jobs spent outside the estimator (process start,
imports, model loading), and the time of the other rules.

Usage: python benchmarks/demo_timing.py [WORKDIR] [--wall SECONDS] [--cores N]
(--wall: the run's wall-clock, to print the share of it spent in the estimator.)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd
import torch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("workdir", nargs="?", default=".")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--wall", type=float, default=None, help="run wall-clock, seconds")
    p.add_argument("--cores", type=int, default=2)
    args = p.parse_args(argv)
    work = Path(args.workdir)

    files = sorted((work / args.runs_dir / "per_image").glob("*/*/img*.pt"))
    inside = [torch.load(f, weights_only=False)["elapsed_seconds"] for f in files]
    bench = {
        rule.name: [pd.read_csv(t, sep="\t")["s"].iloc[0] for t in rule.rglob("*.tsv")]
        for rule in sorted((work / "logs" / "benchmarks").iterdir())
        if rule.is_dir()
    }
    jobs = bench.get("estimate_image", [])
    print(f"per-image files: {len(files)}")
    print(f"seconds per image in the estimator: median {statistics.median(inside):.2f}")
    if jobs:
        print(f"seconds per per-image job (wall): median {statistics.median(jobs):.2f}")
        outside = 1 - sum(inside) / sum(jobs)
        print(f"share of per-image job time outside the estimator: {outside:.1%}")
    for rule, seconds in bench.items():
        if rule != "estimate_image":
            median = statistics.median(seconds)
            print(f"{rule}: {len(seconds)} jobs, median {median:.1f} s")
    if args.wall:
        busy = sum(inside) / (args.wall * args.cores)
        print(
            f"run wall-clock {args.wall:.0f} s on {args.cores} cores: "
            f"{busy:.1%} of core time in the estimator, {1 - busy:.1%} outside"
        )


if __name__ == "__main__":
    main()
