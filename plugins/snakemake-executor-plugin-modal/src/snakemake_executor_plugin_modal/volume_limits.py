"""
How many entries a run would leave on the Modal volume, and what the dry run says of
it: a warning past the number of files and directories Modal says a volume works
best under, a refusal from its hard limit of inodes.

Modal's guide "Volumes" (https://modal.com/docs/guide/volumes): "Volumes work best
when they contain less than 50,000 files and directories. The latency to attach or
modify a volume scales linearly with the number of files in the volume"; "There is
currently a hard limit of 500,000 inodes (files, directories and symbolic links)
per volume", past which creating a file fails with ENOSPC.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

__all__ = [
    "BEST_ENTRIES",
    "MAX_INODES",
    "VOLUMES_GUIDE",
    "entries_of",
    "volume_entries_problem",
]

#: Files and directories under which Modal says a volume works best.
BEST_ENTRIES = 50_000
#: Modal's hard limit of inodes (files, directories, symbolic links) per volume.
MAX_INODES = 500_000
#: Where both numbers are documented.
VOLUMES_GUIDE = 'Modal\'s guide "Volumes", https://modal.com/docs/guide/volumes'


def entries_of(paths: Iterable[str]) -> int:
    """
    The inodes that files take on the volume: the files and every folder above
    them (paths relative to the run's folder; the folder itself counts).

    Parameters
    ----------
    paths : iterable of str
        POSIX paths of files, relative to the run's folder on the volume.

    Returns
    -------
    int
        Distinct files plus distinct folders (entries).
    """
    files = set(paths)
    folders = {str(parent) for f in files for parent in PurePosixPath(f).parents}
    return len(files) + len(folders)


def volume_entries_problem(entries: int) -> tuple[str, str] | None:
    """
    What the dry run says of a run that would leave `entries` entries on the volume.

    Parameters
    ----------
    entries : int
        Files and directories (inodes) the run writes to its folder of the volume
        (its outputs, their reuse markers, logs, benchmarks, container logs, staged
        inputs): what stays there if its jobs fail (a successful job's files leave
        the volume once home, `VolumeStager.prune`).

    Returns
    -------
    tuple of (str, str) or None
        ``("refuse", line)`` from `MAX_INODES` on (the volume would be full before
        the run ends), ``("warn", line)`` past `BEST_ENTRIES`, None below; the line
        names the count, the limit and `VOLUMES_GUIDE`.
    """
    if entries >= MAX_INODES:
        return (
            "refuse",
            f"the run would leave {entries:,} entries on the Modal volume, at or "
            f"past its hard limit of {MAX_INODES:,} inodes ({VOLUMES_GUIDE}): run it "
            "in parts (--until, fewer images) or give each part its own "
            "--modal-volume",
        )
    if entries > BEST_ENTRIES:
        return (
            "warn",
            f"the run would leave up to {entries:,} entries on the Modal volume, "
            f"past the {BEST_ENTRIES:,} files and directories under which a volume "
            f"works best ({VOLUMES_GUIDE}); a finished job's files leave it once "
            "home, a failed job's stay",
        )
    return None
