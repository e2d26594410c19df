"""
The eigenvectors as pictures (`multigeom_workflow.results.eigenvectors`): per-image
results with known eigenvectors, read back from the figure's images.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG, run_snakemake

from multigeom_workflow.results.eigenvectors import (
    align_signs,
    orient_signs,
    panel_label,
    plot_eigenvectors,
    read_per_image_files,
)
from multigeom_workflow.results.figure import save_figure
from multigeom_workflow.scenario import ConfigError, validated_scenario

K, P = 4, 64 * 64
CONFIGS = (("onoff", "complex"), ("smallcnn", "complex"))


def basis(seed: int) -> np.ndarray:
    """K orthonormal rows of length P whose largest-magnitude pixel is positive."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(P, K)))
    v = q.T.copy()
    for row in v:
        row[np.argmax(np.abs(row))] = 0.0
        row[seed * 7 + 1] = 0.5  # the largest pixel, known and positive
        row /= np.linalg.norm(row)
    return v


def result(encoder, area, index, g, j, values=(4.0, 3.0, 2.0, 1.0)):
    return {
        "img_idx": index,
        "encoder_name": encoder,
        "area": area,
        "image": torch.linspace(-1, 1, P).reshape(1, 1, 64, 64) * (index + 1) / 2,
        "G_eigenvalues": torch.tensor(values),
        "G_eigenvectors": torch.from_numpy(g).float(),
        "J_eigenvalues": torch.tensor([8.0, 1.0, 0.5, 0.5]),
        "J_eigenvectors": torch.from_numpy(j).float(),
    }


@pytest.fixture
def runs():
    """
    Two configurations x two images, and the ceiling's second estimate of image 0.
    Known signs, image 0: the first configuration's G is g0 with v1 negated (its
    largest pixel negative); the second configuration's G and the second estimate's
    are -h, h being g0 with v1's largest pixel negated: their v1 has its largest pixel
    positive, but points against g0's v1 (dot product 1 - 2 * 0.5**2 / 1.25 < 0 after
    the negation), so the largest-pixel rule alone would keep -h's v1, the alignment
    flips it.
    """
    g0, j0, g1, j1 = basis(1), basis(2), basis(3), basis(4)
    stored = g0.copy()
    stored[0] *= -1
    h = g0.copy()
    h[0, np.argmax(np.abs(h[0]))] *= -1
    assert -h[0] @ g0[0] < 0 and np.max(-h[0]) == np.max(np.abs(h[0]))
    first = [
        result(*CONFIGS[0], 0, stored, j0),
        result(*CONFIGS[1], 0, -h, j1),
        result(*CONFIGS[0], 1, g1, j0),
        result(*CONFIGS[1], 1, g1, j1),
    ]
    second = [result(*CONFIGS[0], 0, -h, j0)]
    return first, second, {"g0": g0, "h": h, "j0": j0, "j1": j1, "g1": g1}


def image_of(fig, label: str) -> np.ndarray:
    (ax,) = [ax for ax in fig.axes if ax.get_label() == label]
    return np.asarray(ax.images[0].get_array())


def test_panels_one_row_per_image_and_configuration(runs):
    first, second, _ = runs
    fig = plot_eigenvectors(first, second, n_vectors=3)
    drawn = [ax for ax in fig.axes if ax.images]
    # 4 rows x (image + 3 G + 3 J), and 3 G 2nd for the 2 rows of image 0
    assert len(drawn) == 4 * 7 + 3
    expected = {
        panel_label(kind, f"{e}/{a}", i, j)
        for e, a in CONFIGS
        for i in (0, 1)
        for kind, j in [("image", None)]
        + [(k, j) for k in ("G", "J") for j in range(3)]
    } | {panel_label("G 2nd", "onoff/complex", 0, j) for j in range(3)}
    assert {ax.get_label() for ax in drawn} == expected
    # the second configuration has no second estimate: one gray note in its row
    blank = [ax for ax in fig.axes if not ax.images]
    assert len(blank) == 3 * 3  # G 2nd of smallcnn/complex image 0, both of image 1
    notes = [t.get_text() for ax in blank for t in ax.texts]
    assert notes == ["no 2nd\nestimate"] * 3
    # the test image, as stored
    np.testing.assert_array_equal(
        image_of(fig, panel_label("image", "onoff/complex", 1)),
        first[2]["image"].numpy().reshape(64, 64),
    )


def test_plotted_arrays_are_the_eigenvectors_with_the_sign_convention(runs):
    first, second, v = runs
    fig = plot_eigenvectors(first, second, n_vectors=3)
    for j in range(3):
        # image 0: the first row's G is g0 (v1 stored negated, flipped back by its
        # largest pixel); the other configuration's (-h) and the second estimate's
        # (-h) take the sign that agrees with it: h
        got = image_of(fig, panel_label("G", "onoff/complex", 0, j))
        np.testing.assert_allclose(got, v["g0"][j].reshape(64, 64), atol=1e-7)
        for kind, config in (("G", "smallcnn/complex"), ("G 2nd", "onoff/complex")):
            got = image_of(fig, panel_label(kind, config, 0, j))
            np.testing.assert_allclose(got, v["h"][j].reshape(64, 64), atol=1e-7)
        # image 1: g1 as stored (largest pixels positive), in both rows
        for config in ("onoff/complex", "smallcnn/complex"):
            got = image_of(fig, panel_label("G", config, 1, j))
            np.testing.assert_allclose(got, v["g1"][j].reshape(64, 64), atol=1e-7)
        # J: the first row's as stored (largest pixel positive); the second row's j1
        # is flipped by the sign of its dot product with j0
        got = image_of(fig, panel_label("J", "onoff/complex", 0, j))
        np.testing.assert_allclose(got, v["j0"][j].reshape(64, 64), atol=1e-7)
        sign = np.sign(v["j1"][j] @ v["j0"][j])
        got = image_of(fig, panel_label("J", "smallcnn/complex", 0, j))
        np.testing.assert_allclose(got, sign * v["j1"][j].reshape(64, 64), atol=1e-7)
    # each panel on its own symmetric scale, diverging colormap
    ax = next(
        a for a in fig.axes if a.get_label() == panel_label("G", "onoff/complex", 0, 0)
    )
    lo, hi = ax.images[0].get_clim()
    assert hi == -lo == pytest.approx(np.abs(v["g0"][0]).max())
    assert ax.images[0].get_cmap().name == "RdBu_r"
    # the eigenvalue and its share of the top-k sum (4 / (4 + 3 + 2 + 1))
    assert ax.get_title() == "G v1: 40%\nλ = 4"


