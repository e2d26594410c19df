"""
How long `snakemake -n` takes to plan a paper-sized scenario (4 configurations x 200
images) and a large one (4 x 10,000), estimate included, with each profile (local-gpu,
modal, slurm), each beside a bare Snakefile with the same number of trivial jobs
(Snakemake's own floor; no input functions), timed in the same run. Goal: at most
1.5 x the bare figure at 10,000 images per configuration, with every profile. The
bare Snakefile is also timed with the profile itself (less its `logger:` line, the
workflow's own plugin): what the profile's settings alone cost Snakemake (the slurm
profile's set-resources, say); and with the garbage collector's thresholds the
workflow sets in its Snakemake process (`snakemake_adapter.GC_THRESHOLDS`): what the
workflow costs beyond the collector's setting.

The scenario: inception and resnet50 fitted to V1 and V4, with checkpoint files of
their own (empty stand-ins: a dry run does not read them), a folder of 10,000 test image
files (empty too) and torchvision's weight files in a private TORCH_HOME. Nothing is
computed; the job list goes to /dev/null.

Usage: python benchmarks/dryrun_speed.py [--images 200 10000] [--repeat 3]
                                        [--profiles local-gpu modal slurm]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from multigeom_workflow.compute.standin import write_test_images
from multigeom_workflow.snakemake_adapter import GC_THRESHOLDS

REPO = Path(__file__).resolve().parents[1]


def scenario(root: Path, n_images: int, n_files: int) -> Path:
    images = root / "images"
    if not images.is_dir():
        images.mkdir()
        write_test_images(images, n_files)
    configs = []
    for enc in ("inception", "resnet50"):
        for area in ("V1", "V4"):
            ckpts = {}
            for kind in ("encoder", "diffusion"):
                path = root / "ckpt" / f"{kind}-{enc}-{area}.pt"
                path.parent.mkdir(exist_ok=True)
                path.touch()
                ckpts[f"{kind}_ckpt"] = str(path)
            configs.append({"encoder": enc, "area": area, **ckpts})
    config = {
        "configs": configs,
        "n_images": n_images,
        "estimator": "estimator",
        "diffusion": "diffusion",
        "device": "cuda",
        "test_images": {"source": "folder", "path": str(images)},
    }
    path = root / f"config-{n_images}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


BARE = """
rule all:
    input: expand("per_image/{{c}}/img{{i:04d}}.pt", c=range(4), i=range({n}))

rule estimate_image:
    output: "per_image/{{c}}/img{{i}}.pt"
    resources: gpu=1
    shell: "touch {{output}}"
"""


def timed(cmd: list[str], env: dict, repeat: int) -> list[tuple[float, float]]:
    """(wall-clock, CPU seconds) of `repeat` runs of `cmd` (CPU: user + system of the
    process, less sensitive than wall-clock to other work on a shared machine)."""
    times = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        times.append((wall, cpu))
        if out.returncode != 0:
            sys.exit(out.stderr[-3000:])
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--images", type=int, nargs="+", default=[200, 10_000])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profiles", nargs="+", default=["local-gpu", "modal", "slurm"])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = root / "torch" / "hub" / "checkpoints"
        weights.mkdir(parents=True)
        for name in ("inception_v3_google-0cc3c7bd.pth", "resnet50-11ad3fa6.pth"):
            (weights / name).touch()
        env = {**os.environ, "TORCH_HOME": str(root / "torch")}
        work = root / "work"
        work.mkdir()
        for n in args.images:
            config = scenario(root, n, max(args.images))
            bare_dir = root / f"bare-{n}"
            bare_dir.mkdir(exist_ok=True)
            (bare_dir / "Snakefile").write_text(BARE.format(n=n))
            bare = [sys.executable, "-m", "snakemake", "-n", "--directory"]
            bare += [str(bare_dir), "-s", str(bare_dir / "Snakefile")]
            gc_snakefile = bare_dir / "Snakefile-gc"
            gc_snakefile.write_text(
                f"import gc\ngc.set_threshold{GC_THRESHOLDS}\n" + BARE.format(n=n)
            )
            bare_gc = [sys.executable, "-m", "snakemake", "-n", "--directory"]
            bare_gc += [str(bare_dir), "-s", str(gc_snakefile), "--cores", "2"]
            for profile in args.profiles:
                bare_profile = root / f"bare-profile-{profile}"
                bare_profile.mkdir(exist_ok=True)
                text = (REPO / "profiles" / profile / "profile.yaml").read_text()
                (bare_profile / "profile.yaml").write_text(
                    "\n".join(
                        line
                        for line in text.splitlines()
                        if not line.startswith("logger:")
                    )
                )
                cmd = [sys.executable, "-m", "snakemake", "-n"]
                cmd += ["-s", str(REPO / "Snakefile"), "--directory", str(work)]
                cmd += ["--configfile", str(config)]
                cmd += ["--profile", str(REPO / "profiles" / profile)]
                # side by side: the workflow's run, then the bare Snakefile's
                times, bare_times, profiled, collected = [], [], [], []
                for _ in range(args.repeat):
                    times += timed(cmd, env, 1)
                    bare_times += timed([*bare, "--cores", "2"], env, 1)
                    profiled += timed([*bare, "--profile", str(bare_profile)], env, 1)
                    collected += timed(bare_gc, env, 1)
                best, bare_best = min(times), min(bare_times)
                cpu, bare_cpu = min(c for _, c in times), min(c for _, c in bare_times)
                profiled_cpu = min(c for _, c in profiled)
                gc_cpu = min(c for _, c in collected)
                print(
                    f"snakemake -n --profile {profile}, 4 configurations x {n:,} "
                    f"images: {best[0]:.1f} s wall-clock, {cpu:.1f} s CPU (best of "
                    f"{args.repeat}); bare Snakefile with {4 * n + 1:,} trivial jobs: "
                    f"{bare_best[0]:.1f} s, {bare_cpu:.1f} s CPU; ratio "
                    f"{best[0] / bare_best[0]:.2f} wall-clock, "
                    f"{cpu / bare_cpu:.2f} CPU; the bare Snakefile with the profile: "
                    f"{profiled_cpu:.1f} s CPU ({profiled_cpu / bare_cpu:.2f} x the "
                    f"bare one; the workflow {cpu / profiled_cpu:.2f} x it); the bare "
                    f"Snakefile with the workflow's GC thresholds: {gc_cpu:.1f} s CPU "
                    f"(the workflow {cpu / gc_cpu:.2f} x it)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
