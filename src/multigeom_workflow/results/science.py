"""
References for Fig. 4D-E: the Monte-Carlo noise ceiling and the ground truth (the
seeds of the draws: `multigeom_workflow.settings.seeds`).

* Noise ceiling: a few images of every configuration are estimated a second time with
  other Monte-Carlo seeds (``seed + CEILING_SEED_OFFSET + i``, in either mode).
  The alignment A_k between the two estimates of the same configuration is what a
  perfect agreement looks like through the estimator's noise: no cross-configuration
  alignment can be expected above it. J(x) has no Monte-Carlo part, so its ceiling is 1
  (up to the rotation of near-degenerate eigenvectors).
* Shared-draws control: with shared Monte-Carlo draws (``monte_carlo_seeds:
  shared``, the paper's), two configurations' estimates of image i draw the same
  numbers, so their G(x) may agree through the draws alone. For the ceiling's images,
  each compared pair's G curve is computed again between configuration A's first
  estimate (seed + i) and B's second (seed + 10**6 + i), whose draws are independent,
  beside the shared curve on the same images (`draws_control`).
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
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..atomic import atomic_path
from ..settings.layout import parse_image_file, parse_truth_file
from ..settings.names import configuration_label, parse_configuration_label
from ..settings.pairs import pair_kind
from ..settings.seeds import CEILING_SEED_OFFSET

__all__ = [
    "against_ceiling",
    "draws_control",
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
    pairs: Iterable[Sequence[str]] = (),
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
    pairs : iterable of (str, str)
        Compared pairs of configurations (``"<enc>/<area>"`` labels) whose
        shared-draws control is computed (`draws_control`); none by default.

    Returns
    -------
    dict
        ``{"seed_offset": CEILING_SEED_OFFSET, "configurations": {"<enc>/<area>":
        {"G": curve, "J": curve}}}``, each curve upstream's `aggregate_pair` result
        (``n_images``, ``k``, ``alignment_mean``, ``alignment_sem``, ...); with
        `pairs`, ``"shared_draws_control"``: `draws_control`'s result.
    """
    from multigeom.pipeline.alignment import aggregate_pair

    a, b = _load(first), _load(second)
    result = {"seed_offset": CEILING_SEED_OFFSET, "configurations": {}}
    for key in sorted(set(a) & set(b)):
        curves = {m: aggregate_pair(a[key], b[key], m, max_k) for m in ("G", "J")}
        if all(curves.values()):
            result["configurations"][configuration_label(*key)] = curves
    pairs = [tuple(p) for p in pairs]
    if pairs:
        result["shared_draws_control"] = draws_control(a, b, pairs, max_k)
    return _write(result, out)


def draws_control(
    first: dict[tuple[str, str], dict[int, dict]],
    second: dict[tuple[str, str], dict[int, dict]],
    pairs: Iterable[Sequence[str]],
    max_k: int,
) -> dict:
    """
    The shared-draws control of Fig. 4D: each compared pair's G(x) alignment on the
    noise ceiling's images, with the draws shared and with them independent.

    With ``monte_carlo_seeds: shared`` (the paper's common random numbers),
    configurations A and B estimate image i from the same draws (seed + i): A_k
    between them measures the geometries' agreement plus the draws'. Configuration
    B's second estimate of the same image (seed + 10**6 + i) has draws independent
    of A's first, so A_k between those two is the pair's agreement without the
    shared draws. J(x) has no Monte-Carlo part, so it has no control.

    Parameters
    ----------
    first, second : dict
        ``(encoder, area) -> {index: per-image dict}``: the first estimates of the
        ceiling's images and their second estimates.
    pairs : iterable of (str, str)
        ``("<enc>/<area>", "<enc>/<area>")``, the compared pairs (cross-model or
        cross-area, `settings.pairs.pair_kind`); a pair without both estimates is
        left out.
    max_k : int
        Largest k.

    Returns
    -------
    dict
        ``{"seed_offset": 10**6, "pairs": {"<A> vs <B>": {"kind": ..., "shared":
        curve, "independent": curve}}}``, each curve upstream's `aggregate_pair`
        result over the same images (``shared``: A's first estimates against B's
        first; ``independent``: A's first against B's second).
    """
    from multigeom.pipeline.alignment import aggregate_pair

    out = {}
    for label_a, label_b in pairs:
        a, b = parse_configuration_label(label_a), parse_configuration_label(label_b)
        if a not in first or b not in first or b not in second:
            continue
        independent = aggregate_pair(first[a], second[b], "G", max_k)
        shown = {i: first[b][i] for i in second[b] if i in first[b]}
        shared = aggregate_pair(first[a], shown, "G", max_k)
        if independent and shared:
            out[f"{label_a} vs {label_b}"] = {
                "kind": pair_kind(a, b),
                "shared": shared,
                "independent": independent,
            }
    return {"seed_offset": CEILING_SEED_OFFSET, "pairs": out}


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


