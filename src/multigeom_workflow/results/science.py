"""
References for Fig. 4D-E: the Monte-Carlo noise ceiling and the ground truth (the
seeds of the draws: `multigeom_workflow.settings.seeds`).

* Noise ceiling: a few images of every configuration are estimated a second time with
  other Monte-Carlo seeds (``seed + CEILING_SEED_OFFSET + i``, in either mode).
  The alignment A_k between the two estimates of the same configuration is what a
  perfect agreement looks like through the estimator's noise: no cross-configuration
  alignment can be expected above it. J(x) has no Monte-Carlo part, so its ceiling is 1
  (up to the rotation of near-degenerate eigenvectors).
* Ground truth: for the demo's synthetic areas (upstream's `GaborTeacher`), the area's
  own Fisher information J_area(x) per test image (`multigeom_workflow.inputs.demo.
  truth.area_fisher`); A_k of each configuration's G(x) and J(x) with it says how
  well the configuration recovers its area's geometry.

Both use upstream's `multigeom.pipeline.alignment.aggregate_pair`, the function of
Stage 5: for every shared image and k = 1..K, A_k = (1/k) ||V_A[:k] V_B[:k]^T||_F^2,
then mean and s.e.m. over images.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026). A multi-scale information geometry reveals
the structure of mutual information in neural populations. arXiv 2605.06304, Fig. 4D-E.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..atomic import atomic_path
from ..settings.layout import parse_image_file, parse_truth_file
from ..settings.names import configuration_label
from ..settings.seeds import CEILING_SEED_OFFSET

__all__ = [
    "noise_ceiling",
    "truth_alignment",
]


def _load(files: Iterable[str | Path]) -> dict[tuple[str, str], dict[int, dict]]:
    """Per-image files ``.../<enc>/<area>/img{i:04d}.pt`` by configuration and index."""
    import torch

    out: dict[tuple[str, str], dict[int, dict]] = {}
    for f in map(Path, files):
        encoder, area, index = parse_image_file(f)
        data = torch.load(f, map_location="cpu", weights_only=False)
        out.setdefault((encoder, area), {})[index] = data
    return out


def _write(result: dict, out: str | Path | None) -> dict:
    if out is not None:
        with atomic_path(out) as tmp:
            Path(tmp).write_text(json.dumps(result, indent=1))
    return result


def noise_ceiling(
    first: Iterable[str | Path],
    second: Iterable[str | Path],
    max_k: int,
    out: str | Path | None = None,
) -> dict:
    """
    A_k between two estimates of the same configurations and images.

    Parameters
    ----------
    first, second : iterable of path
        Per-image files (upstream's keys), ``.../<encoder>/<area>/img{i:04d}.pt``: the
        run's estimates and the second estimates with other seeds. Images are paired
        by configuration and index; an image in one list only is left out.
    max_k : int
        Largest k.
    out : str or Path, optional
        JSON file written atomically.

    Returns
    -------
    dict
        ``{"seed_offset": CEILING_SEED_OFFSET, "configurations": {"<enc>/<area>":
        {"G": curve, "J": curve}}}``, each curve upstream's `aggregate_pair` result
        (``n_images``, ``k``, ``alignment_mean``, ``alignment_sem``, ...).
    """
    from multigeom.pipeline.alignment import aggregate_pair

    a, b = _load(first), _load(second)
    result = {"seed_offset": CEILING_SEED_OFFSET, "configurations": {}}
    for key in sorted(set(a) & set(b)):
        curves = {m: aggregate_pair(a[key], b[key], m, max_k) for m in ("G", "J")}
        if all(curves.values()):
            result["configurations"][configuration_label(*key)] = curves
    return _write(result, out)


def truth_alignment(
    per_image: Iterable[str | Path],
    truth: Iterable[str | Path],
    max_k: int,
    out: str | Path | None = None,
) -> dict:
    """
    A_k of each configuration's G(x) and J(x) with its area's ground truth J_area(x).

    Parameters
    ----------
    per_image : iterable of path
        The run's per-image files, ``.../<encoder>/<area>/img{i:04d}.pt``.
    truth : iterable of path
        Ground-truth files ``.../<area>/img{i:04d}.pt`` (keys ``J_eigenvalues``,
        ``J_eigenvectors``), paired with the configurations of the same area.
    max_k, out
        As in `noise_ceiling`.

    Returns
    -------
    dict
        ``{"configurations": {"<enc>/<area>": {"G": curve, "J": curve}}}``, the curves
        of upstream's `aggregate_pair` between the configuration's G (or J) and the
        truth.
    """
    import torch
    from multigeom.pipeline.alignment import aggregate_pair

    truths: dict[str, dict[int, dict]] = {}
    for f in map(Path, truth):
        area, index = parse_truth_file(f)
        data = torch.load(f, map_location="cpu", weights_only=False)
        truths.setdefault(area, {})[index] = data
    result = {"configurations": {}}
    for (encoder, area), images in sorted(_load(per_image).items()):
        if area not in truths:
            continue
        curves = {}
        for m in ("G", "J"):
            ref = {
                i: {
                    f"{m}_eigenvalues": t["J_eigenvalues"],
                    f"{m}_eigenvectors": t["J_eigenvectors"],
                }
                for i, t in truths[area].items()
            }
            curves[m] = aggregate_pair(images, ref, m, max_k)
        if all(curves.values()):
            result["configurations"][configuration_label(encoder, area)] = curves
    return _write(result, out)
