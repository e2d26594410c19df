"""What every script of the workflow's rules does first: send its output to the log."""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["job_log"]


@contextlib.contextmanager
def job_log(path: str | Path):
    """
    Send standard output and standard error (progress bars, upstream's messages,
    tracebacks) to the rule's log file for the duration of the block; an exception is
    written there, then raised again so that the job fails.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", buffering=1) as log:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            try:
                yield log
            except BaseException:
                import traceback

                traceback.print_exc(file=log)
                raise
