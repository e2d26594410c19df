"""Stage 5 on hand-made per-image files whose overlaps are known in closed form."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from multigeom_workflow.results.alignment import align_configs

P, K = 64 * 64, 4
THETAS = (0.3, 1.1)  # rotation angle of configuration "rotated" on images 0 and 1


def basis(rows) -> torch.Tensor:
    """Unit vectors e_r of R^P, one per row, of shape (len(rows), P)."""
    v = torch.zeros(len(rows), P)
    v[torch.arange(len(rows)), torch.tensor(rows)] = 1.0
    return v


def eigenvectors(kind: str, theta: float) -> torch.Tensor:
    """
    reference: e_0..e_3; same: the same; orthogonal: e_4..e_7; rotated: e_0 turned by
    theta towards e_100, then e_1..e_3.
    """
    if kind in ("reference", "same"):
        return basis(range(K))
    if kind == "orthogonal":
        return basis(range(K, 2 * K))
    v = basis(range(K))
    v[0] = math.cos(theta) * basis([0])[0] + math.sin(theta) * basis([100])[0]
    return v


def write_per_image(root, encoder, area, kind, index):
    vecs = eigenvectors(kind, THETAS[index % 2])
    path = root / "per_image" / encoder / area / f"img{index:04d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = torch.tensor([4.0, 3.0, 2.0, 1.0])
    torch.save(
        {
            "img_idx": index,
            "image": torch.zeros(1, 1, 64, 64),
            "encoder_name": encoder,
            "area": area,
            "G_eigenvalues": values,
            "G_eigenvectors": vecs,
            "J_eigenvalues": values,
            "J_eigenvectors": vecs,
            "estimator": "conditional_pair",
            "sigma": 0.22,
            "elapsed_seconds": 1.0,
            "diffusion_epoch": 1,
            "provenance": None,
        },
        path,
    )
    return path


CONFIGS = {
    ("inception", "V1"): "reference",
    ("resnet50", "V1"): "same",
    ("inception", "V4"): "orthogonal",
    ("resnet50", "V4"): "rotated",
}


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    files = [
        write_per_image(root, enc, area, kind, i)
        for (enc, area), kind in CONFIGS.items()
        for i in range(2)
    ]
    return root, files


def pair(metrics, a, b, metric="G"):
    return metrics["pairs"][f"{a[0]}_{a[1]}__VS__{b[0]}_{b[1]}__{metric}"]


@pytest.mark.process
@pytest.mark.parametrize("metric", ["G", "J"])
def test_known_overlaps(runs, tmp_path, metric):
    _, files = runs
    m = align_configs(files, tmp_path / "metrics.json", max_k=K)
    ref = ("inception", "V1")
    same = pair(m, ref, ("resnet50", "V1"), metric)
    assert same["alignment_mean"] == pytest.approx([1.0] * K)
    assert same["alignment_sem"] == pytest.approx([0.0] * K, abs=1e-12)
    assert pair(m, ref, ("inception", "V4"), metric)["alignment_mean"] == pytest.approx(
        [0.0] * K
    )
    # One of k orthonormal vectors turned by theta out of the span: (k-1+cos²θ)/k
    rotated = pair(m, ref, ("resnet50", "V4"), metric)
    per_image = np.array(
        [[(k - 1 + math.cos(t) ** 2) / k for k in range(1, K + 1)] for t in THETAS]
    )
    assert rotated["alignment_mean"] == pytest.approx(per_image.mean(0))
    assert rotated["alignment_sem"] == pytest.approx(per_image.std(0, ddof=1) / 2**0.5)
    assert rotated["n_images"] == 2 and rotated["k"] == list(range(1, K + 1))


@pytest.mark.process
def test_only_the_listed_files_are_compared(runs, tmp_path):
    root, files = runs
    # An extra image and an extra configuration beside the run's files.
    write_per_image(root, "inception", "V1", "orthogonal", 2)
    write_per_image(root, "onoff", "V1", "same", 0)
    m = align_configs(files, tmp_path / "metrics.json", max_k=K)
    assert len(m["pairs"]) == 6 * 2
    assert all(p["n_images"] == 2 for p in m["pairs"].values())
    assert json.loads((tmp_path / "metrics.json").read_text())["pairs"] == m["pairs"]


@pytest.mark.process
def test_same_metrics_as_upstreams_command(runs, tmp_path):
    from multigeom.pipeline import alignment

    root, files = runs
    ours = align_configs(files, tmp_path / "ours.json", max_k=K)
    alignment.main(
        ["--runs-dir", str(root), "--out-dir", str(tmp_path / "up"), "--max-k", str(K)]
    )
    theirs = json.loads((tmp_path / "up" / "cross_encoder_metrics.json").read_text())
    assert ours["pairs"] == theirs["pairs"] and ours["named"] == theirs["named"]


def test_fewer_than_two_configurations_is_refused(runs, tmp_path):
    _, files = runs
    with pytest.raises(ValueError, match="at least two"):
        align_configs(files[:2], tmp_path / "m.json", max_k=K)
    assert not (tmp_path / "m.json").exists()
