"""
References for Fig. 4D-E: the Monte-Carlo noise ceiling and the ground truth, and the
seeds of the Monte-Carlo draws.

* Seeds (config key ``monte_carlo_seeds``): ``shared`` seeds image i with seed + i in
  every configuration (the paper's common random numbers: the configurations of one
  image draw the same x_t and observation noise); ``per_configuration`` seeds it with
  seed + 2**16 * (1 + H) + i, H the SHA-256 of ``"<seed>/<encoder>/<area>"`` modulo
  65535 (`configuration_seed`), so that two configurations share no draw, as the two
  estimates of the noise ceiling share none. Torch's CPU generator reads only the low
  32 bits of a seed (seeds 43 and 2**32 + 43 draw the same numbers), so the seeds of a
  run are kept apart modulo 2**32 (`seed_ranges`, `overlapping_seeds`, checked when
  the config is read).

* Noise ceiling: a few images of every configuration are estimated a second time with
  other Monte-Carlo seeds (``seed + CEILING_SEED_OFFSET + i``, in either mode).
  The alignment A_k between the two estimates of the same configuration is what a
  perfect agreement looks like through the estimator's noise: no cross-configuration
  alignment can be expected above it. J(x) has no Monte-Carlo part, so its ceiling is 1
  (up to the rotation of near-degenerate eigenvectors).
* Ground truth: for the demo's synthetic areas (upstream's `GaborTeacher`), the area's
  own Fisher information J_area(x) per test image (`multigeom_workflow.demo.
  area_fisher`); A_k of each configuration's G(x) and J(x) with it says how well the
  configuration recovers its area's geometry.

Both use upstream's `multigeom.pipeline.alignment.aggregate_pair`, the function of
Stage 5: for every shared image and k = 1..K, A_k = (1/k) ||V_A[:k] V_B[:k]^T||_F^2,
then mean and s.e.m. over images.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026). A multi-scale information geometry reveals
the structure of mutual information in neural populations. arXiv 2605.06304, Fig. 4D-E.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from .files import atomic_path

__all__ = [
    "CEILING_SEED_OFFSET",
    "CONFIGURATION_SEED_SLOTS",
    "CONFIGURATION_SEED_STRIDE",
    "CPU_SEED_BITS",
    "SEED_MODES",
    "ceiling_estimator",
    "configuration_estimator",
    "configuration_seed",
    "overlapping_seeds",
    "seed_ranges",
    "noise_ceiling",
    "truth_alignment",
]

#: Added to the estimator's seed for the second estimate of the ceiling images: image i
#: is then seeded with seed + 10**6 + i, a stream no first estimate uses.
CEILING_SEED_OFFSET = 10**6


#: Values of config key ``monte_carlo_seeds``.
SEED_MODES = ("shared", "per_configuration")
#: With ``monte_carlo_seeds: per_configuration``, a configuration's seeds start at
#: seed + CONFIGURATION_SEED_STRIDE * (1 + H), 0 <= H < 65535: below seed + 2**32, so
#: apart modulo 2**32 (torch's CPU generator reads a seed's low 32 bits) from the
#: shared seeds (seed + i) and, unless H collide, from another configuration's.
CONFIGURATION_SEED_STRIDE = 2**16
#: The modulus of H.
CONFIGURATION_SEED_SLOTS = 2**16 - 1
#: Torch's CPU generator (mt19937) is seeded with a seed's low 32 bits.
CPU_SEED_BITS = 32


def ceiling_estimator(estimator: dict) -> dict:
    """The estimator settings of the second estimates: the same, seed moved."""
    return {**estimator, "seed": int(estimator["seed"]) + CEILING_SEED_OFFSET}


def configuration_seed(seed: int, encoder: str, area: str, mode: str) -> int:
    """
    The seed of a configuration's draws: its image i is seeded with this + i.

    Parameters
    ----------
    seed : int
        The run's seed (config key ``seed``).
    encoder, area : str
        The configuration.
    mode : {"shared", "per_configuration"}
        Config key ``monte_carlo_seeds``.

    Returns
    -------
    int
        `seed` (shared), or seed + 2**16 * (1 + H) with H the SHA-256 digest of
        ``"<seed>/<encoder>/<area>"`` (UTF-8), as a big-endian integer, modulo 65535
        (per_configuration): deterministic, independent of the order or number of
        configurations in the run, and another `seed` gives other H (two
        configurations whose seeds collide part with another seed).

    Raises
    ------
    ValueError
        For another mode.
    """
    if mode == "shared":
        return int(seed)
    if mode != "per_configuration":
        raise ValueError(
            f"monte_carlo_seeds {mode!r}; allowed: {', '.join(SEED_MODES)}"
        )
    digest = hashlib.sha256(f"{int(seed)}/{encoder}/{area}".encode()).digest()
    h = int.from_bytes(digest, "big") % CONFIGURATION_SEED_SLOTS
    return int(seed) + CONFIGURATION_SEED_STRIDE * (1 + h)


def configuration_estimator(
    estimator: dict, encoder: str, area: str, mode: str
) -> dict:
    """A configuration's estimator settings: its seed (`configuration_seed`) applied."""
    seed = configuration_seed(int(estimator["seed"]), encoder, area, mode)
    return {**estimator, "seed": seed}


