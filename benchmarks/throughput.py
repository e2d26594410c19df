"""
Throughput of the orchestration alone, with simulated GPUs: the stand-in estimator
(`multigeom_workflow.compute.standin`, selected here by MULTIGEOM_STANDIN_S; it sleeps a
fixed time per image instead of computing) on fake GPU ids (CUDA_VISIBLE_DEVICES), warm
workers, through the real Snakefile. Prints, per case, the wall-clock of the whole
`snakemake` command, jobs per second, the per-job overhead (GPU-seconds not spent in the
stand-in, per image) and the efficiency = images x seconds / (wall x GPUs); and the same
from the first job's start to the last job's end (Snakemake's start-up and planning left
out). Then, for comparison, a bare Snakefile with as many `sleep` jobs (`shell:`, log,
benchmark, gpu=1 under --resources gpu=N): Snakemake's own floor.

Goals: 8 GPUs x 1.0 s x 400 images: efficiency >= 0.95; 16 x 1.0 s x 800: >= 0.9.

Usage: python benchmarks/throughput.py [--cases 8x1.0x400 16x1.0x800]
       [--scheduler greedy]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multigeom_workflow.compute.standin import simulated_scenario, simulated_targets

REPO = Path(__file__).resolve().parents[1]


def run_case(
    n_gpus: int, seconds: float, n_images: int, scheduler: str, extra=()
) -> dict:
    n_configs = 4
    per_config = -(-n_images // n_configs)
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        root = Path(tmp)
        config, env = simulated_scenario(root, n_configs, per_config)
        work = root / "work"
        work.mkdir()
        records = root / "records.jsonl"
        env = {
            **os.environ,
            **env,
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(n_gpus)),
            "MULTIGEOM_STANDIN_S": str(seconds),
            "MULTIGEOM_STANDIN_RECORD": str(records),
            "MULTIGEOM_GPU_LOCK_DIR": str(root / "locks"),
        }
        targets = simulated_targets(n_configs, per_config)[:n_images]
        cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
        cmd += ["--directory", str(work), *targets, "--configfile", str(config)]
        cmd += ["--profile", str(REPO / "profiles" / "local-gpu")]
        cmd += ["--cores", str(4 * n_gpus), "--scheduler", scheduler, *extra]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        lines = [json.loads(line) for line in records.read_text().splitlines()]
        if os.environ.get("KEEP_RECORDS"):
            Path(os.environ["KEEP_RECORDS"]).write_text(records.read_text())
    jobs = [r for r in lines if r["what"] == "job"]
    assert len(jobs) == n_images, (len(jobs), n_images)
    span = max(j["end"] for j in jobs) - min(j["start"] for j in jobs)
    work_s = n_images * seconds
    return {
        "wall": wall,
        "span": span,
        "jobs_per_s": n_images / wall,
        "overhead": (wall * n_gpus - work_s) / n_images,
        "efficiency": work_s / (wall * n_gpus),
        "efficiency_jobs": work_s / (span * n_gpus),
    }


BARE = """
rule all:
    input: expand("out/{{i}}.txt", i=range({n}))

rule job:
    output: "out/{{i}}.txt"
    log: "logs/{{i}}.log"
    benchmark: "benchmarks/{{i}}.tsv"
    resources: gpu=1
    shell: "sleep {seconds} && touch {{output}} > {{log}} 2>&1"
"""


def run_bare(n_gpus: int, seconds: float, n_images: int, scheduler: str) -> float:
    """Wall-clock of a bare Snakefile: the same number of `sleep` jobs, gpu=N."""
    with tempfile.TemporaryDirectory(prefix="throughput-bare-") as tmp:
        snakefile = Path(tmp) / "Snakefile"
        snakefile.write_text(BARE.format(n=n_images, seconds=seconds))
        cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile)]
        cmd += ["--directory", tmp, "--cores", str(4 * n_gpus)]
        cmd += ["--resources", f"gpu={n_gpus}", "--scheduler", scheduler]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--cases", nargs="+", default=["8x1.0x400", "16x1.0x800"])
    p.add_argument("--scheduler", default="greedy", help="Snakemake's --scheduler")
    p.add_argument(
        "--snakemake-args", nargs="*", default=[], help="more Snakemake options"
    )
    args = p.parse_args(argv)
    for case in args.cases:
        gpus, seconds, images = case.split("x")
        r = run_case(
            int(gpus), float(seconds), int(images), args.scheduler, args.snakemake_args
        )
        print(
            f"{gpus} GPUs x {seconds} s x {images} images ({args.scheduler}): "
            f"wall-clock {r['wall']:.1f} s, {r['jobs_per_s']:.1f} jobs/s, overhead "
            f"{r['overhead']:.3f} GPU-s per job, efficiency {r['efficiency']:.3f} "
            f"(first job to last: {r['span']:.1f} s, {r['efficiency_jobs']:.3f})",
            flush=True,
        )
        bare = run_bare(int(gpus), float(seconds), int(images), args.scheduler)
        work_s = int(images) * float(seconds)
        print(
            f"  bare Snakefile, {images} `sleep {seconds}` jobs, gpu={gpus}: "
            f"wall-clock {bare:.1f} s, {int(images) / bare:.1f} jobs/s, efficiency "
            f"{work_s / (bare * int(gpus)):.3f} (Snakemake's own floor)",
            flush=True,
        )


if __name__ == "__main__":
    main()
