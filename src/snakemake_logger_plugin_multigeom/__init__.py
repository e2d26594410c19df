"""
Snakemake logger plugin ``multigeom`` (``snakemake --logger multigeom``): Snakemake's
usual messages, and the workflow's progress view (images done per configuration and
the noise ceiling's second estimates done, per-image computations per minute, time
left; `multigeom_workflow.planning.live_view`).

On a terminal the view is a live table below the messages; when the output is not a
terminal (a log file, CI), or with ``--logger-multigeom-plain``, the messages are
written as Snakemake writes them, with a plain ``progress:`` line whenever the count of
per-image files changes. A dry run has no view: Snakemake's own handler writes its
messages then, in Snakemake's thread (a dry run logs two records per job: handed to a
plugin's thread, 40,000 jobs cost seconds more). Without the plugin (``--logger`` not
given) Snakemake's output is unchanged.
"""

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Optional

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

from multigeom_workflow.settings.names import ESTIMATE_RULE

__all__ = ["LogHandler", "LogHandlerSettings"]

# No `from __future__ import annotations` here: Snakemake reads the settings' types
# from the dataclass's annotations at run time.


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    """Settings of the progress view (flags ``--logger-multigeom-*``)."""

    plain: bool = field(
        default=False,
        metadata={
            "help": "Write plain lines (Snakemake's messages and a 'progress:' line "
            "when the count changes) even on a terminal: --logger-multigeom-plain.",
            "env_var": False,
            "required": False,
        },
    )
    interval: Optional[float] = field(
        default=5.0,
        metadata={
            "help": "Seconds between two counts of the per-image files: "
            "--logger-multigeom-interval.",
            "env_var": False,
            "required": False,
        },
    )


class LogHandler(LogHandlerBase):
    """Snakemake's messages (default filter and formatter) and the progress view."""

    def __post_init__(self) -> None:
        self.stream = sys.stdout if self.common_settings.stdout else sys.stderr
        settings = self.settings or LogHandlerSettings()
        self.plain = bool(settings.plain) or not self.stream.isatty()
        self.interval = float(settings.interval or 5.0)
        self.state = None
        self.live = None
        self._stop = threading.Event()
        self._thread = None
        self._write_lock = threading.Lock()
        self._first_job_seen = False

    # Snakemake's interface -------------------------------------------------------
    @property
    def idle(self) -> bool:
        """
        True in a dry run: no view, nothing written (the workflow may then take
        Snakemake's queue to this plugin off its logger).
        """
        return bool(self.common_settings.dryrun)

    @property
    def writes_to_stream(self) -> bool:
        """
        True: the view is drawn on the terminal's stream (stderr); False in a dry run,
        which has no view, so that Snakemake adds its own stream handler.
        """
        return not self.common_settings.dryrun

    @property
    def writes_to_file(self) -> bool:
        """False: no log file of its own (Snakemake's log file is kept)."""
        return False

    @property
    def has_filter(self) -> bool:
        """False: Snakemake's default filter applies (quiet, verbose, dry run)."""
        return False

    @property
    def has_formatter(self) -> bool:
        """False: Snakemake's default formatter writes each record's text."""
        return False

    @property
    def needs_rulegraph(self) -> bool:
        """False: the view needs no rule graph."""
        return False

    def emit(self, record: logging.LogRecord) -> None:
        """
        Write a record's text above the view, and update the view when a job
        finishes; the rate counts from the first per-image job. Nothing in a dry run
        (Snakemake's own handler writes it: `writes_to_stream`).
        """
        if self.common_settings.dryrun:
            return
        try:
            message = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._start_view()
        if (
            self.state is not None
            and not self._first_job_seen
            and getattr(record, "event", None) == "job_info"
            and getattr(record, "rule_name", None) == ESTIMATE_RULE
        ):
            # the rate counts from the first per-image job, not from the assets' build
            self._first_job_seen = True
            self.state.restart_clock()
        if message and message != "None":
            self._write(message)
        if getattr(record, "event", None) in ("job_finished", "progress"):
            self._update()

    def close(self) -> None:
        """Stop redrawing and leave the last view on the terminal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval)
        if self.live is not None:
            self.live.stop()
            self.live = None
        super().close()

    # The view -----------------------------------------------------------------------
    def _start_view(self) -> None:
        """Start the view once the workflow has handed its plan over."""
        from multigeom_workflow.planning.live_view import PLAN, ProgressState

        if self.state is not None or not PLAN or self.common_settings.dryrun:
            return
        self.state = ProgressState(dict(PLAN))
        if not self.plain:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self.live = Live(self.state.table(), console=console, refresh_per_second=2)
            self.live.start()
        else:
            self._write(self.state.line())
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self._update()

    def _update(self) -> None:
        if self.state is None:
            return
        changed = self.state.refresh()
        if self.live is not None:
            self.live.update(self.state.table())
        elif changed:
            self._write(self.state.line())

    def _write(self, message: str) -> None:
        with self._write_lock:
            if self.live is not None:
                from rich.text import Text

                self.live.console.print(Text(message))
            else:
                self.stream.write(message + "\n")
                self.stream.flush()