def against_ceiling(metrics: dict, ceiling: dict, k: int = 10) -> list[dict]:
    """
    Each compared pair of Stage 5 read against its noise ceiling at one k: how many
    standard errors its A_k lies under what a perfect agreement would give through the
    estimator's noise.

    The ceiling of a pair's G is the lower of its two configurations' ceilings (A_k
    between two estimates of one configuration with other Monte-Carlo seeds,
    `noise_ceiling`); J(x) has no Monte-Carlo part, so its ceiling is 1 with no error.
    The distance is ``z = (ceiling - A_k) / sqrt(sem_pair**2 + sem_ceiling**2)``: a
    pair more than 3 below its ceiling differs beyond the noise (the criterion of
    issue 40); a pair near 0 is as alike as the noise lets one see.

    Parameters
    ----------
    metrics : dict
        Stage 5's metrics (``cross_encoder_metrics.json``: ``pairs``, each with
        ``metric``, ``config_A``/``config_B`` (``encoder``, ``area``), ``k``,
        ``alignment_mean``, ``alignment_sem``).
    ceiling : dict
        `noise_ceiling`'s result: ``{"configurations": {"<enc>/<area>": {"G":
        curve}}}``.
    k : int
        The k read (1-based; the curves' last k where they are shorter).

    Returns
    -------
    list of dict
        One per compared pair (cross-model or cross-area, `settings.pairs.pair_kind`)
        and metric, sorted by metric, kind and configurations: ``metric``, ``kind``,
        ``pair`` (``"<enc>/<area> vs <enc>/<area>"``), ``a`` and ``a_sem`` (the pair's
        A_k and s.e.m.), ``ceiling`` and ``ceiling_sem``, ``z`` (dimensionless;
        with both errors 0: NaN if A_k equals the ceiling, else ±infinity),
        and ``fraction`` (A_k / ceiling). A G pair whose configurations lack a ceiling
        is left out.
    """
    import math

    def at(curve: dict) -> tuple[float, float]:
        i = min(k, len(curve["k"])) - 1
        return float(curve["alignment_mean"][i]), float(curve["alignment_sem"][i])

    configs = ceiling.get("configurations", {})
    rows = []
    for pair in metrics.get("pairs", {}).values():
        a, b = pair["config_A"], pair["config_B"]
        kind = pair_kind((a["encoder"], a["area"]), (b["encoder"], b["area"]))
        if kind is None:
            continue
        labels = [configuration_label(c["encoder"], c["area"]) for c in (a, b)]
        metric = pair["metric"]
        if metric == "G":
            if not all(configs.get(label, {}).get("G") for label in labels):
                continue
            top, top_sem = min(at(configs[label]["G"]) for label in labels)
        else:
            top, top_sem = 1.0, 0.0
        value, sem = at(pair)
        spread = math.hypot(sem, top_sem)
        gap = top - value
        z = gap / spread if spread > 0 else (math.nan if gap == 0 else math.inf)
        rows.append(
            {
                "metric": metric,
                "kind": kind,
                "pair": " vs ".join(labels),
                "a": value,
                "a_sem": sem,
                "ceiling": top,
                "ceiling_sem": top_sem,
                "z": z,
                "fraction": value / top if top else math.nan,
            }
        )
    return sorted(rows, key=lambda r: (r["metric"], r["kind"], r["pair"]))