def test_without_second_estimates_no_such_column(runs, tmp_path):
    first, _, _ = runs
    fig = plot_eigenvectors(first, n_vectors=10)  # more than k = 4: all 4
    labels = {ax.get_label() for ax in fig.axes}
    assert not any(label.startswith("G 2nd") for label in labels)
    assert len(fig.axes) == 4 * (1 + 2 * K)
    save_figure(fig, tmp_path / "e.png", tmp_path / "e.pdf")
    assert (tmp_path / "e.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "e.pdf").read_bytes().startswith(b"%PDF")


def test_sign_helpers():
    v = np.array([[0.1, -0.9, 0.3], [0.5, 0.2, -0.5], [0.0, 0.0, 0.0]])
    # largest |pixel| -0.9: flipped; a tie (0.5, -0.5): the first one decides; zero kept
    np.testing.assert_array_equal(orient_signs(v), [[-0.1, 0.9, -0.3], v[1], v[2]])
    ref = np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(align_signs(v, ref), [-v[0], -v[1], v[2]])
    with pytest.raises(ValueError, match=r"shape \(3, 3\) cannot be aligned"):
        align_signs(v, ref[:2])


def test_reads_per_image_files(tmp_path, runs):
    first, _, _ = runs
    path = tmp_path / "img0000.pt"
    torch.save(first[0], path)
    (read,) = read_per_image_files([path])
    assert torch.equal(read["G_eigenvectors"], first[0]["G_eigenvectors"])


def test_bad_input_is_named(runs):
    first, second, _ = runs
    with pytest.raises(ValueError, match="no per-image result"):
        plot_eigenvectors([])
    with pytest.raises(
        ValueError, match="second estimate of smallcnn/complex image 0 has no first"
    ):
        plot_eigenvectors(first[:1], [dict(second[0], encoder_name="smallcnn")])
    short = dict(first[1], J_eigenvectors=torch.zeros(K, 100))
    with pytest.raises(
        ValueError,
        match=r"J_eigenvectors of smallcnn/complex image 0 has shape \(4, 100\)",
    ):
        plot_eigenvectors([first[0], short])


def dag_inputs(workdir, *config: str) -> list[str] | None:
    """
    The jobs whose outputs rule plot_eigenvectors reads in the reduced demo's DAG
    (``snakemake --dag``, Graphviz text: nodes ``N[label = "rule\\nwildcard: v"...]``,
    edges ``A -> B``), as their labels; None when the rule is not in the DAG.
    """
    result = run_snakemake(workdir, "--dag", "--config", *config)
    assert result.returncode == 0, result.stderr[-2000:]
    labels = dict(re.findall(r'^\t(\d+)\[label = "([^"]*)"', result.stdout, re.M))
    plots = [n for n, label in labels.items() if label == "plot_eigenvectors"]
    if not plots:
        return None
    (plot,) = plots
    edges = re.findall(r"^\t(\d+) -> (\d+)", result.stdout, re.M)
    return sorted(labels[a].replace("\\n", " ") for a, b in edges if b == plot)


@pytest.mark.workflow
def test_rule_reads_only_the_images_it_draws(tmp_path):
    # the first image of each of the 4 configurations, and its second estimate: not
    # image 1, not the check of all per-image files (so it reruns only when one of
    # these changes)
    assert (
        dag_inputs(tmp_path, "eigenvector_images=1")
        == ["estimate_image index: 0000"] * 4
        + ["estimate_image_ceiling index: 0000"] * 4
    )
    # more images than the run has: all of them (here 1), no ceiling when it has none
    assert (
        dag_inputs(
            tmp_path, "n_images=1", "noise_ceiling_images=0", "eigenvector_images=5"
        )
        == ["estimate_image index: 0000"] * 4
    )
    assert dag_inputs(tmp_path, "eigenvector_images=0") is None


@pytest.mark.parametrize("value", [11, -1, "two"])
def test_bad_eigenvector_images_is_one_line(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["eigenvector_images"] = value
    with pytest.raises(ConfigError) as err:
        validated_scenario(config, REPO)
    assert str(err.value) == (
        f"config key 'eigenvector_images' = {value!r}: not allowed; allowed: an "
        "integer >= 0 and <= 10"
    )


def test_eigenvector_images_defaults_to_two(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(TINY_CONFIG.read_text())
    validated_scenario(config, REPO)
    assert config["eigenvector_images"] == 2
