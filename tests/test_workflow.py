"""The whole workflow on the reduced demo: outputs, a second run, resuming."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from conftest import CONFIGURATIONS, REPO, planned_jobs, run_snakemake

from multigeom_workflow.inputs.images import load_test_image

# The keys upstream's multigeom.pipeline.per_image.estimate_images writes.
UPSTREAM_KEYS = {
    "img_idx",
    "image",
    "encoder_name",
    "area",
    "G_eigenvalues",
    "G_eigenvectors",
    "J_eigenvalues",
    "J_eigenvectors",
    "estimator",
    "sigma",
    "elapsed_seconds",
    "diffusion_epoch",
    "provenance",
}
N_IMAGES, TOP_K = 2, 5


def per_image_files(workdir):
    return sorted((workdir / "runs" / "per_image").glob("*/*/img*.pt"))


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_per_image_files_have_upstream_layout_and_keys(tiny_run):
    files = per_image_files(tiny_run)
    expected = sorted(
        tiny_run / "runs" / "per_image" / enc / area / f"img{i:04d}.pt"
        for enc, area in CONFIGURATIONS
        for i in range(N_IMAGES)
    )
    assert files == expected
    for f in files:
        d = torch.load(f, weights_only=False)
        assert set(d) == UPSTREAM_KEYS
        i = int(f.stem[3:])
        assert (d["img_idx"], d["encoder_name"], d["area"]) == (
            i,
            f.parent.parent.name,
            f.parent.name,
        )
        assert d["G_eigenvectors"].shape == (TOP_K, 64 * 64)
        assert d["J_eigenvectors"].shape == (TOP_K, 64 * 64)
        assert torch.all(d["G_eigenvalues"][:-1] >= d["G_eigenvalues"][1:])
        # The image is the demo's photograph i through upstream's canonical transform.
        photo = tiny_run / "runs" / "demo" / "test_images" / f"img{i:04d}.png"
        assert torch.equal(d["image"], load_test_image(photo).unsqueeze(0))
        assert d["estimator"] == "conditional_pair" and d["sigma"] == 0.22


def test_stage5_and_figure_are_written(tiny_run):
    metrics = json.loads(
        (tiny_run / "runs" / "metrics" / "cross_encoder_metrics.json").read_text()
    )
    # 4 configurations: 6 pairs, each for G and for J.
    assert len(metrics["pairs"]) == 12
    for pair in metrics["pairs"].values():
        assert pair["n_images"] == N_IMAGES
        assert pair["k"] == list(range(1, TOP_K + 1))
        assert all(0.0 <= a <= 1.0 + 1e-5 for a in pair["alignment_mean"])  # float32
    assert "cross_model_complex_onoff_smallcnn__G" in metrics["named"]
    png = (tiny_run / "results" / "fig4de.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert (tiny_run / "results" / "fig4de.pdf").read_bytes().startswith(b"%PDF")
    # the eigenvectors as pictures (eigenvector_images: 2 by default, both images)
    png = (tiny_run / "results" / "eigenvectors.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    pdf = tiny_run / "results" / "eigenvectors.pdf"
    assert pdf.read_bytes().startswith(b"%PDF")
    assert (tiny_run / "logs" / "plot_eigenvectors.log").is_file()
    for rule in (
        "estimate_image/onoff/complex/img0000",
        "train_demo_diffusion/onoff/complex",
    ):
        assert (tiny_run / "logs" / f"{rule}.log").is_file()
    bench = tiny_run / "logs" / "benchmarks" / "train_demo_diffusion" / "onoff"
    assert (bench / "complex.tsv").read_text().startswith("s\t")
    # the per-image jobs have no benchmark file: the check's list records each file's
    # own elapsed_seconds, which the report's seconds per image are
    from multigeom_workflow.results.verify import checked_seconds

    seconds = checked_seconds(tiny_run / "runs" / "metrics" / "per_image_checked.tsv")
    f = "runs/per_image/onoff/complex/img0000.pt"
    recorded = torch.load(tiny_run / f, weights_only=False)["elapsed_seconds"]
    assert seconds[f] == pytest.approx(float(recorded)) and seconds[f] > 0
    assert not (tiny_run / "logs" / "benchmarks" / "estimate_image").exists()
    progress = (tiny_run / "results" / "report" / "progress.html").read_text()
    assert "timed" in progress


def test_second_run_has_nothing_to_do(finished_dry_run):
    result = finished_dry_run
    assert planned_jobs(result) == {}
    assert "Nothing to be done" in result.stdout + result.stderr


def test_resume_recomputes_only_the_deleted_image(tiny_copy):
    files = per_image_files(tiny_copy)
    before = {f: (digest(f), f.stat().st_mtime_ns) for f in files}
    victim = tiny_copy / "runs" / "per_image" / "onoff" / "simple" / "img0001.pt"
    original = torch.load(victim, weights_only=False)
    victim.unlink()

    dry = run_snakemake(tiny_copy, "-n")
    assert dry.returncode == 0, dry.stderr
    jobs = planned_jobs(dry)
    assert jobs["estimate_image"] == 1
    # Stage 5, the figure, the report's tables, the alignments with the ground
    # truth and the noise ceiling (after the per-image check), and the eigenvector
    # pictures (image 1 is among them); the ceiling's second estimate (image 0 only)
    # is not redone.
    assert set(jobs) == {
        "estimate_image",
        "verify_per_image_files",
        "align_ceiling",
        "align_configs",
        "plot_fig4de",
        "plot_eigenvectors",
        "summarize_run",
        "align_truth",
        "plot_ground_truth",
        "all",
    }

    result = run_snakemake(tiny_copy)
    assert result.returncode == 0, result.stderr[-3000:]
    for f, (sha, mtime) in before.items():
        if f != victim:
            assert (digest(f), f.stat().st_mtime_ns) == (sha, mtime), f
    redone = torch.load(victim, weights_only=False)
    for key in ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues", "J_eigenvectors"):
        assert torch.equal(redone[key], original[key]), key


@pytest.mark.workflow
def test_lint_is_clean(tmp_path):
    """
    `snakemake --lint` reports nothing, on the paper's configuration, which defines
    every rule (the demo's and the fetching ones); each rule names the conda
    environment of environment.yml (README.md, "On a fresh machine").
    """
    paper = REPO / "config" / "paper.yaml"
    result = run_snakemake(tmp_path, "--lint", configfile=paper, timeout=180)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert "Lints for" not in text, text[-3000:]
    assert "Congratulations, your workflow is in a good condition!" in text
