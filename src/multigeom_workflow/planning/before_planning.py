"""
What a run changes before Snakemake builds its plan, and what a dry run says instead.

Three things would make Snakemake's plan wrong if left as they are on disk:

- files SLURM allocations finished before they ended early, which Snakemake removed
  with their shard: put back from the allocation's kept folder
  (`multigeom_workflow.compute.kept`);
- inputs whose date changed but not their content (a ``touch``, a ``cp -r``): their
  recorded date given back (`multigeom_workflow.planning.content_dates`);
- per-image files changed behind the check's back with their date kept (a truncated
  copy, ``cp -p`` of another file): checked now, a bad one set aside as
  ``<name>.bad`` so that it is computed again (`multigeom_workflow.results.verify`).

A real run does these (`before_planning` with ``dry=False``); a file it may not change
(another user's checkpoint, a read-only mount) is said in one line and the run goes
on, planning as if it had changed it. A dry run changes nothing, as Snakemake promises
for ``-n``: it says what the real run would do ("would ...") and hands Snakemake a
`PlanningView` in which those files look as the real run would leave them, so that its
plan, and the count of what is left, are the real run's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import error_reason
from ..compute.kept import ended_allocation_files
from .content_dates import REGISTRY_NAME, keep_dates_of_unchanged_content

__all__ = ["BeforePlanning", "PlanningView", "before_planning", "content_inputs"]


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


def content_inputs(scenario) -> list[str]:
    """
    The files the per-image results depend on, whose dates follow their content
    (`multigeom_workflow.planning.content_dates`): every file under ``runs_dir`` but
    the results (per-image files, metrics, ground truth), the configurations'
    checkpoints wherever they are, the test images and TinyImageNet's archive.
    """
    runs = Path(scenario.runs_dir)
    results = {"per_image", "per_image_ceiling", "metrics", "ground_truth"}
    out = []
    if runs.is_dir():
        for root, dirs, files in os.walk(runs):
            if Path(root) == runs:
                dirs[:] = [d for d in dirs if d not in results]
            out += [
                os.path.join(root, f)
                for f in files
                if not f.startswith(".") and not f.endswith((".bad", ".part"))
            ]
    for c in scenario.configurations:
        out += [c.encoder_ckpt, c.diffusion_ckpt]
    images = list(scenario.test_image_files[: scenario.n_images])
    out += images
    if scenario.test_source == "tinyimagenet" and images:
        from ..settings.names import TINYIMAGENET_DIR

        val = Path(images[0]).parents[2]  # <path>/tiny-imagenet-200/val/images/x
        if val.name == TINYIMAGENET_DIR:
            out.append(str(val.parent / f"{TINYIMAGENET_DIR}.zip"))
    return sorted(set(out))


def record_contents(
    scenario, restore: bool = True, dry: bool = False, keep: Iterable[str] = ()
):
    """
    Record the content of the run's inputs (`content_inputs`) in the registry, and
    with `restore` give unchanged ones their recorded dates
    (`keep_dates_of_unchanged_content`; with `dry`, say so and write nothing; the
    entries of `keep`, dates this run could not set, left as recorded).

    Returns
    -------
    multigeom_workflow.planning.content_dates.ContentDates
    """
    return keep_dates_of_unchanged_content(
        content_inputs(scenario),
        Path(scenario.runs_dir) / REGISTRY_NAME,
        restore,
        dry,
        keep,
    )


@dataclass
class BeforePlanning:
    """
    What `before_planning` did (or in a dry run would do).

    Attributes
    ----------
    lines : list of str
        One line per kind of change, for the run's output (``warning:`` first where
        something could not be done).
    view : PlanningView
        The files Snakemake must see other than on disk while it plans
        (`multigeom_workflow.snakemake_adapter.show_snakemake`).
    refused_dates : list of str
        Inputs whose recorded date a real run could not set back (their registry
        entries stay as recorded: `record_contents`' ``keep`` at the run's end).
    """

    lines: list[str] = field(default_factory=list)
    view: PlanningView = field(default_factory=PlanningView)
    refused_dates: list[str] = field(default_factory=list)


def before_planning(scenario, dry: bool) -> BeforePlanning:
    """
    In a real run, change what must change before Snakemake plans: files kept by SLURM
    allocations that ended early put back, unchanged inputs' dates kept, per-image
    files changed since the check checked and set aside where bad; in a dry run
    (`dry`), change nothing and say what would be done.

    Nothing here raises for a file the user may not change: it is said in one line
    (`BeforePlanning.lines`) and the plan is built as if it had been changed.

    Parameters
    ----------
    scenario : multigeom_workflow.scenario.Scenario
    dry : bool
        ``snakemake -n`` (or a command that only inspects: ``--summary``,
        ``--list-changes``, ...): write, rename, link and date nothing.

    Returns
    -------
    BeforePlanning
    """
    from ..results.verify import (
        bad_per_image_files,
        changed_since_checked,
        refresh_checked,
        run_files,
        set_aside,
    )
    from .slurm_checks import per_image_folders, restore_ended_allocations

    out = BeforePlanning()
    # 1. SLURM shards cut short: their finished files back
    if dry:
        ended = ended_allocation_files(per_image_folders(scenario))
        # a file its folder's user may not write back stays missing: computed
        back = [
            (t, k) for t, k in ended.put_back if os.access(t.parent, os.W_OK | os.X_OK)
        ]
        if back:
            out.lines.append(
                f"would put back {len(back)} per-image file(s) finished in "
                f"SLURM allocation(s) that ended early ({', '.join(ended.ended)}; "
                "UNKNOWN: SLURM gave no state): only the images still missing would "
                "be computed"
            )
            out.view.add(present={str(t): str(k) for t, k in back})
    else:
        line = restore_ended_allocations(scenario)
        if line:
            out.lines.append(line)
    # 2. inputs with a new date and the same content
    dates = record_contents(scenario, dry=dry)
    out.lines += dates.lines()
    out.view.add(dates=dates.dates)
    out.refused_dates = [f for f, _ in dates.refused]
    # 3. per-image files changed behind the check's back
    checked = scenario.layout.per_image_checked
    changed = changed_since_checked([f for f, *_ in run_files(scenario)], checked)
    if not changed:
        return out
    bad = bad_per_image_files(scenario, only=changed)
    for f, problem in bad:
        why = f"{problem} (changed since it was checked)"
        if dry:
            out.lines.append(
                f"warning: per-image file {f} {why}: would be set aside as "
                f"{Path(f).name}.bad and computed again"
            )
            out.view.add(missing=[f])
            continue
        try:
            set_aside([f])
        except OSError as err:
            out.lines.append(
                f"warning: per-image file {f} {why}: could not be set aside "
                f"({error_reason(err)}): planned again as if it had been"
            )
            out.view.add(missing=[f])
        else:
            out.lines.append(
                f"warning: per-image file {f} {why}: set aside as {Path(f).name}.bad, "
                "computed again in this run"
            )
    good = set(changed) - {f for f, _ in bad}
    if good and not dry:
        try:
            refresh_checked(checked, good)
        except OSError as err:
            out.lines.append(
                f"warning: could not record {len(good)} per-image file(s) checked "
                f"again in {checked} ({error_reason(err)}): the next run checks them "
                "again"
            )
    return out
