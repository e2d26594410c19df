"""
The per-image estimation: results independent of how images are split over processes
and in which order they come, and files that appear only when complete.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG

from multigeom_workflow.compute.estimate import estimate_to_file, load_models

TENSORS = (
    "image",
    "G_eigenvalues",
    "G_eigenvectors",
    "J_eigenvalues",
    "J_eigenvectors",
)
ENCODER, AREA = "onoff", "complex"
INDICES = (0, 1, 2)

# One process, the images in the given order (the models loaded once).
WORKER = """
import json, sys, torch
torch.set_num_threads(1)
from multigeom_workflow.compute.estimate import estimate_to_file, load_models
job = json.loads(sys.argv[1])
models = load_models(job["encoder"], job["diffusion"], job["diffusion_settings"], "cpu")
for i in job["indices"]:
    estimate_to_file(models, job["images"][i], i, f"{job['out']}/img{i:04d}.pt",
                     job["estimator"], encoder_name=job["name"][0], area=job["name"][1],
                     engine=job["engine"])
"""


def settings(seed=42, top_k=5):
    est = yaml.safe_load((REPO / "tests/data/estimator_tiny.yaml").read_text())
    est.update(seed=seed, top_k=top_k)
    est["fisher_baseline"]["top_k"] = top_k
    diff = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
    return est, diff


def run_worker(tiny_run, out, indices):
    est, diff = settings()
    job = {
        "encoder": str(tiny_run / f"runs/encoders/{ENCODER}/{AREA}/best_model.pt"),
        "diffusion": str(tiny_run / f"runs/diffusion/{ENCODER}/{AREA}/final_model.pt"),
        "diffusion_settings": diff,
        "estimator": est,
        "images": [
            str(tiny_run / f"runs/demo/test_images/img{i:04d}.png") for i in INDICES
        ],
        "indices": list(indices),
        "out": str(out),
        "name": [ENCODER, AREA],
        # the engine of the workflow's own files (compared below)
        "engine": yaml.safe_load(TINY_CONFIG.read_text()).get("engine", "fast"),
    }
    cmd = [sys.executable, "-c", WORKER, json.dumps(job)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def load(path):
    return torch.load(path, weights_only=False)


def assert_same(a, b):
    for key in TENSORS:
        assert torch.equal(a[key], b[key]), key
    assert (a["img_idx"], a["encoder_name"], a["area"]) == (
        b["img_idx"],
        b["encoder_name"],
        b["area"],
    )


def test_split_invariance(tiny_run, tmp_path):
    """One process, the reverse order, and the middle image in a process of its own
    agree exactly: each image is first and last of a process (2 then 0 in the
    reverse order), and the middle one alone."""
    together, apart, reverse = (tmp_path / n for n in ("together", "apart", "reverse"))
    run_worker(tiny_run, together, INDICES)
    run_worker(tiny_run, reverse, reversed(INDICES))
    middle = INDICES[len(INDICES) // 2]
    run_worker(tiny_run, apart, [middle])
    assert_same(
        load(together / f"img{middle:04d}.pt"), load(apart / f"img{middle:04d}.pt")
    )
    for i in INDICES:
        name = f"img{i:04d}.pt"
        ref = load(together / name)
        assert ref["img_idx"] == i
        assert_same(ref, load(reverse / name))
        # The workflow's own jobs (one Snakemake job per image) agree too.
        ran = tiny_run / f"runs/per_image/{ENCODER}/{AREA}/{name}"
        if ran.exists():
            assert_same(ref, load(ran))


def test_the_seed_of_image_i_is_seed_plus_i(tiny_run, tmp_path):
    """Image 1 of a run seeded 42 is upstream's `estimate_image` with seed 43."""
    from multigeom.pipeline.per_image import estimate_image

    from multigeom_workflow.inputs.images import load_test_image
    from multigeom_workflow.settings.files import to_namespace

    torch.set_num_threads(1)
    models = load_models(
        tiny_run / f"runs/encoders/{ENCODER}/{AREA}/best_model.pt",
        tiny_run / f"runs/diffusion/{ENCODER}/{AREA}/final_model.pt",
        settings()[1],
        "cpu",
    )
    image = tiny_run / "runs/demo/test_images/img0001.png"
    est = settings(42)[0]
    out = estimate_to_file(
        models, image, 1, tmp_path / "img0001.pt", est, encoder_name=ENCODER, area=AREA
    )
    ours = load(out)

    def upstream(seed):
        x = load_test_image(image).unsqueeze(0)
        args = (
            x,
            models.encoder,
            models.unet,
            models.alphas_cumprod,
            to_namespace(est),
        )
        return estimate_image(*args, seed=seed, device=models.device)

    g, j = upstream(43)
    assert torch.equal(ours["G_eigenvectors"], g.eigenvectors)
    assert torch.equal(ours["J_eigenvectors"], j.eigenvectors)
    assert not torch.equal(ours["G_eigenvectors"], upstream(42)[0].eigenvectors)


class Failing(torch.nn.Module):
    """An encoder that fails on its first call, as a job killed mid-way would."""

    n_neurons = 50

    def forward(self, x):
        raise RuntimeError("killed mid-way")


def test_a_failed_estimate_leaves_no_file(tiny_run, tmp_path):
    models = load_models(
        tiny_run / f"runs/encoders/{ENCODER}/{AREA}/best_model.pt",
        tiny_run / f"runs/diffusion/{ENCODER}/{AREA}/final_model.pt",
        settings()[1],
        "cpu",
    )
    models.encoder = Failing()
    out = tmp_path / "per_image" / "img0000.pt"
    with pytest.raises(RuntimeError, match="killed mid-way"):
        estimate_to_file(
            models,
            tiny_run / "runs/demo/test_images/img0000.png",
            0,
            out,
            settings()[0],
            encoder_name=ENCODER,
            area=AREA,
        )
    assert list(out.parent.iterdir()) == []
