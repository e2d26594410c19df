"""
Warm workers against a cold process per image, on the demo: the per-image jobs of the
demo (4 configurations x 8 images) on 2 CPU workers, once with `workers: warm` and once
with `workers: cold`, from the same built assets. Prints, for each, the wall-clock, the
sum of the per-image `elapsed_seconds` (time inside upstream's estimator) and the
efficiency = sum / (wall-clock x workers); then the cold / warm wall-clock ratio.
Goal: efficiency >= 0.95 warm.

Usage: python benchmarks/warm_vs_cold.py [--assets RUNS_DIR] [--cores 2]
(RUNS_DIR: a runs folder where the demo's assets are built; default: runs/ of the
repository, built first if missing.)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def snakemake(workdir: Path, *args: str) -> float:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(workdir), *args]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--assets", type=Path, default=REPO / "runs")
    p.add_argument("--cores", type=int, default=2)
    args = p.parse_args(argv)
    assets = args.assets.resolve()
    targets = [
        f"runs/per_image/{enc}/{area}/img{i:04d}.pt"
        for enc, area in [
            (c["encoder"], c["area"])
            for c in yaml.safe_load((REPO / "config" / "config.yaml").read_text())[
                "configs"
            ]
        ]
        for i in range(8)
    ]
    if not (assets / "diffusion").is_dir():
        print(f"building the demo's assets in {assets.parent} ...", flush=True)
        built = [
            f"runs/diffusion/{t.split('/')[2]}/{t.split('/')[3]}/final_model.pt"
            for t in targets[::8]
        ]
        snakemake(
            assets.parent,
            "--configfile",
            str(REPO / "config" / "config.yaml"),
            "--cores",
            str(args.cores),
            *built,
            "runs/demo/test_images/img0000.png",
        )
    rows = {}
    for mode in ("warm", "cold"):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for part in ("demo", "encoders", "diffusion"):
                shutil.copytree(assets / part, work / "runs" / part)
            wall = snakemake(
                work,
                *targets,
                "--allowed-rules",  # the copied assets are not rebuilt
                "estimate_image",
                "--cores",
                str(args.cores),
                "--configfile",
                str(REPO / "config" / "config.yaml"),
                "--config",
                f"workers={mode}",
            )
            inside = sum(
                torch.load(work / t, weights_only=False)["elapsed_seconds"]
                for t in targets
            )
        rows[mode] = (wall, inside, inside / (wall * args.cores))
        print(
            f"{mode}: wall-clock {wall:.0f} s, estimator {inside:.0f} s in all, "
            f"efficiency {rows[mode][2]:.2f}",
            flush=True,
        )
    print(f"cold / warm wall-clock: {rows['cold'][0] / rows['warm'][0]:.2f}")


if __name__ == "__main__":
    main()
