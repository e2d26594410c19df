"""
The one place that touches Snakemake's internals for the planning view.

A dry run changes no file (Snakemake's promise for ``-n``), yet its plan must be the
one a real run would build after what a real run changes before planning
(`multigeom_workflow.planning.before_planning`): the recorded dates of inputs whose
content is unchanged, per-image files set aside as damaged, files kept by SLURM
allocations put back. `show_snakemake` lets Snakemake see those files as the real run
would leave them, without touching them: it wraps the three methods through which
Snakemake's planning reads a local file (``snakemake.io._IOFile.exists_local``,
``mtime_uncached`` and ``size_local``; snakemake/dag.py reads existence, dates and
sizes only through them, and its IO cache stores what they return).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["INTERNALS", "PlanningView", "show_snakemake"]

#: The Snakemake internals used by this module, each with its use;
#: tests/test_snakemake_hooks.py checks that each still exists as used.
INTERNALS = {
    "snakemake.io._IOFile.exists_local": "a file as a real run leaves it (exists)",
    "snakemake.io._IOFile.mtime_uncached": "a file as a real run leaves it (date)",
    "snakemake.io._IOFile.size_local": "a file as a real run leaves it (size)",
    "snakemake.io._IOFile.file": "the path a rule's file names",
}


@dataclass
class PlanningView:
    """
    Files Snakemake must see other than they are on disk while it plans.

    Attributes
    ----------
    missing : set of str
        Files that exist but are seen missing (a real run sets them aside).
    dates : dict of str to int
        File -> the modification time it is seen with, in ns since the epoch (a real
        run gives it back its recorded date).
    present : dict of str to str
        File missing on disk -> the file seen in its place (a real run puts it back
        from there).

    Paths are made absolute against the working directory of the moment.
    """

    missing: set[str] = field(default_factory=set)
    dates: dict[str, int] = field(default_factory=dict)
    present: dict[str, str] = field(default_factory=dict)

    def add(
        self,
        missing: Iterable[str] = (),
        dates: Mapping[str, int] | None = None,
        present: Mapping[str, str] | None = None,
    ) -> None:
        """Add files to the view (paths as given, made absolute)."""
        self.missing.update(os.path.abspath(f) for f in missing)
        self.dates.update({os.path.abspath(f): ns for f, ns in (dates or {}).items()})
        self.present.update(
            {os.path.abspath(f): str(src) for f, src in (present or {}).items()}
        )

    def __bool__(self) -> bool:
        return bool(self.missing or self.dates or self.present)


def show_snakemake(view: PlanningView) -> bool:
    """
    Make this process's Snakemake see the files of `view` as given, from now on;
    nothing when the view is empty. Returns whether it wrapped Snakemake's methods.

    Call it before Snakemake builds its plan (at parse time). Every other file is
    read as before, through the original methods.
    """
    if not view:
        return False
    from snakemake.io import _IOFile
    from snakemake_interface_storage_plugins.io import Mtime

    exists_local = _IOFile.exists_local
    mtime_uncached = _IOFile.mtime_uncached
    size_local = _IOFile.size_local
    missing, dates, present = view.missing, view.dates, view.present

    async def seen_exists_local(self):
        path = os.path.abspath(self.file)
        if path in missing:
            return False
        if path in present:
            return True
        return await exists_local(self)

    async def seen_mtime_uncached(self, skip_storage: bool = False):
        path = os.path.abspath(self.file)
        if path in present:
            return Mtime(local=os.stat(present[path]).st_mtime)
        if path in dates:
            return Mtime(local=dates[path] / 1e9)
        return await mtime_uncached(self, skip_storage=skip_storage)

    async def seen_size_local(self):
        path = os.path.abspath(self.file)
        if path in present:
            return os.path.getsize(present[path])
        return await size_local(self)

    _IOFile.exists_local = seen_exists_local
    _IOFile.mtime_uncached = seen_mtime_uncached
    _IOFile.size_local = seen_size_local
    return True
