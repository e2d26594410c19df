"""
The run's per-image files on the Modal Volume of the executor plugin: how many are
there (committed), and deleting chosen ones.

The plugin mirrors the working directory under one folder of the volume (its
``--modal-volume-prefix``, by default the working directory's name and a hash of its
absolute path), so the per-image file ``runs/per_image/onoff/V1/img0000.pt`` is
``<prefix>/runs/per_image/onoff/V1/img0000.pt`` there. Containers commit finished
per-image files while they run (every ``--modal-sync-seconds``), so counting them
shows the progress of a running shard; a file there is reused (not recomputed) by the
next run whose job has the same inputs and settings, which then downloads it. A
finished shard's files leave the volume once home (the plugin's pruning, unless
``--modal-keep-on-volume``): what is counted there is what is not home yet.

The listing and the deletion are the plugin's (``VolumeStager.files`` and
``VolumeStager.remove``): one home for the volume's layout.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from ..scenario import ConfigError, Scenario

__all__ = ["default_prefix", "volume_files", "volume_progress", "volume_remove"]


def default_prefix() -> str:
    """
    The plugin's default folder on the volume for this working directory (its name
    and a hash of its absolute path; the plugin's own function).
    """
    from snakemake_executor_plugin_modal.staging import default_prefix as plugin

    return plugin(Path.cwd())


def _stager(volume_name: str, prefix: str):
    """
    The plugin's view of the run's folder on the volume
    (:class:`snakemake_executor_plugin_modal.staging.VolumeStager`).

    ``modal.Volume.from_name`` is lazy (Modal 1.6, ``modal/volume.py``): the volume
    is looked up here (``hydrate``), so that a mistyped name is said as such, not
    counted as an empty volume.

    Raises
    ------
    ConfigError
        If there is no volume of that name in the Modal workspace.
    """
    import modal
    import modal.exception
    from snakemake_executor_plugin_modal.staging import VolumeStager

    try:
        volume = modal.Volume.from_name(volume_name).hydrate()
    except modal.exception.NotFoundError:
        raise ConfigError(
            f"--modal-volume {volume_name!r}: no such volume on Modal (its volumes: "
            "`modal volume list`); give the profile's modal-volume"
        ) from None
    return VolumeStager(volume, prefix, Path.cwd())


def volume_files(volume_name: str, prefix: str, folder: str) -> set[str]:
    """
    Committed files under ``<prefix>/<folder>`` of a Modal Volume, as paths relative
    to the working directory; empty if the folder does not exist.

    Raises
    ------
    ConfigError
        If the volume does not exist.
    """
    return set(_stager(volume_name, prefix).files(folder))


def volume_progress(
    scenario: Scenario, volume_name: str, prefix: str
) -> dict[tuple[str, str], tuple[int, int]]:
    """
    Per configuration (encoder, area): (per-image files on the volume, first n_images
    images), as :func:`multigeom_workflow.planning.plan.progress` counts local files.
    A finished shard's files leave the volume once home (the Modal plugin's pruning;
    ``--modal-keep-on-volume`` keeps them): without that setting this counts the
    files committed and not home yet, those the next run takes from the volume.
    """
    on_volume = volume_files(volume_name, prefix, f"{scenario.runs_dir}/per_image")
    out = {}
    for c in scenario.configurations:
        files = [str(PurePosixPath(f)) for f in scenario.per_image_files(c)]
        out[(c.encoder, c.area)] = (sum(f in on_volume for f in files), len(files))
    return out


def volume_remove(files: list[str], volume_name: str, prefix: str) -> list[str]:
    """
    Delete these files (paths relative to the working directory) from the volume,
    with the plugin's records that would let a later run reuse them; returns those
    that were there.

    Raises
    ------
    ConfigError
        If the volume does not exist.
    """
    return _stager(volume_name, prefix).remove(files)
