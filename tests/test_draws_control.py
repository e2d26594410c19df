"""
The shared-draws control (issue 49): with shared Monte-Carlo draws, each compared
pair's G(x) alignment on the noise ceiling's images with the draws shared and with
them independent, computed with upstream's `aggregate_pair` and drawn in Fig. 4D.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import REPO
from test_figure import metrics, stats  # noqa: F401  (metrics: a fixture)
from test_scenario import config

from multigeom_workflow.results.figure import plot_fig4de
from multigeom_workflow.results.science import noise_ceiling
from multigeom_workflow.scenario import load_scenario
from multigeom_workflow.settings.names import N_PIXELS

K = 4


def basis(columns) -> torch.Tensor:
    """[K, 4096] rows: the standard basis vectors e_c of image space, c in columns."""
    out = torch.zeros(K, N_PIXELS)
    for row, c in enumerate(columns):
        out[row, c] = 1.0
    return out


def write(folder, encoder, area, index, g_columns) -> str:
    """A per-image file whose top-K G eigenvectors are e_c, c in g_columns."""
    path = folder / encoder / area / f"img{index:04d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "G_eigenvalues": torch.arange(K, 0, -1).double(),
            "G_eigenvectors": basis(g_columns),
            "J_eigenvalues": torch.arange(K, 0, -1).double(),
            "J_eigenvectors": basis(range(K)),
        },
        path,
    )
    return str(path)


def test_the_control_separates_what_the_draws_share(tmp_path):
    # Image i: A's and B's first estimates (shared draws) have the same top
    # eigenvectors e_0..e_3, so A_k = 1 for every k; B's second estimate (independent
    # draws) shares e_0 with them only, so A_k = 1/k (the overlap matrix has one 1).
    first, second = [], []
    for i in range(2):
        first.append(write(tmp_path / "first", "inception", "V1", i, range(K)))
        first.append(write(tmp_path / "first", "resnet50", "V1", i, range(K)))
        first.append(write(tmp_path / "first", "inception", "V4", i, range(K)))
        for enc, area in (("inception", "V1"), ("resnet50", "V1"), ("inception", "V4")):
            write(tmp_path / "second", enc, area, i, [0, 10, 11, 12])
            second.append(str(tmp_path / "second" / enc / area / f"img{i:04d}.pt"))
    pairs = [("inception/V1", "resnet50/V1"), ("inception/V1", "inception/V4")]
    out = tmp_path / "noise_ceiling.json"
    result = noise_ceiling(first, second, K, out, pairs=pairs)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    control = result["shared_draws_control"]
    assert control["seed_offset"] == 10**6
    assert sorted(control["pairs"]) == [
        "inception/V1 vs inception/V4",
        "inception/V1 vs resnet50/V1",
    ]
    entry = control["pairs"]["inception/V1 vs resnet50/V1"]
    assert entry["kind"] == "cross-model"
    assert control["pairs"]["inception/V1 vs inception/V4"]["kind"] == "cross-area"
    assert entry["shared"]["n_images"] == entry["independent"]["n_images"] == 2
    assert entry["shared"]["alignment_mean"] == pytest.approx([1.0] * K)
    assert entry["independent"]["alignment_mean"] == pytest.approx(
        [1 / k for k in range(1, K + 1)]
    )
    assert entry["independent"]["alignment_sem"] == pytest.approx([0.0] * K)
    # the ceiling itself (first against second of one configuration) is unchanged
    ceiling = result["configurations"]["inception/V1"]["G"]["alignment_mean"]
    assert ceiling == pytest.approx([1 / k for k in range(1, K + 1)])
    # no pairs asked: no control
    assert "shared_draws_control" not in noise_ceiling(first, second, K)


def test_the_figure_draws_the_control_in_panel_d_only(metrics):  # noqa: F811
    curve = stats("G", ("inception", "V1"), ("resnet50", "V1"), 0.2)
    ceiling = {
        "configurations": {},
        "shared_draws_control": {
            "pairs": {
                "inception/V1 vs resnet50/V1": {
                    "kind": "cross-model",
                    "shared": curve,
                    "independent": curve,
                }
            }
        },
    }
    fig = plot_fig4de(metrics, ceiling=ceiling, seeds="shared")
    d, e = fig.axes
    label = "independent draws (n = 3): cross-model: inception/V1 vs resnet50/V1"
    (line,) = [ln for ln in d.get_lines() if ln.get_label() == label]
    assert list(line.get_ydata()) == curve["alignment_mean"]
    # the pair's colour, as its main curve
    (main,) = [
        ln
        for ln in d.get_lines()
        if ln.get_label() == "cross-model: inception/V1 vs resnet50/V1"
    ]
    assert line.get_color() == main.get_color()
    assert not [ln for ln in e.get_lines() if "independent" in ln.get_label()]
    assert "round markers in D" in fig._suptitle.get_text()


def test_the_scenario_says_whether_the_control_is_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    configs = [
        {"encoder": "smallcnn", "area": "complex"},
        {"encoder": "widecnn", "area": "complex"},
    ]
    shared = load_scenario(
        config(configs=configs, monte_carlo_seeds="shared", noise_ceiling_images=1),
        REPO,
    )
    assert shared.draws_control_pairs == [("smallcnn/complex", "widecnn/complex")]
    assert shared.draws_control_line.startswith(
        "shared-draws control: Fig. 4D draws, beside each compared pair's G curve, "
        "its curve on the noise ceiling's 1 image(s)"
    )
    off = load_scenario(
        config(
            configs=configs,
            monte_carlo_seeds="shared",
            noise_ceiling_images=1,
            shared_draws_control=False,
        ),
        REPO,
    )
    assert off.draws_control_pairs == []
    assert off.draws_control_line.startswith(
        "note: no shared-draws control (config key 'shared_draws_control' = false)"
    )
    none = load_scenario(
        config(configs=configs, monte_carlo_seeds="shared", noise_ceiling_images=0),
        REPO,
    )
    assert none.draws_control_line.startswith(
        "note: no shared-draws control (config key 'noise_ceiling_images' = 0)"
    )
    own = load_scenario(
        config(configs=configs, monte_carlo_seeds="per_configuration"), REPO
    )
    assert (own.draws_control_pairs, own.draws_control_line) == ([], None)
