"""
Settings files: upstream's packaged YAML files (``estimator``, ``diffusion``) or the
user's, found, read and turned into what upstream's stages take.

Nothing here imports torch (the Snakefile reads settings at parse time).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import yaml

from .errors import ConfigError

__all__ = [
    "CHECKOUT_DIR",
    "load_settings_yaml",
    "packaged_config_dir",
    "resolve_settings_file",
    "setting",
    "timestep_grid",
    "to_namespace",
]

#: The checkout this package is installed from (editable install: ``pip install -e
#: .``): the folder of the Snakefile, ``profiles/`` and ``config/``.
CHECKOUT_DIR = Path(__file__).resolve().parents[3]


def to_namespace(settings):
    """
    Settings as upstream's stages take them: nested dicts become nested
    `types.SimpleNamespace`, as `multigeom.config.load_config` returns a YAML file.
    """
    if isinstance(settings, dict):
        return SimpleNamespace(**{k: to_namespace(v) for k, v in settings.items()})
    if isinstance(settings, list):
        return [to_namespace(v) for v in settings]
    return settings


def timestep_grid(estimator: dict) -> range:
    """
    The DDPM timesteps of an estimator's settings (``monte_carlo.timestep_grid``: start,
    stop inclusive, step), as upstream's `conditional_pair_estimate` builds them.
    """
    grid = estimator["monte_carlo"]["timestep_grid"]
    return range(int(grid["start"]), int(grid["stop"]) + 1, int(grid["step"]))


def packaged_config_dir() -> Path:
    """
    The folder of upstream's packaged settings (``multigeom/configs``), found without
    importing `multigeom` (which imports torch).
    """
    spec = importlib.util.find_spec("multigeom")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the package multigeom is not installed: pip install -e . (see README.md)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "configs"


def resolve_settings_file(value: str, key: str, workflow_dir: Path) -> Path:
    """
    The YAML file of a settings value: a path (relative to the working directory, then
    to the workflow's folder) or a packaged name of upstream (``"estimator"``,
    ``"diffusion"``), as upstream's `multigeom.config.config_path` resolves names.

    Raises
    ------
    ConfigError
        If neither a file nor a packaged name matches.
    """
    path = Path(value)
    candidates = [path] if path.is_absolute() else [path, workflow_dir / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    packaged_dir = packaged_config_dir()
    if path.suffix == "" and (packaged_dir / f"{path.name}.yaml").is_file():
        return packaged_dir / f"{path.name}.yaml"
    names = sorted(p.stem for p in packaged_dir.glob("*.yaml"))
    raise ConfigError(
        f"config key {key!r} = {value!r}: no such YAML file; give a path or one of "
        f"upstream's packaged names {names}"
    )


def load_settings_yaml(path: Path, key: str) -> dict:
    """
    The mapping of a settings file given as config key `key`.

    Raises
    ------
    ConfigError
        If the file is not valid YAML or not a mapping.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        problem = str(err).splitlines()[0]
        raise ConfigError(
            f"config key {key!r} = {str(path)!r}: not valid YAML ({problem})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config key {key!r} = {str(path)!r}: not a YAML mapping")
    return data


def setting(settings: dict, dotted: str, key: str, file: Path):
    """
    The value at `dotted` (e.g. ``"monte_carlo.n_samples"``) of the settings read
    from `file` (config key `key`).

    Raises
    ------
    ConfigError
        If the settings lack it.
    """
    node = settings
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(
                f"config key {key!r} = {str(file)!r}: the settings have no "
                f"{dotted!r}; start from upstream's packaged file of the same name"
            )
        node = node[part]
    return node
