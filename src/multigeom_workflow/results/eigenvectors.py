"""
The eigenvectors as pictures: the top eigenvectors of G(x) and J(x) of every
configuration, each drawn as the 64 x 64 image it is, beside the test image x and
beside the noise ceiling's second estimate of G(x) where the run has one.

A reader sees there what G keeps across encoders and J does not (the same picture in
every row of an image, or not), and sees noise when it is noise: a G eigenvector whose
second estimate (other Monte-Carlo seeds) looks different is sampling noise, not
geometry.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026). A multi-scale information geometry reveals
the structure of mutual information in neural populations. arXiv 2605.06304, Fig. 4.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..settings.names import N_PIXELS, configuration_label
from .figure import pyplot_agg

__all__ = [
    "EIGENVECTOR_KINDS",
    "align_signs",
    "orient_signs",
    "panel_label",
    "plot_eigenvectors",
    "read_per_image_files",
]

#: The column groups of the figure after the test image: G(x), the noise ceiling's
#: second estimate of G(x) (drawn only when one is given), J(x).
EIGENVECTOR_KINDS = ("G", "G 2nd", "J")
SIDE = math.isqrt(N_PIXELS)  # 64: an image of P = SIDE * SIDE pixels, row-major
CMAP = "RdBu_r"  # diverging, symmetric about 0: the sign of a pixel is its colour


def read_per_image_files(paths: Iterable[str | Path]) -> list[dict]:
    """
    Per-image files in upstream's format (`multigeom.pipeline.per_image`; keys in
    `multigeom_workflow.results.verify.PER_IMAGE_KEYS`), read on the CPU, in the order
    given.
    """
    import torch

    return [torch.load(p, map_location="cpu", weights_only=False) for p in paths]


def orient_signs(vectors: np.ndarray) -> np.ndarray:
    """
    Eigenvectors with the sign convention of the figure: each row multiplied by the
    sign of its largest-magnitude entry (the first such entry on a tie), so that this
    pixel is positive. An eigenvector's sign is arbitrary (the SVD's choice); this fixes
    one that depends on the vector alone.

    Parameters
    ----------
    vectors : array_like of shape (k, P)
        One eigenvector per row.

    Returns
    -------
    numpy.ndarray of shape (k, P)
        A new float64 array; a zero row stays zero.
    """
    v = np.array(vectors, dtype=np.float64, ndmin=2)
    peak = v[np.arange(len(v)), np.argmax(np.abs(v), axis=1)]
    return v * np.where(peak < 0, -1.0, 1.0)[:, None]


def align_signs(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """
    Eigenvectors flipped to agree with a reference: row j multiplied by the sign of its
    dot product with row j of `reference` (kept when the product is 0). Used for the
    noise ceiling's second estimate of G(x) against the first, so that two estimates of
    the same direction are drawn alike even where their largest pixels differ.

    Parameters
    ----------
    vectors, reference : array_like of shape (k, P)
        The eigenvectors to flip and those they are compared with, row by row.

    Returns
    -------
    numpy.ndarray of shape (k, P)
        A new float64 array.

    Raises
    ------
    ValueError
        If the two shapes differ.
    """
    v = np.array(vectors, dtype=np.float64, ndmin=2)
    ref = np.asarray(reference, dtype=np.float64)
    if v.shape != ref.shape:
        raise ValueError(
            f"eigenvectors of shape {v.shape} cannot be aligned with a reference of "
            f"shape {ref.shape}"
        )
    dots = np.einsum("ij,ij->i", v, ref)
    return v * np.where(dots < 0, -1.0, 1.0)[:, None]


def panel_label(kind: str, config: str, index: int, j: int | None = None) -> str:
    """
    The label (``Axes.get_label()``) of a panel of `plot_eigenvectors`:
    ``"image smallcnn/complex 0"`` for the test image of a row, ``"G v1 smallcnn/complex
    0"`` for eigenvector ``j = 0`` of a `kind` in `EIGENVECTOR_KINDS`.
    """
    head = "image" if j is None else f"{kind} v{j + 1}"
    return f"{head} {config} {index}"


def plot_eigenvectors(
    first: Sequence[Mapping],
    second: Sequence[Mapping] = (),
    n_vectors: int = 3,
):
    """
    Draw the top eigenvectors of G(x) and J(x) as images, one row per (test image,
    configuration).

    Parameters
    ----------
    first : sequence of dict
        Per-image results in upstream's format (`read_per_image_files`): keys
        ``img_idx``, ``encoder_name``, ``area``, ``image`` (the test image, P = 4096
        pixels in [-1, 1], any shape of P elements, e.g. (1, 1, 64, 64)),
        ``G_eigenvalues`` and ``J_eigenvalues`` (shape (k,), descending),
        ``G_eigenvectors`` and ``J_eigenvectors`` (shape (k, P), one unit eigenvector
        per row, pixels in row-major order). Arrays or CPU tensors.
    second : sequence of dict, optional
        The noise ceiling's second estimates (other Monte-Carlo seeds) of some of the
        same (configuration, image) pairs, same format; their G(x) eigenvectors are
        drawn beside the first estimate's.
    n_vectors : int
        Eigenvectors drawn per matrix: the first min(n_vectors, k).

    Returns
    -------
    matplotlib.figure.Figure
        Rows ordered by image index, then as the configurations come in `first`, image
        blocks separated by a gap. Per row, labelled by `panel_label`: the test image
        (gray, [-1, 1], its y label the configuration ``"<enc>/<area>"``), then
        `n_vectors` panels each of G, of G's second estimate (columns present only
        when `second` is given; a row without one shows "no 2nd estimate"), and of J.
        Each eigenvector panel shows the vector reshaped to 64 x 64 (row-major) with
        colormap ``RdBu_r`` from -max|v| to +max|v| (its own scale), titled with its
        eigenvalue and that eigenvalue's share of the sum of the k stored eigenvalues
        (the trace of the top-k approximation): near-equal shares mark a
        near-degenerate pair, whose single eigenvectors can rotate within their plane.

    Raises
    ------
    ValueError
        If `first` is empty, an array has the wrong shape, or a second estimate has no
        first estimate in `first`.

    Notes
    -----
    Sign convention: an eigenvector's sign is arbitrary, so each is flipped for the
    eye to compare rows. In the first row of an image (its first configuration in
    `first`), each vector's largest-magnitude pixel is made positive (`orient_signs`);
    in the image's other rows, G's and J's vector of rank j takes the sign of its dot
    product with the first row's G or J vector of rank j, and the second estimate's G
    vector of rank j that of its dot product with its own row's first estimate
    (`align_signs`). Two rows that agree are then drawn in the same colours; the
    largest-pixel rule alone would flip an antisymmetric pattern from row to row with
    the noise of its two extremes.
    """
    plt = pyplot_agg()

    if not first:
        raise ValueError("no per-image result to draw the eigenvectors of")
    rows = sorted(first, key=lambda d: int(d["img_idx"]))  # stable: configs in order
    seconds = {_key(d): d for d in second}
    unmatched = sorted(set(seconds) - {_key(d) for d in rows})
    if unmatched:
        names = ", ".join(f"{c} image {i}" for c, i in unmatched)
        raise ValueError(
            f"the noise ceiling's second estimate of {names} has no first estimate "
            "among the per-image results to be drawn beside"
        )
    ks = sorted({len(np.asarray(d["G_eigenvalues"])) for d in rows})
    n = max(1, min(int(n_vectors), ks[0]))
    kinds = [k for k in EIGENVECTOR_KINDS if seconds or k != "G 2nd"]

    # grid: image column, then per kind a spacer column and n panels; a spacer row
    # between image blocks
    widths, columns = [1.0], {}
    for kind in kinds:
        widths.append(0.18)
        columns[kind] = len(widths)
        widths += [1.0] * n
    heights, row_of, previous = [], [], None
    for d in rows:
        if previous is not None and int(d["img_idx"]) != previous:
            heights.append(0.02)  # with the grid's hspace: a gap
        row_of.append(len(heights))
        heights.append(1.0)
        previous = int(d["img_idx"])
    panel = 1.2  # inches
    height = panel * 1.18 * sum(heights) + 1.2
    fig = plt.figure(figsize=(panel * sum(widths) + 0.6, height))
    grid = fig.add_gridspec(
        len(heights),
        len(widths),
        top=1.0 - 1.05 / height,
        width_ratios=widths,
        height_ratios=heights,
        wspace=0.06,
        hspace=0.55,
    )
    shown, references = set(), {}
    for d, r in zip(rows, row_of, strict=True):
        config, index = _key(d)
        ax = fig.add_subplot(grid[r, 0], label=panel_label("image", config, index))
        ax.imshow(_square(d["image"], "image", d), cmap="gray", vmin=-1.0, vmax=1.0)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(config, fontsize=8)
        if index not in shown:
            ax.set_title(f"test image {index}", fontsize=8, fontweight="bold")
            shown.add(index)
        if index not in references:  # the image's first row: its largest pixels
            references[index] = {m: orient_signs(_vectors(d, m)[:n]) for m in "GJ"}
        vectors = {
            m: align_signs(_vectors(d, m)[:n], references[index][m]) for m in "GJ"
        }
        values = {"G": d["G_eigenvalues"], "J": d["J_eigenvalues"]}
        other = seconds.get((config, index))
        if other is not None:
            vectors["G 2nd"] = align_signs(_vectors(other, "G")[:n], vectors["G"][:n])
            values["G 2nd"] = other["G_eigenvalues"]
        for kind in kinds:
            for j in range(n):
                ax = fig.add_subplot(
                    grid[r, columns[kind] + j],
                    label=panel_label(kind, config, index, j),
                )
                ax.set_xticks([])
                ax.set_yticks([])
                if kind not in vectors:
                    ax.axis("off")
                    if j == 0:
                        ax.text(0.5, 0.5, "no 2nd\nestimate", ha="center",
                                va="center", fontsize=7, color="0.45",
                                transform=ax.transAxes)  # fmt: skip
                    continue
                _draw_vector(ax, vectors[kind][j], values[kind], j, kind)
    fig.suptitle(
        "Top eigenvectors of G(x) and J(x) as 64×64 images, per test image and "
        "configuration\n"
        "G 2nd: the noise ceiling's second estimate of G (other Monte-Carlo seeds). "
        "Colours: ±max|v| of each panel.\n"
        "Sign: largest |pixel| positive in an image's first row; the other rows by "
        "their dot product with it (G 2nd: with its row's G).\n"
        "%: the eigenvalue's share of the sum of the top-k eigenvalues "
        f"(k = {', '.join(map(str, ks))}).",
        fontsize=9,
        y=1.0 - 0.1 / height,
        va="top",
    )
    return fig


def _key(d: Mapping) -> tuple[str, int]:
    """The (configuration label, image index) of a per-image result."""
    return configuration_label(d["encoder_name"], d["area"]), int(d["img_idx"])


def _square(values, what: str, d: Mapping) -> np.ndarray:
    """P values as a SIDE x SIDE image (row-major); ValueError naming the file."""
    a = np.asarray(values, dtype=np.float64)
    if a.size != N_PIXELS:
        config, index = _key(d)
        raise ValueError(
            f"{what} of {config} image {index} has {a.size} values, not the "
            f"{N_PIXELS} pixels of a {SIDE}x{SIDE} image"
        )
    return a.reshape(SIDE, SIDE)


def _vectors(d: Mapping, metric: str) -> np.ndarray:
    """The (k, P) eigenvectors of `metric` ("G" or "J"); ValueError on another shape."""
    v = np.asarray(d[f"{metric}_eigenvectors"], dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != N_PIXELS:
        config, index = _key(d)
        raise ValueError(
            f"{metric}_eigenvectors of {config} image {index} has shape {v.shape}, "
            f"not (k, {N_PIXELS})"
        )
    return v


def _draw_vector(ax, vector: np.ndarray, eigenvalues, j: int, kind: str) -> None:
    """One eigenvector as an image, titled with its eigenvalue and share."""
    m = float(np.max(np.abs(vector))) or 1.0
    ax.imshow(vector.reshape(SIDE, SIDE), cmap=CMAP, vmin=-m, vmax=m)
    lam = np.asarray(eigenvalues, dtype=np.float64)
    total = float(lam.sum())
    share = f"{lam[j] / total:.0%}" if total > 0 else "n/a"
    ax.set_title(f"{kind} v{j + 1}: {share}\nλ = {lam[j]:.2g}", fontsize=7, pad=2)
