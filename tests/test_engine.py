"""
The fast engine against upstream's estimator on the demo's models: the same eigenvalues
(1e-4 relative), the same subspaces (per-image A_k >= 0.999 for every k), the same
Stage 5 metrics (1e-4), the same file format; warm = cold and split invariance; the
settings `engine` and `precision`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import CONFIGURATIONS, REPO, TINY_CONFIG, planned_jobs, run_snakemake

from multigeom_workflow.compute.engine import (
    estimate_image_fast,
    rows_per_call,
    top_eigenpairs,
)
from multigeom_workflow.compute.estimate import estimate_to_file, load_models
from multigeom_workflow.inputs.images import load_test_image
from multigeom_workflow.results.alignment import align_configs
from multigeom_workflow.scenario import ConfigError, validated_scenario
from multigeom_workflow.settings.files import to_namespace

DIFFUSION = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
TINY = yaml.safe_load((REPO / "tests/data/estimator_tiny.yaml").read_text())
DEMO = yaml.safe_load((REPO / "config/estimator_demo.yaml").read_text())
# The paper's grid (24 timesteps, 40..960) with fewer samples, several batches each.
PAPER_LIKE = yaml.safe_load((REPO / "tests/data/estimator_tiny.yaml").read_text())
PAPER_LIKE["monte_carlo"].update(
    n_samples=4, batch_size=2, timestep_grid={"start": 40, "stop": 960, "step": 40}
)
N_IMAGES = 2


def with_top_k(estimator: dict, top_k: int) -> dict:
    est = json.loads(json.dumps(estimator))
    est["top_k"] = top_k
    est["fisher_baseline"]["top_k"] = top_k
    return est


def models_of(run, encoder, area):
    return load_models(
        run / f"runs/encoders/{encoder}/{area}/best_model.pt",
        run / f"runs/diffusion/{encoder}/{area}/final_model.pt",
        DIFFUSION,
        "cpu",
    )


def photo(run, index):
    return run / f"runs/demo/test_images/img{index:04d}.png"


def alignment(U, V, k):
    """A_k = (1/k) ||U_k V_k^T||_F^2, rows of U and V the eigenvectors."""
    return float((U[:k].double() @ V[:k].double().T).pow(2).sum() / k)


def assert_agree(values_a, vectors_a, values_b, vectors_b):
    """Eigenvalues within 1e-4 relative, A_k >= 0.999 for every k."""
    assert values_a.shape == values_b.shape and vectors_a.shape == vectors_b.shape
    torch.testing.assert_close(values_a, values_b, rtol=1e-4, atol=0)
    for k in range(1, len(values_a) + 1):
        assert alignment(vectors_a, vectors_b, k) >= 0.999, k


@pytest.mark.parametrize(
    "estimator, top_k, configuration",
    [
        (DEMO, 50, ("onoff", "complex")),
        (PAPER_LIKE, 50, ("smallcnn", "simple")),
    ],
    ids=["demo-onoff-complex", "paper-grid-smallcnn-simple"],
)
def test_fast_agrees_with_upstream(tiny_run, estimator, top_k, configuration):
    from multigeom.pipeline.per_image import estimate_image

    m = models_of(tiny_run, *configuration)
    cfg = to_namespace(with_top_k(estimator, top_k))
    x = load_test_image(photo(tiny_run, 1)).unsqueeze(0)
    args = (x, m.encoder, m.unet, m.alphas_cumprod, cfg)
    g_up, j_up = estimate_image(*args, seed=43, device=m.device)
    # The eigen-step of a GPU (float64 Gram matrix), that of the CPU being upstream's.
    g_fast, j_fast = estimate_image_fast(*args, seed=43, device=m.device, eigen="gram")
    assert g_fast.eigenvalues.shape == (top_k,)
    assert_agree(
        g_fast.eigenvalues, g_fast.eigenvectors, g_up.eigenvalues, g_up.eigenvectors
    )
    assert_agree(
        j_fast.eigenvalues, j_fast.eigenvectors, j_up.eigenvalues, j_up.eigenvectors
    )
    # Another seed draws other numbers: the agreement is not that of any two runs.
    g_other, _ = estimate_image_fast(*args, seed=44, device=m.device)
    assert alignment(g_other.eigenvectors, g_up.eigenvectors, 1) < 0.999


@pytest.mark.parametrize("shape", [(600, 256), (100, 256)], ids=["DtD", "DDt"])
def test_gram_eigenpairs_are_those_of_the_svd(shape):
    g = torch.Generator().manual_seed(0)
    D = torch.randn(*shape, generator=g) * torch.logspace(0, -2, shape[1])
    values, vectors = top_eigenpairs(D, 50, "gram")
    expected, expected_vectors = top_eigenpairs(D, 50, "svd")
    assert values.shape == (50,) and vectors.shape == (50, 256)
    assert_agree(values, vectors, expected, expected_vectors)
    # Every row is an eigenvector of D^T D with its eigenvalue.
    G = D.double().T @ D.double()
    residual = G @ vectors.double().T - vectors.double().T * values.double()
    assert float(residual.norm(dim=0).max()) <= 1e-5 * float(values[0])
    with pytest.raises(ValueError, match="eigen method 'qr'"):
        top_eigenpairs(D, 5, "qr")


def test_upstream_files_give_the_same_stage5_metrics(tiny_run, tmp_path):
    """
    The reduced demo's files (fast engine) against upstream's files of the same images:
    same format, per-image agreement, Stage 5 metrics within 1e-4.
    """
    est = with_top_k(TINY, 5)
    upstream_files, fast_files = [], []
    for encoder, area in CONFIGURATIONS:
        m = models_of(tiny_run, encoder, area)
        for i in range(N_IMAGES):
            name = f"{encoder}/{area}/img{i:04d}.pt"
            out = tmp_path / "upstream/per_image" / name
            estimate_to_file(
                m, photo(tiny_run, i), i, out, est, encoder_name=encoder, area=area,
                provenance_record={"seed": 42}, engine="upstream",
            )  # fmt: skip
            upstream_files.append(out)
            fast_files.append(tiny_run / "runs/per_image" / name)
    for up_file, fast_file in zip(upstream_files, fast_files, strict=True):
        up, fast = (torch.load(f, weights_only=False) for f in (up_file, fast_file))
        assert set(up) == set(fast)
        for key, value in up.items():
            assert type(fast[key]) is type(value), key
            if isinstance(value, torch.Tensor):
                assert (fast[key].dtype, fast[key].shape) == (value.dtype, value.shape)
        for key in ("img_idx", "encoder_name", "area", "estimator", "sigma"):
            assert fast[key] == up[key], key
        assert torch.equal(fast["image"], up["image"])
        assert (up["provenance"]["engine"], up["provenance"]["precision"]) == (
            "upstream",
            "fp32",
        )
        assert (fast["provenance"]["engine"], fast["provenance"]["precision"]) == (
            "fast",
            "fp32",
        )
        for what in ("G", "J"):
            assert_agree(
                fast[f"{what}_eigenvalues"],
                fast[f"{what}_eigenvectors"],
                up[f"{what}_eigenvalues"],
                up[f"{what}_eigenvectors"],
            )
    ours = align_configs(fast_files, tmp_path / "fast.json", 5)["pairs"]
    theirs = align_configs(upstream_files, tmp_path / "upstream.json", 5)["pairs"]
    assert set(ours) == set(theirs) and len(ours) == 12
    for label, pair in theirs.items():
        for key in ("alignment_mean", "bures_wasserstein_mean"):
            torch.testing.assert_close(
                torch.tensor(ours[label][key]), torch.tensor(pair[key]),
                rtol=0, atol=1e-4,
            )  # fmt: skip


# One cold process, images in another order than the warm workers of the run had them.
COLD = """
import json, sys, torch
torch.set_num_threads(1)
from multigeom_workflow.compute.estimate import estimate_to_file, load_models
job = json.loads(sys.argv[1])
models = load_models(job["encoder"], job["diffusion"], job["diffusion_settings"], "cpu")
for i in job["indices"]:
    estimate_to_file(models, job["images"][i], i, f"{job['out']}/img{i:04d}.pt",
                     job["estimator"], encoder_name="onoff", area="complex",
                     engine="fast")
