"""
Reruns that follow content, not file dates.

Snakemake reruns a job when one of its inputs is newer than its outputs, and checks
the content only of inputs up to 1 MB (``--max-checksum-file-size``; snakemake issue
#4172). A diffusion checkpoint is hundreds of MB: a ``touch``, a ``cp -r`` of the
checkout (new dates on every file) or a restore from a backup would plan every
per-image job of its configuration again, hours of GPU at the paper's scale, for the
same bytes.

Before Snakemake builds its plan, `keep_dates_of_unchanged_content` compares the files
the per-image results depend on (checkpoints, test images, the demo's data, the
TinyImageNet archive) with a registry of their content,
``<runs_dir>/.content_dates.json``: a file whose date changed but whose bytes did not
(SHA-256) gets back the date last recorded with that content, so Snakemake's
own rules (dates, then its checksums and params) decide as if nothing happened. A
file whose bytes changed keeps its new date, and Snakemake recomputes what depends on
it. Hashing runs only for files whose (size, modification time, status-change time)
differ from the registry: the status-change time moves on every write, rename, copy
and date change, so a file rewritten with its date kept is hashed too. The registry
is written when a real run parses the workflow, where dates are restored (a dry run
writes nothing), and at the end of every run
(`multigeom_workflow.on_snakemake.start.on_end`), where what the run wrote is only
recorded.

This is Snakemake's ``--touch`` run backwards: it changes only dates, only of files
whose content is the one recorded, and only to the date recorded with that content.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "REGISTRY_NAME",
    "ContentDates",
    "keep_dates_of_unchanged_content",
    "sha256_of",
]

#: The registry's file name, in the run's ``runs_dir`` (it travels with a copy of it).
REGISTRY_NAME = ".content_dates.json"
#: Registry format version (a file of another version is started afresh).
_VERSION = 1


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as hex (hashlib, read in chunks)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


@dataclass
class ContentDates:
    """
    What `keep_dates_of_unchanged_content` did, or in a dry run would do.

    Attributes
    ----------
    restored : list of str
        Files whose date changed with their content the same: their recorded date is
        back (in a dry run: would be).
    changed : list of str
        Files whose content changed since it was recorded: they keep their date, and
        Snakemake recomputes what depends on them.
    hashed : int
        Files read whole (new to the registry, or whose status changed).
    dates : dict of str to int
        Files Snakemake must see with their recorded date (ns since the epoch) that do
        not have it on disk: every restored one in a dry run, which changes nothing,
        and in a real run those whose date could not be set (`refused`).
        `multigeom_workflow.snakemake_adapter.show_snakemake` shows Snakemake these
        dates while it plans.
    refused : list of (str, str)
        (file, reason) of each date this run could not set (the file is another
        user's, or on a read-only mount).
    registry_problem : str or None
        Why the registry could not be written, or None.
    dry : bool
        A dry run: nothing was written.
    """

    restored: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    hashed: int = 0
    dates: dict[str, int] = field(default_factory=dict)
    refused: list[tuple[str, str]] = field(default_factory=list)
    registry_problem: str | None = None
    dry: bool = False

    def lines(self) -> list[str]:
        """One notice line per kind of change (none when nothing changed)."""
        out = []
        if self.restored and self.dry:
            out.append(
                f"would keep the recorded date of {len(self.restored)} input file(s) "
                f"with a new date but the same content (first: {self.restored[0]}): "
                "nothing would be recomputed for them (a dry run changes no file; "
                "docs/estimates.md)"
            )
        elif self.restored:
            out.append(
                f"{len(self.restored)} input file(s) have a new date but the same "
                f"content (first: {self.restored[0]}): their recorded date is kept, "
                "so nothing is recomputed for them (docs/estimates.md)"
            )
        if self.refused:
            f, why = self.refused[0]
            out.append(
                f"warning: could not set the recorded date of {len(self.refused)} "
                f"input file(s) with unchanged content (first: {f}: {why}): this run "
                "plans as if they had it, so nothing is recomputed for them"
            )
        if self.changed:
            out.append(
                f"{len(self.changed)} input file(s) have new content (first: "
                f"{self.changed[0]}): what depends on them "
                f"{'would be' if self.dry else 'is'} recomputed"
            )
        if self.registry_problem:
            out.append(
                f"warning: could not write the content registry: "
                f"{self.registry_problem}; the next run reads these files again"
            )
        return out


def keep_dates_of_unchanged_content(
    files: Iterable[str | Path],
    registry: str | Path,
    restore: bool = True,
    dry: bool = False,
    keep: Iterable[str] = (),
) -> ContentDates:
    """
    Give every file of `files` whose content is the one recorded in `registry` its
    recorded modification time back; record new and changed files. With `restore`
    False, only record what is there (at the end of a run: a file a job of the run
    rewrote with the same bytes keeps the date the job gave it, so that it is never
    made older than an input that changed). With `dry` (``snakemake -n``), write
    nothing: say what a real run would do, and hand the dates it would set to the
    planning (`ContentDates.dates`).

    A symbolic link has two dates Snakemake reads (its own and its target's: the later
    counts, snakemake/io `_IOFile.is_newer`): both are given back.

    A date that cannot be set (``os.utime`` refused: a file of another user, a
    read-only mount) or a registry that cannot be written never stops the run: each
    is said in one line (`ContentDates.lines`), and the refused dates are shown to
    Snakemake as they would have been; their entries stay as recorded (the end of the
    run passes them as `keep`), so that every later run shows the same.

    Parameters
    ----------
    files : iterable of path
        Regular files (or links to them) the per-image results depend on; missing ones
        are skipped (a rule of the run makes them), and stay in the registry.
    registry : path
        The JSON registry, ``{path: [size, mtime_ns, ctime_ns, sha256]}``, rewritten
        atomically when something changed (paths as given).
    keep : iterable of str
        Files whose entries stay as they are (dates this run could not set).

    Returns
    -------
    ContentDates
    """
    from ..atomic import atomic_path, error_reason

    registry = Path(registry)
    try:
        data = json.loads(registry.read_text())
        entries = data["files"] if data.get("version") == _VERSION else {}
    except (OSError, ValueError, KeyError, AttributeError):
        entries = {}
    out = ContentDates(dry=dry)
    keep = set(map(str, keep))
    dirty = False
    for f in dict.fromkeys(map(str, files)):
        if f in keep:
            continue
        try:
            st = os.stat(f)
            link = os.lstat(f) if os.path.islink(f) else None
        except OSError:
            continue
        key = _stat_key(st)
        known = entries.get(f)
        if known and known[:3] == key:
            digest = known[3]
        else:
            digest = sha256_of(f)
            out.hashed += 1
        if not (known and known[3] == digest and known[0] == st.st_size):
            if known:
                out.changed.append(f)
            entries[f] = [*key, digest]
            dirty = True
            continue
        recorded = known[1]
        target_moved = st.st_mtime_ns != recorded
        link_moved = link is not None and link.st_mtime_ns != recorded
        if restore and (target_moved or link_moved):
            if dry:
                out.restored.append(f)
                out.dates[f] = recorded
                continue
            try:
                if target_moved:
                    os.utime(f, ns=(st.st_atime_ns, recorded))
                if link_moved:
                    os.utime(f, ns=(link.st_atime_ns, recorded), follow_symlinks=False)
            except OSError as err:
                out.refused.append((f, error_reason(err)))
                out.dates[f] = recorded
                continue  # its entry stays: every later run shows the same
            out.restored.append(f)
            key = _stat_key(os.stat(f))  # the status-change time moved
        if known[:3] != key:
            entries[f] = [*key, digest]
            dirty = True
    if dirty and not dry:
        try:
            with atomic_path(registry) as tmp:
                Path(tmp).write_text(
                    json.dumps({"version": _VERSION, "files": entries})
                )
        except OSError as err:
            out.registry_problem = f"{registry}: {error_reason(err)}"
    return out
