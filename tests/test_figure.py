"""Fig. 4D-E, checked on the matplotlib objects and on the written files."""

from __future__ import annotations

import numpy as np
import pytest

from multigeom_workflow.results.figure import plot_fig4de, save_figure

K = 6


def stats(metric, a, b, level):
    k = list(range(1, K + 1))
    return {
        "n_images": 3,
        "k": k,
        "alignment_mean": [level + 0.01 * i for i in range(K)],
        "alignment_sem": [0.02] * K,
        "bures_wasserstein_mean": [0.0] * K,
        "bures_wasserstein_sem": [0.0] * K,
        "metric": metric,
        "config_A": {"encoder": a[0], "area": a[1]},
        "config_B": {"encoder": b[0], "area": b[1]},
    }


PAIRS = {
    # kind, A, B, level of the mean curve
    "model_V1": ("cross-model", ("inception", "V1"), ("resnet50", "V1"), 0.6),
    "area_inc": ("cross-area", ("inception", "V1"), ("inception", "V4"), 0.3),
    "neither": (None, ("inception", "V1"), ("resnet50", "V4"), 0.1),
}


@pytest.fixture
def metrics():
    pairs = {
        f"{name}__{m}": stats(m, a, b, level + (0.05 if m == "J" else 0.0))
        for name, (_, a, b, level) in PAIRS.items()
        for m in ("G", "J")
    }
    return {"pairs": pairs, "named": {}, "provenance": {}}


def test_two_panels_with_the_expected_lines(metrics):
    fig = plot_fig4de(metrics)
    axes = fig.axes
    assert len(axes) == 2
    assert "G(x)" in axes[0].get_title() and "J(x)" in axes[1].get_title()
    for ax, offset in zip(axes, (0.0, 0.05), strict=True):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {
            "cross-model: inception/V1 vs resnet50/V1",
            "cross-area: inception/V1 vs inception/V4",
            "chance k/P",
        }
        model = lines["cross-model: inception/V1 vs resnet50/V1"]
        area = lines["cross-area: inception/V1 vs inception/V4"]
        assert model.get_linestyle() == "-" and area.get_linestyle() == "--"
        k = np.arange(1, K + 1)
        assert np.allclose(model.get_xdata(), k)
        assert np.allclose(model.get_ydata(), 0.6 + offset + 0.01 * (k - 1))
        assert np.allclose(lines["chance k/P"].get_ydata(), k / 4096)
        # One mean +- s.e.m. band per comparison, 0.02 wide on each side.
        bands = ax.collections
        assert len(bands) == 2
        ys = bands[0].get_paths()[0].vertices[:, 1]
        assert ys.max() - ys.min() == pytest.approx(
            0.6 + offset + 0.05 + 0.02 - (0.6 + offset - 0.02)
        )
        assert ax.get_xlabel().startswith("k")
    assert "alignment" in axes[0].get_ylabel()
    assert "n = 3 images" in fig._suptitle.get_text()
    assert axes[1].get_legend() is not None


def test_files_are_written(metrics, tmp_path):
    fig = plot_fig4de(metrics)
    save_figure(fig, tmp_path / "f.png", tmp_path / "f.pdf")
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "f.pdf").read_bytes().startswith(b"%PDF")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pdf", "f.png"]


def test_no_comparable_pair_is_refused(metrics):
    only_neither = {
        k: v for k, v in metrics["pairs"].items() if k.startswith("neither")
    }
    with pytest.raises(ValueError, match="share an encoder or an area"):
        plot_fig4de({"pairs": only_neither})


@pytest.mark.parametrize(
    "seeds, words",
    [
        ("shared", "draws shared by the configurations (image i: seed + i"),
        ("per_configuration", "draws independent per configuration"),
    ],
)
def test_title_says_how_the_draws_were_seeded(metrics, seeds, words):
    title = plot_fig4de(metrics, seeds=seeds)._suptitle.get_text()
    assert title.splitlines()[1].startswith(f"Monte-Carlo {words}")
    assert "\n" not in plot_fig4de(metrics)._suptitle.get_text()


@pytest.mark.process
def test_the_figure_is_drawn_whatever_mplbackend_says(tmp_path):
    """A backend name this matplotlib does not know (a notebook kernel's, say)."""
    import subprocess
    import sys

    code = (
        "from multigeom_workflow.results.figure import pyplot_agg\n"
        "plt = pyplot_agg()\n"
        "fig = plt.figure(); fig.savefig('f.png'); print(plt.get_backend())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "MPLBACKEND": "no-such-backend"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().lower() == "agg"
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