"""


def test_fast_cold_equals_warm_whatever_the_split(tiny_run, tmp_path):
    job = {
        "encoder": str(tiny_run / "runs/encoders/onoff/complex/best_model.pt"),
        "diffusion": str(tiny_run / "runs/diffusion/onoff/complex/final_model.pt"),
        "diffusion_settings": DIFFUSION,
        "estimator": with_top_k(TINY, 5) | {"seed": 42},
        "images": [str(photo(tiny_run, i)) for i in range(N_IMAGES)],
        "indices": [1, 0],
        "out": str(tmp_path),
    }
    subprocess.run(
        [sys.executable, "-c", COLD, json.dumps(job)], check=True, capture_output=True
    )
    for i in range(N_IMAGES):
        cold = torch.load(tmp_path / f"img{i:04d}.pt", weights_only=False)
        warm = torch.load(
            tiny_run / f"runs/per_image/onoff/complex/img{i:04d}.pt", weights_only=False
        )
        assert warm["provenance"]["engine"] == "fast"
        for key in ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues"):
            assert torch.equal(cold[key], warm[key]), key


def test_changing_the_engine_recomputes_nothing(tiny_run):
    result = run_snakemake(tiny_run, "-n", "--config", "engine=upstream")
    assert result.returncode == 0, result.stderr
    assert planned_jobs(result) == {}


def test_the_estimate_prices_with_the_engine_figures(tiny_copy):
    (tiny_copy / "runs/per_image/onoff/simple/img0001.pt").unlink()
    fast = run_snakemake(tiny_copy, "-n")
    assert fast.returncode == 0, fast.stderr
    assert planned_jobs(fast)["estimate_image"] == 1
    assert "median of 7 per-image files computed by engine fast on cpu" in (
        fast.stdout + fast.stderr
    )
    # The run's files are the fast engine's: no measurement for upstream.
    upstream = run_snakemake(tiny_copy, "-n", "--config", "engine=upstream")
    assert upstream.returncode == 0, upstream.stderr
    assert "engine upstream's default 885 s on a 32-core CPU" in (
        upstream.stdout + upstream.stderr
    )


def test_measured_seconds_are_those_of_the_engine(tmp_path):
    from multigeom_workflow.planning.cost import read_timings

    prov = {"device": "cuda:0", "device_name": "NVIDIA H200"}
    for name, seconds, engine in [("a", 1.0, "fast"), ("b", 9.0, "upstream")]:
        record = prov | {"engine": engine, "precision": "fp32"}
        torch.save(
            {"elapsed_seconds": seconds, "provenance": record}, tmp_path / f"{name}.pt"
        )
    torch.save({"elapsed_seconds": 8.0, "provenance": prov}, tmp_path / "old.pt")
    files = sorted(tmp_path.glob("*.pt"))
    assert [t[2] for t in read_timings(files, engine="fast")] == [1.0]
    # Files written before the engine was recorded are upstream's.
    assert sorted(t[2] for t in read_timings(files, engine="upstream")) == [8.0, 9.0]
    assert len(read_timings(files)) == 3


def test_measured_seconds_are_those_of_the_precision(tmp_path):
    from multigeom_workflow.planning.cost import read_timings

    gpu = {"device": "cuda:0", "device_name": "NVIDIA H200", "engine": "fast"}
    flags = {"arithmetic": {"conv_tf32": False, "matmul_tf32": False}}
    records = {
        "ieee": (3.0, gpu | flags | {"precision": "fp32"}),
        "tf32": (1.0, gpu | flags | {"precision": "tf32"}),
        # Before the switches were set, "fp32" on a GPU ran PyTorch's defaults: tf32.
        "old-gpu": (1.5, gpu | {"precision": "fp32"}),
        "old-cpu": (9.0, gpu | {"device": "cpu", "precision": "fp32"}),
    }
    for name, (seconds, prov) in records.items():
        torch.save(
            {"elapsed_seconds": seconds, "provenance": prov}, tmp_path / f"{name}.pt"
        )
    files = sorted(tmp_path.glob("*.pt"))
    seconds = {
        precision: sorted(t[2] for t in read_timings(files, precision=precision))
        for precision in ("fp32", "tf32")
    }
    assert seconds == {"fp32": [3.0, 9.0], "tf32": [1.0, 1.5]}


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"engine": "upstream", "precision": "tf32"},
            "config key 'precision' = 'tf32' needs a CUDA device.*allowed.*fp32",
        ),
        ({"precision": "tf32"}, "'precision' = 'tf32' needs a CUDA device"),
        ({"precision": "bf16"}, "precision.*'bf16'.*fp32"),
        ({"engine": "turbo"}, "engine.*'turbo'.*upstream"),
    ],
)
def test_bad_engine_settings_are_refused(changes, message):
    config = yaml.safe_load(TINY_CONFIG.read_text()) | changes
    with pytest.raises(ConfigError, match=message):
        validated_scenario(config, REPO)


def test_rows_per_call_follows_the_batch_and_the_cap(monkeypatch):
    cpu = torch.device("cpu")
    assert rows_per_call(None, 50, 4800, cpu, 25) == 25
    monkeypatch.setenv("MULTIGEOM_FAST_ROWS", "10")
    assert rows_per_call(None, 50, 4800, cpu, 25) == 10
    monkeypatch.setenv("MULTIGEOM_FAST_ROWS", "many")
    with pytest.raises(ValueError, match="MULTIGEOM_FAST_ROWS = 'many'"):
        rows_per_call(None, 50, 4800, cpu, 25)
