"""
Checks of the configuration that need no input file and no device: the estimator's
settings against the diffusion model's and `top_k`, the seeds, the engine and its
precision, the folders the run writes into. Each failure is one `ConfigError` line
naming the key, the value and what is allowed; `multigeom_workflow.scenario` calls
them before any job runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError
from .files import setting, timestep_grid
from .layout import RunLayout
from .names import ENGINES, MAX_SEED, N_PIXELS, PRECISIONS
from .seeds import CEILING_SEED_OFFSET, overlapping_seeds, seed_ranges

__all__ = [
    "check_engine",
    "check_estimator",
    "check_seed",
    "check_writable",
]


def check_estimator(
    est: dict,
    diff: dict,
    top_k: int,
    est_file: Path,
    diff_file: Path,
    keys: tuple[str, str] = ("estimator", "diffusion"),
):
    """
    The checks that upstream makes while running, made before any job.

    `keys` are the config keys the two files were given as (a configuration's own:
    ``("configs[1].estimator", "configs[1].diffusion")``), named by the messages; a
    sigma given per configuration is already in both settings.

    Raises
    ------
    ConfigError
        One line naming the key, the file, the value and what is allowed.
    """
    est_key, diff_key = keys
    mc = "monte_carlo"
    n_samples = int(setting(est, f"{mc}.n_samples", est_key, est_file))
    batch = int(setting(est, f"{mc}.batch_size", est_key, est_file))
    for part in ("start", "stop", "step"):  # present, or one clear line
        setting(est, f"{mc}.timestep_grid.{part}", est_key, est_file)
    sigma = float(setting(est, f"{mc}.observation_noise_sigma", est_key, est_file))
    sigma_train = float(
        setting(diff, "conditioning.observation_noise_sigma", diff_key, diff_file)
    )
    n_train_t = int(setting(diff, "scheduler.num_train_timesteps", diff_key, diff_file))
    if batch < 1 or n_samples % batch:
        raise ConfigError(
            f"config key {est_key!r} = {str(est_file)!r}: monte_carlo.n_samples = "
            f"{n_samples} must be a positive multiple of monte_carlo.batch_size = "
            f"{batch}"
        )
    timesteps = timestep_grid(est)
    if len(timesteps) < 2 or timesteps[0] < 0 or timesteps[-1] >= n_train_t:
        raise ConfigError(
            f"config key {est_key!r} = {str(est_file)!r}: monte_carlo.timestep_grid "
            f"gives {list(timesteps)}; at least 2 timesteps in [0, {n_train_t}) allowed"
        )
    if sigma != sigma_train:
        raise ConfigError(
            f"config key {est_key!r} = {str(est_file)!r}: observation_noise_sigma = "
            f"{sigma} differs from the sigma = {sigma_train} the diffusion model of "
            f"{str(diff_file)!r} was trained with; they must be equal"
        )
    rows = len(timesteps) * n_samples
    if top_k > min(rows, N_PIXELS):
        raise ConfigError(
            f"config key 'top_k' = {top_k}: the estimator gives "
            f"{len(timesteps)} timesteps x {n_samples} samples = {rows} rows, so at "
            f"most {min(rows, N_PIXELS)} eigenvectors of G(x) are allowed"
        )
    if not (est.get("fisher_baseline") or {}).get("enabled", True):
        raise ConfigError(
            f"config key {est_key!r} = {str(est_file)!r}: fisher_baseline.enabled = "
            "false; the workflow compares J(x) too (panel E, every per-image file "
            "holds it): allowed: true (or leave the key out)"
        )
    n_neurons = int(setting(diff, "conditioning.mlp_layers", diff_key, diff_file)[0])
    if top_k > n_neurons:
        raise ConfigError(
            f"config key 'top_k' = {top_k}: J(x) has rank at most the {n_neurons} "
            f"neurons of the diffusion model's conditioning; at most {n_neurons} "
            "allowed"
        )


def check_seed(
    seed: int,
    n_images: int,
    ceiling_images: int = 0,
    configurations: tuple = (),
    mode: str = "shared",
):
    """
    Image i is seeded with seed + i (`monte_carlo_seeds` per_configuration: the
    configuration's seed + i, `multigeom_workflow.settings.seeds.configuration_seed`),
    and its noise-ceiling estimate with seed + `CEILING_SEED_OFFSET` + i: every one must
    fit `torch.Generator`, and no two of these streams may draw the same numbers
    (compared modulo 2**32, `multigeom_workflow.settings.seeds.overlapping_seeds`).
    """
    ranges = seed_ranges(
        seed,
        [(c.encoder, c.area) for c in configurations],
        n_images,
        ceiling_images,
        mode,
    )
    offset = max(last for _, _, last in ranges) - seed
    if seed < 0 or seed + offset > MAX_SEED:
        how = (
            "image i is seeded with seed + i"
            if mode == "shared"
            else "image i of a configuration is seeded with seed + 2**16 * (1 + H) + i "
            "(monte_carlo_seeds: per_configuration, H < 65535)"
        )
        raise ConfigError(
            f"config key 'seed' = {seed}: {how} (and its "
            f"noise-ceiling estimate with seed + {CEILING_SEED_OFFSET} + i), which "
            f"torch.Generator.manual_seed takes from 0 to 2**64 - 1; allowed with "
            f"n_images = {n_images}, noise_ceiling_images = {ceiling_images}: 0 to "
            f"{MAX_SEED - offset}"
        )
    pair = overlapping_seeds(ranges)
    if pair is not None:
        (a, a_first, a_last), (b, b_first, b_last) = pair
        allowed = (
            f"n_images at most {CEILING_SEED_OFFSET} (the noise ceiling's seeds "
            f"start at seed + {CEILING_SEED_OFFSET})"
            if mode == "shared"
            else "another seed (it moves every configuration's seeds)"
        )
        raise ConfigError(
            f"config key 'seed' = {seed}: with monte_carlo_seeds {mode!r}, the seeds "
            f"of {a} ({a_first} to {a_last}) and of {b} ({b_first} to {b_last}) draw "
            "the same numbers (torch's CPU generator reads a seed's low 32 bits), so "
            f"their Monte-Carlo draws would not be independent; allowed: {allowed}"
        )


def check_writable(config: dict, runs_dir: str, configurations=()):
    """The folders the run writes into: existing ones must be writable folders."""
    folders = [("runs_dir", runs_dir), ("results_dir", str(config["results_dir"]))]
    for key, value in folders:
        path = Path(value)
        below = []
        if key == "runs_dir":
            layout = RunLayout(value)
            below = [path / "per_image", path / "metrics"] + [
                Path(layout.per_image_folder(c.encoder, c.area)) for c in configurations
            ]
        while not path.exists() and path != path.parent:
            path = path.parent
        for folder in [path, *(p for p in below if p.exists())]:
            if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                what = "not a folder" if not folder.is_dir() else "not writable"
                raise ConfigError(
                    f"config key {key!r} = {value!r}: {str(folder)!r} is {what}; give "
                    "a folder this user can write to (or fix its permissions)"
                )


def check_engine(config: dict, device: str, remote: bool) -> tuple[str, str]:
    """
    The config's ``engine`` and ``precision`` (defaults fast and fp32), checked against
    the allowed values (`ENGINES`, `PRECISIONS`) and the device: tf32 needs a CUDA
    device (on the CPU it would silently be fp32).
    """
    engine = str(config.get("engine", "fast"))
    precision = str(config.get("precision", "fp32"))
    for key, value, allowed in (
        ("engine", engine, ENGINES),
        ("precision", precision, PRECISIONS),
    ):
        if value not in allowed:
            raise ConfigError(
                f"config key {key!r} = {value!r}: allowed: {', '.join(allowed)}"
            )
    if precision == "tf32" and not device.startswith("cuda") and not remote:
        raise ConfigError(
            f"config key 'precision' = 'tf32' needs a CUDA device (device resolves to "
            f"{device!r}); allowed on the CPU: fp32"
        )
    return engine, precision