def seed_ranges(
    seed: int,
    configurations: Iterable[tuple[str, str]],
    n_images: int,
    ceiling_images: int,
    mode: str,
) -> list[tuple[str, int, int]]:
    """
    The seeds a run draws from, as ranges: (what, first, last), last included.

    One range per configuration with ``per_configuration`` seeds, one for all with
    ``shared`` seeds (``"every configuration"``), and ``"noise ceiling"``
    (seed + 10**6 + i, i < `ceiling_images`) when there is a ceiling.
    """
    configurations = list(configurations)
    if mode == "shared":
        starts = {"every configuration": int(seed)}
    else:
        starts = {
            f"{e}/{a}": configuration_seed(seed, e, a, mode) for e, a in configurations
        }
    out = [(what, s, s + n_images - 1) for what, s in starts.items()]
    if ceiling_images:
        first = int(seed) + CEILING_SEED_OFFSET
        out.append(("noise ceiling", first, first + ceiling_images - 1))
    return out


def _load(files: Iterable[str | Path]) -> dict[tuple[str, str], dict[int, dict]]:
    """Per-image files ``.../<enc>/<area>/img{i:04d}.pt`` by configuration and index."""
    import torch

    out: dict[tuple[str, str], dict[int, dict]] = {}
    for f in map(Path, files):
        data = torch.load(f, map_location="cpu", weights_only=False)
        key = (f.parent.parent.name, f.parent.name)
        out.setdefault(key, {})[int(f.stem.removeprefix("img"))] = data
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
            result["configurations"]["/".join(key)] = curves
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
    max_k : int
        Largest k.
    out : str or Path, optional
        JSON file written atomically.

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
        data = torch.load(f, map_location="cpu", weights_only=False)
        truths.setdefault(f.parent.name, {})[int(f.stem.removeprefix("img"))] = data
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
            result["configurations"][f"{encoder}/{area}"] = curves
    return _write(result, out)


def overlapping_seeds(
    ranges: list[tuple[str, int, int]],
) -> tuple[tuple[str, int, int], tuple[str, int, int]] | None:
    """
    Two of `seed_ranges` that draw the same numbers on a CPU, or None.

    Torch's CPU generator reads a seed's low 32 bits (`CPU_SEED_BITS`), so ranges are
    compared modulo 2**32 (a range of 2**32 seeds or more overlaps any other).
    """
    m = 2**CPU_SEED_BITS
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            a_len, b_len = a[2] - a[1] + 1, b[2] - b[1] + 1
            if (b[1] - a[1]) % m < a_len or (a[1] - b[1]) % m < b_len:
                return a, b
    return None
