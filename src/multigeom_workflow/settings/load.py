"""
Loading the configuration as Snakemake does, for the commands that start no Snakemake
run (``multigeom-workflow progress``, ``verify``, ``clear``): Snakemake's own functions,
in Snakemake's order, so that the CLI and the Snakefile see the same configuration.
"""

from __future__ import annotations

import copy
from pathlib import Path

from .errors import ConfigError

__all__ = [
    "SNAKEFILE_CONFIGFILE",
    "defaults_taken",
    "defaults_taken_line",
    "load_config",
]


#: The Snakefile's ``configfile:`` (relative to the working directory, as Snakemake
#: reads it).
SNAKEFILE_CONFIGFILE = "config/config.yaml"


def _load_configfile(path: str, flag: str) -> dict:
    """Snakemake's `load_configfile`, its errors as one line naming the file."""
    from snakemake_interface_common.exceptions import WorkflowError

    from ..snakemake_adapter import read_config_file

    if not Path(path).is_file():
        raise ConfigError(f"{flag} {path!r}: no such file")
    try:
        return read_config_file(path)
    except WorkflowError as err:
        if "keys at top level" in str(err):
            import yaml

            data = yaml.safe_load(Path(path).read_text())
            raise ConfigError(
                f"{flag} {path!r}: holds a {type(data).__name__}, not a mapping of "
                "config keys; write one `key: value` per line at the top level"
            ) from None
        raise ConfigError(f"{flag} {path!r}: {' '.join(str(err).split())}") from None


def load_config(
    configfiles: list[str],
    overrides: list[str],
    workflow_dir: Path | None = None,
    replace_workflow_config: bool = False,
) -> dict:
    """
    The configuration Snakemake sees, loaded and merged by Snakemake's own functions
    (`snakemake.common.configfile.load_configfile`, `snakemake.utils.update_config`,
    `snakemake.cli.parse_config`) in Snakemake's order (`Workflow.configfile`): the
    ``--configfile`` files deep-merged in order, then ``--config KEY=VALUE``, make the
    command line's settings; the Snakefile's ``configfile:`` (``config/config.yaml`` of
    the working directory) is loaded when present, and the command line's settings are
    deep-merged over it (or replace it, with ``--replace-workflow-config``).

    Raises
    ------
    ConfigError
        One line naming the file or the entry: a missing file, a file that is not a
        mapping, an override that is not ``KEY=VALUE``.
    """
    from snakemake.utils import update_config

    from ..snakemake_adapter import read_config_values

    command_line: dict = {}
    for name in configfiles:
        update_config(command_line, _load_configfile(name, "--configfile"))
    try:
        update_config(command_line, read_config_values(overrides))
    except Exception as err:  # ValueError, Snakemake's WorkflowError
        raise ConfigError(f"--config {' '.join(overrides)!r}: {err}") from None
    config = copy.deepcopy(command_line)
    if Path(SNAKEFILE_CONFIGFILE).exists():
        update_config(config, _load_configfile(SNAKEFILE_CONFIGFILE, "configfile"))
        if command_line:
            if replace_workflow_config:
                config = {}
            update_config(config, command_line)
    elif not configfiles:
        raise ConfigError(
            f"the Snakefile's configfile {SNAKEFILE_CONFIGFILE!r} is not in this "
            f"folder ({Path.cwd()}): run in the working directory of the runs, or give "
            "--configfile"
        )
    return config


def defaults_taken(
    workflow_config: dict, given: dict, schema: dict, skip: tuple[str, ...] = ()
) -> list[tuple[str, object]]:
    """
    The values a run takes from the Snakefile's ``configfile:`` (config/config.yaml,
    the demo's) because the command line's config files do not set them, where they
    differ from the schema's default: (dotted key, value), in the file's order.

    Snakemake deep-merges ``--configfile`` over the Snakefile's file
    (`snakemake.utils.update_config`), so a key left out of one's own file is the
    demo's, silently: e.g. ``estimator`` is then ``config/estimator_demo.yaml``,
    while the schema's default is upstream's ``estimator``.

    Parameters
    ----------
    workflow_config : dict
        The Snakefile's config file, as read.
    given : dict
        What ``--configfile`` and ``--config`` set
        (`multigeom_workflow.snakemake_adapter.configfile_values`).
    schema : dict
        The config schema (config/schemas/config.schema.yaml), for its defaults.
    skip : tuple of str
        Dotted keys left out (with what is below them), e.g. ``("demo",)`` when no
        configuration is a demo area.
    """
    out: list[tuple[str, object]] = []

    def walk(prefix: str, base: dict, given: dict, props: dict) -> None:
        for key, value in base.items():
            name = f"{prefix}{key}"
            if name in skip:
                continue
            spec = props.get(key) or {}
            mine = given.get(key, {})
            if isinstance(value, dict) and isinstance(mine, dict):
                walk(f"{name}.", value, mine, spec.get("properties") or {})
            elif key in given:
                continue
            elif "default" not in spec or spec["default"] != value:
                out.append((name, value))

    walk("", workflow_config, given, schema.get("properties") or {})
    return out


def defaults_taken_line(taken: list[tuple[str, object]]) -> str | None:
    """
    The run's one line naming `defaults_taken` (None when there are none): each key
    and the value it took (a list of configurations as its count).
    """
    if not taken:
        return None

    def shown(value) -> str:
        if isinstance(value, list):
            return f"[{len(value)} entries]"
        return str(value)

    values = ", ".join(f"{key} = {shown(value)}" for key, value in taken)
    return (
        f"note: {SNAKEFILE_CONFIGFILE} (the demo's settings) gives the keys your "
        f"--configfile leaves out: {values}; set them in your file to change them "
        "(config/README.md)"
    )
