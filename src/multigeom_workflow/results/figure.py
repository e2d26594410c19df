"""
Fig. 4D-E of Azeglio et al. (2026): the subspace alignment A_k of the top-k
eigenvectors of G(x) (panel D) and of J(x) (panel E) between configurations, versus k,
mean +- s.e.m. over the test images, from Stage 5's metrics file.

Cross-model comparisons (two encoders fitted to the same area) are drawn with solid
lines, cross-area comparisons (one encoder fitted to two areas) with dashed lines;
pairs that differ in both are left out, as in the paper. The chance level of two random
k-dimensional subspaces of R^P is k/P.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026). A multi-scale information geometry reveals
the structure of mutual information in neural populations. arXiv 2605.06304, Fig. 4D-E.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..settings.names import N_PIXELS, parse_configuration_label
from ..settings.pairs import PAIR_KINDS, pair_kind

__all__ = [
    "PANELS",
    "SEED_NOTES",
    "comparison_kind",
    "plot_fig4de",
    "plot_ground_truth",
    "pyplot_agg",
    "save_figure",
]

#: Metric of each panel and its title.
PANELS = (
    ("G", "D  multi-scale Fisher metric G(x)"),
    ("J", "E  Fisher information J(x)"),
)
LINESTYLES = dict(zip(PAIR_KINDS, ("-", "--"), strict=True))


def pyplot_agg():
    """
    The pyplot of matplotlib on its Agg backend (files only, no screen), whatever the
    user's ``MPLBACKEND`` says: a notebook's kernel or a desktop may set a backend
    that this environment lacks, and matplotlib's import fails on an unknown name.
    The figure rules run in processes of their own, so the variable is set here.
    """
    os.environ["MPLBACKEND"] = "Agg"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def comparison_kind(pair: dict) -> str | None:
    """
    ``"cross-model"`` (same area, two encoders), ``"cross-area"`` (same encoder, two
    areas), or None (both differ) for a pair of Stage 5's metrics
    (`multigeom_workflow.settings.pairs.pair_kind`).
    """
    a, b = pair["config_A"], pair["config_B"]
    return pair_kind((a["encoder"], a["area"]), (b["encoder"], b["area"]))


def pair_name(pair: dict) -> str:
    """Legend entry of a pair: its kind and its two configurations."""
    a, b = pair["config_A"], pair["config_B"]
    return (
        f"{comparison_kind(pair)}: {a['encoder']}/{a['area']} vs "
        f"{b['encoder']}/{b['area']}"
    )


#: How the figure names config key ``monte_carlo_seeds`` (its title's second line).
SEED_NOTES = {
    "shared": "Monte-Carlo draws shared by the configurations (image i: seed + i, as "
    "the paper); the ceiling's are not",
    "per_configuration": "Monte-Carlo draws independent per configuration (own seeds), "
    "as between the ceiling's two estimates",
}


def plot_fig4de(
    metrics: dict,
    n_pixels: int = N_PIXELS,
    ceiling: dict | None = None,
    seeds: str | None = None,
):
    """
    Draw Fig. 4D-E.

    Parameters
    ----------
    metrics : dict
        Stage 5's metrics (``cross_encoder_metrics.json``, see
        `multigeom_workflow.results.alignment.align_configs`).
    n_pixels : int
        P, the dimension of image space (64 x 64 = 4096), for the chance level k/P.
    ceiling : dict, optional
        The Monte-Carlo noise ceiling
        (`multigeom_workflow.results.science.noise_ceiling`): A_k between two estimates
        of the same configuration, drawn in gray, one line per configuration labelled
        ``"ceiling (2 seeds, n = <images>): <enc>/<area>"``; and its
        ``shared_draws_control`` where it has one
        (`multigeom_workflow.results.science.draws_control`): in panel D, each pair's
        curve with independent draws on the ceiling's images, in the pair's colour,
        thin with round markers, labelled ``"independent draws (n = <images>):
        <kind>: <A> vs <B>"``.
    seeds : {"shared", "per_configuration"}, optional
        Config key ``monte_carlo_seeds`` of the run, said in the title's second line
        (`SEED_NOTES`): with shared draws, a G curve may lie above the ceiling by the
        agreement of the draws alone.

    Returns
    -------
    matplotlib.figure.Figure
        Two axes (G, then J). In each, one line per comparison labelled by `pair_name`
        (its y-data the mean alignment, a band of +- s.e.m. around it), the ceiling
        lines, and the chance line labelled ``"chance k/P"``.

    Raises
    ------
    ValueError
        If no pair is a cross-model or cross-area comparison.
    """
    plt = pyplot_agg()

    pairs = [p for p in metrics["pairs"].values() if comparison_kind(p) is not None]
    if not pairs:
        raise ValueError(
            "no cross-model or cross-area comparison in the metrics: list "
            "configurations that share an encoder or an area in the config key "
            "'configs'"
        )
    names = sorted({pair_name(p) for p in pairs})
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    n_images = sorted({int(p["n_images"]) for p in pairs})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        k_max = 1
        for p in sorted((p for p in pairs if p["metric"] == metric), key=pair_name):
            k = np.asarray(p["k"])
            mean = np.asarray(p["alignment_mean"])
            sem = np.asarray(p["alignment_sem"])
            name = pair_name(p)
            ax.fill_between(k, mean - sem, mean + sem, color=colors[name], alpha=0.2)
            ax.plot(
                k,
                mean,
                LINESTYLES[comparison_kind(p)],
                color=colors[name],
                label=name,
            )
            k_max = max(k_max, int(k[-1]))
        _plot_ceiling(ax, ceiling, metric)
        if metric == "G":
            _plot_draws_control(ax, ceiling, colors)
        _finish_axis(ax, k_max, n_pixels, title)
    axes[0].set_ylabel(r"subspace alignment $\mathcal{A}_k = \|V_A^\top V_B\|_F^2 / k$")
    axes[1].legend(
        loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False
    )
    shown = f"{n_images[0]}" if len(n_images) == 1 else f"{n_images[0]}-{n_images[-1]}"
    title = (
        f"Fig. 4D-E: alignment of the top-k eigenvectors between configurations "
        f"(mean ± s.e.m. over n = {shown} images)"
    )
    if seeds is not None:
        title += f"\n{SEED_NOTES[seeds]}"
        if ((ceiling or {}).get("shared_draws_control") or {}).get("pairs"):
            title += "; round markers in D: the same pairs with independent draws"
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _plot_ceiling(ax, ceiling: dict | None, metric: str) -> None:
    """The noise-ceiling lines of a panel: gray, dash-dotted, one per configuration."""
    if not ceiling:
        return
    configs = sorted(ceiling["configurations"])
    for i, label in enumerate(configs):
        curve = ceiling["configurations"][label][metric]
        gray = 0.15 + 0.5 * i / max(1, len(configs) - 1)
        ax.plot(
            curve["k"],
            curve["alignment_mean"],
            "-.",
            lw=1,
            color=(gray, gray, gray),
            label=f"ceiling (2 seeds, n = {curve['n_images']}): {label}",
        )


def _plot_draws_control(ax, ceiling: dict | None, colors: dict) -> None:
    """
    The shared-draws control's curves (panel D): each compared pair's A_k with
    independent draws, in the colour of the pair's main curve.
    """
    control = (ceiling or {}).get("shared_draws_control") or {}
    for name, entry in sorted(control.get("pairs", {}).items()):
        label = f"{entry['kind']}: {name}"
        curve = entry["independent"]
        ax.plot(
            curve["k"],
            curve["alignment_mean"],
            "-o",
            lw=0.8,
            ms=2.5,
            color=colors.get(label, "black"),
            label=f"independent draws (n = {curve['n_images']}): {label}",
        )


def plot_ground_truth(truth: dict, n_pixels: int = N_PIXELS):
    """
    How well each configuration recovers its area's geometry: A_k between its G(x)
    (panel a) or J(x) (panel b) and the area's ground truth J_area(x), versus k.

    Parameters
    ----------
    truth : dict
        `multigeom_workflow.results.science.truth_alignment`'s result.
    n_pixels : int
        P, for the chance level k/P.

    Returns
    -------
    matplotlib.figure.Figure
        Two axes; in each, one line per configuration labelled ``"<enc>/<area>"``
        (mean, band of +- s.e.m.) and the chance line ``"chance k/P"``.

    Raises
    ------
    ValueError
        If `truth` holds no configuration.
    """
    plt = pyplot_agg()

    configs = sorted(truth["configurations"])
    if not configs:
        raise ValueError("no configuration of a demo area in the ground-truth metrics")
    areas = {label: parse_configuration_label(label)[1] for label in configs}
    first_area = min(areas.values())  # drawn solid, the other area dashed
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    titles = {
        "G": "G(x) vs the area's true Fisher information",
        "J": "J(x) of the encoder vs the area's true Fisher information",
    }
    n_images = set()
    for ax, metric in zip(axes, ("G", "J"), strict=True):
        k_max = 1
        for i, label in enumerate(configs):
            c = truth["configurations"][label][metric]
            k, mean = np.asarray(c["k"]), np.asarray(c["alignment_mean"])
            sem = np.asarray(c["alignment_sem"])
            color = plt.get_cmap("tab10")(i % 10)
            style = "-" if areas[label] == first_area else "--"
            ax.fill_between(k, mean - sem, mean + sem, color=color, alpha=0.2)
            ax.plot(k, mean, style, color=color, label=label)
            k_max = max(k_max, int(k[-1]))
            n_images.add(int(c["n_images"]))
        _finish_axis(ax, k_max, n_pixels, titles[metric])
    axes[0].set_ylabel(r"alignment with the truth $\mathcal{A}_k$")
    axes[1].legend(
        loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False
    )
    fig.suptitle(
        "Ground truth: alignment of each configuration's top-k eigenvectors with its "
        f"area's J_area(x) (mean ± s.e.m., n = {', '.join(map(str, sorted(n_images)))}"
        " images)"
    )
    fig.tight_layout()
    return fig


def save_figure(fig, *paths: str | Path, dpi: int = 150) -> None:
    """Save `fig` to each path (format from the suffix), each file atomically."""
    for path in paths:
        with atomic_path(path) as tmp:
            fig.savefig(
                tmp, format=Path(path).suffix.lstrip("."), dpi=dpi, bbox_inches="tight"
            )


def _finish_axis(ax, k_max: int, n_pixels: int, title: str) -> None:
    """
    The chance level k/P (P = `n_pixels`) for k = 1..`k_max` as a dotted line, and the
    panel's title, k axis, alignment range [0, 1] and grid.
    """
    k = np.arange(1, k_max + 1)
    ax.plot(k, k / n_pixels, ":", color="black", label="chance k/P")
    ax.set_title(title)
    ax.set_xlabel("k (top-k eigenvectors)")
    ax.set_xlim(1, k_max)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
