"""
Where the time of a finished run went: prints, from a working directory where the
workflow ran, the seconds per image inside upstream's estimator (`elapsed_seconds` of
the per-image files), the wall-clock of the per-image jobs (Snakemake's benchmark
files), the share of the per-image jobs spent outside the estimator (process start,
imports, model loading), and the wall-clock and CPU seconds of every rule (Snakemake's
benchmark files) with their sum.

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

    runs = work / args.runs_dir
    inside = {
        folder: [
            torch.load(f, weights_only=False)["elapsed_seconds"]
            for f in sorted((runs / folder).glob("*/*/img*.pt"))
        ]
        for folder in ("per_image", "per_image_ceiling")
    }
    bench = {
        rule.name: [pd.read_csv(t, sep="\t").iloc[0] for t in rule.rglob("*.tsv")]
        for rule in sorted((work / "logs" / "benchmarks").iterdir())
        if rule.is_dir()
    }
    files = inside["per_image"]
    print(
        f"per-image files: {len(files)} (+ {len(inside['per_image_ceiling'])} ceiling)"
    )
    if files:
        print(
            f"seconds per image in the estimator: median {statistics.median(files):.2f}"
        )
    jobs = [row["s"] for row in bench.get("estimate_image", [])]
    if jobs:
        print(f"seconds per per-image job (wall): median {statistics.median(jobs):.2f}")
        outside = 1 - sum(files) / sum(jobs)
        print(f"share of per-image job time outside the estimator: {outside:.1%}")
    # CPU seconds per stage: Snakemake's cpu_time of each job (the job's processes);
    # a per-image job hands its image to a warm worker (counted in the cpu_time of the
    # job that started it, while it runs), so the estimator's seconds (the files'
    # elapsed_seconds, one thread: wall-clock, an upper bound of its CPU time) are
    # listed instead.
    print(f"{'rule':26} {'jobs':>5} {'wall s':>8} {'CPU s':>8}")
    total = 0.0
    for rule, rows in bench.items():
        wall = sum(float(r["s"]) for r in rows)
        cpu = sum(float(r["cpu_time"]) for r in rows)
        folder = {"estimate_image": "per_image"}.get(rule)
        folder = folder or {"estimate_image_ceiling": "per_image_ceiling"}.get(rule)
        note = ""
        if folder:
            cpu = sum(inside[folder])
            note = "  (the estimator's seconds in the warm workers)"
        total += cpu
        print(f"{rule:26} {len(rows):5d} {wall:8.1f} {cpu:8.1f}{note}")
    print(
        f"sum of CPU seconds: {total:.0f} (without Snakemake itself and the warm "
        "workers' start-up; benchmarks/demo_cpu.py measures everything)"
    )
    if args.wall:
        estimator = sum(map(sum, inside.values()))
        busy = estimator / (args.wall * args.cores)
        print(
            f"run wall-clock {args.wall:.0f} s on {args.cores} cores: "
            f"{busy:.1%} of core time in the estimator, {1 - busy:.1%} outside; "
            f"listed CPU seconds {total / (args.wall * args.cores):.1%} of core time"
        )


if __name__ == "__main__":
    main()
