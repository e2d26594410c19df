"""
A live view of a run's per-image work: images done per configuration and the noise
ceiling's second estimates done (the rows of the dry run's estimate and of
``multigeom-workflow progress``), per-image computations per minute and time left,
drawn by the workflow's Snakemake logger plugin
(``--logger multigeom``, package ``snakemake_logger_plugin_multigeom``; the profiles
enable it).

The plan (every per-image file the run will compute, by configuration, and the noise
ceiling's in a row of their own, `settings.names.CEILING_ROW`) is handed over by the
workflow once Snakemake has planned (`set_plan`, from
`multigeom_workflow.on_snakemake.estimate.install`: the per-image files it will
compute); the view counts the files that exist (so images finished inside a SLURM
allocation or a Modal container show as their files arrive, not only when their whole
shard ends) and the per-image jobs Snakemake reports finished. On a terminal the view
is a table below Snakemake's usual messages (rich's ``Live``); elsewhere (a log file,
CI) Snakemake's messages are written as usual, with one plain ``progress:`` line
whenever the count changes.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from .cost import format_duration_short

__all__ = ["PLAN", "ProgressState", "set_plan"]

#: configuration ("encoder/area") -> its per-image files, and
#: `settings.names.CEILING_ROW` -> the noise ceiling's second estimates; filled by
#: `set_plan`.
PLAN: dict[str, list[str]] = {}


def set_plan(files_by_configuration: dict[str, list[str]]) -> None:
    """Hand the run's per-image files, by configuration, to the progress view."""
    PLAN.clear()
    PLAN.update({k: list(v) for k, v in files_by_configuration.items()})


@dataclass
class ProgressState:
    """
    Per-image files done per row (configuration, or `settings.names.CEILING_ROW`) and
    the rate of this run.

    Attributes
    ----------
    plan : dict
        Row (configuration, or `settings.names.CEILING_ROW`) -> its per-image files.
    initial : dict
        Configuration -> files that existed when the view started (not counted in the
        rate).
    started : float
        ``time.monotonic()`` at the start.
    """

    plan: dict[str, list[str]]
    initial: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.initial = {c: self._count(files) for c, files in self.plan.items()}
        self.done = dict(self.initial)

    @staticmethod
    def _count(files: list[str]) -> int:
        return sum(os.path.exists(f) for f in files)

    def restart_clock(self) -> None:
        """Count the rate from now: files done so far no longer count in it."""
        self.refresh()
        with self.lock:
            self.initial = dict(self.done)
            self.started = time.monotonic()

    def refresh(self) -> bool:
        """Count the files again; True when a count changed."""
        new = {c: self._count(files) for c, files in self.plan.items()}
        with self.lock:
            changed = new != self.done
            self.done = new
        return changed

    def totals(self) -> tuple[int, int, int]:
        """(images done, images in all, images done by this run)."""
        done = sum(self.done.values())
        total = sum(len(f) for f in self.plan.values())
        return done, total, done - sum(self.initial.values())

    def rate_per_min(self, now: float | None = None) -> float | None:
        """Images per minute of this run, None before the first one."""
        _, _, new = self.totals()
        elapsed = (now if now is not None else time.monotonic()) - self.started
        if new <= 0 or elapsed <= 0:
            return None
        return 60.0 * new / elapsed

    def seconds_left(self, now: float | None = None) -> float | None:
        """Images left / images per second, None while the rate is unknown."""
        done, total, _ = self.totals()
        rate = self.rate_per_min(now)
        if rate is None:
            return None
        return 60.0 * (total - done) / rate

    def line(self, now: float | None = None) -> str:
        """The plain one-line summary (for logs and CI)."""
        done, total, _ = self.totals()
        per_config = ", ".join(
            f"{c} {self.done[c]}/{len(f)}" for c, f in self.plan.items()
        )
        rate = self.rate_per_min(now)
        left = self.seconds_left(now)
        speed = "rate not known yet" if rate is None else f"{rate:.3g} per min"
        eta = "" if left is None else f"; about {format_duration_short(left)} left"
        return (
            f"progress: {done}/{total} per-image computations ({per_config}); "
            f"{speed}{eta}"
        )

    def table(self, now: float | None = None):
        """The live view: a rich table, one row per configuration and a total."""
        from rich.table import Table

        rate = self.rate_per_min(now)
        left = self.seconds_left(now)
        done, total, _ = self.totals()
        title = "per-image computations: " + (
            "rate not known yet"
            if rate is None
            else f"{rate:.3g} per min, about {format_duration_short(left)} left"
        )
        table = Table(title=title, title_justify="left")
        table.add_column("configuration")
        table.add_column("done", justify="right")
        table.add_column("", justify="left")
        for c, files in self.plan.items():
            n = len(files)
            bar_n = 20 * self.done[c] // n if n else 20
            table.add_row(c, f"{self.done[c]}/{n}", "█" * bar_n + "·" * (20 - bar_n))
        table.add_row("all", f"{done}/{total}", "")
        return table
