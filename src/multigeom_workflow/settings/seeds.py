"""
The seeds of a run's Monte-Carlo draws: image i of a configuration is seeded with
`configuration_seed` + i (config key ``monte_carlo_seeds``: ``shared``, the paper's
way, or ``per_configuration``), and its noise-ceiling estimate with
seed + `CEILING_SEED_OFFSET` + i; `seed_ranges` and `overlapping_seeds` let the
configuration checks refuse seeds whose streams would coincide. The one home of these
formulas: the per-image jobs, the per-image check and the figure's caption read them
here.

Seeds: ``shared`` seeds image i with seed + i in every configuration (the paper's
common random numbers: the configurations of one image draw the same x_t and
observation noise); ``per_configuration`` seeds it with seed + 2**16 * (1 + H) + i, H
the SHA-256 of ``"<seed>/<encoder>/<area>"`` modulo 65535 (`configuration_seed`), so
that two configurations share no draw, as the two estimates of the noise ceiling share
none. Torch's CPU generator reads only the low 32 bits of a seed (seeds 43 and
2**32 + 43 draw the same numbers), so the seeds of a run are kept apart modulo 2**32
(`seed_ranges`, `overlapping_seeds`, checked when the config is read).

Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from .names import CEILING_RULE, ESTIMATE_RULE

__all__ = [
    "job_seeds",
    "CEILING_SEED_OFFSET",
    "CONFIGURATION_SEED_SLOTS",
    "CONFIGURATION_SEED_STRIDE",
    "CPU_SEED_BITS",
    "SEED_MODES",
    "ceiling_estimator",
    "configuration_diffusion",
    "configuration_estimator",
    "configuration_seed",
    "overlapping_seeds",
    "seed_ranges",
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


def configuration_seed(
    seed: int, encoder: str, area: str, mode: str, key: str = "monte_carlo_seeds"
) -> int:
    """
    The seed of a configuration's draws: its image i is seeded with this + i.

    Parameters
    ----------
    seed : int
        The run's seed (config key ``seed``).
    encoder, area : str
        The configuration.
    mode : {"shared", "per_configuration"}
        Config key `key`.
    key : str
        The config key `mode` comes from, named in the error.

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
        raise ValueError(f"{key} {mode!r}; allowed: {', '.join(SEED_MODES)}")
    digest = hashlib.sha256(f"{int(seed)}/{encoder}/{area}".encode()).digest()
    h = int.from_bytes(digest, "big") % CONFIGURATION_SEED_SLOTS
    return int(seed) + CONFIGURATION_SEED_STRIDE * (1 + h)


def configuration_diffusion(
    diffusion: dict, encoder: str, area: str, mode: str
) -> dict:
    """
    The diffusion settings a demo configuration's model is trained with: its
    ``train.seed`` from `configuration_seed` (config key ``demo.diffusion_seeds``).

    ``shared`` (the default) trains every configuration's model from the same seed:
    the same initial weights, batches and noise draws, only the responses differ;
    ``per_configuration`` gives each its own, as models trained apart would have, so
    that what G(x) shares across configurations is not their shared training.

    Raises
    ------
    ValueError
        For another mode.
    """
    train = diffusion["train"]
    seed = configuration_seed(
        int(train["seed"]), encoder, area, mode, key="demo.diffusion_seeds"
    )
    return {**diffusion, "train": {**train, "seed": seed}}


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


def job_seeds(scenario) -> dict[str, int]:
    """
    ``"<rule>/<encoder>/<area>"`` -> the seed of the per-image rule's jobs of that
    configuration: the configuration's (`Scenario.estimator_of`, config key
    ``monte_carlo_seeds``) for estimate_image, the noise ceiling's
    (`multigeom_workflow.settings.seeds.ceiling_estimator`) for
    estimate_image_ceiling: the seeds of the rules' ``params.estimator``.
    """
    ceiling = int(ceiling_estimator(scenario.estimator)["seed"])
    out = {}
    for c in scenario.configurations:
        out[f"{ESTIMATE_RULE}/{c.encoder}/{c.area}"] = int(
            scenario.estimator_of(c.encoder, c.area)["seed"]
        )
        out[f"{CEILING_RULE}/{c.encoder}/{c.area}"] = ceiling
    return out
