"""
The fixed facts of a run, defined once and imported everywhere: Modal's limits, the
plugin's own bounds, and where containers mount the volume.
"""

from __future__ import annotations

import os

__all__ = [
    "DEADLINE_MARGIN_S",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "MOUNT",
    "STARTUP_S",
]

#: Where containers mount the volume. ``SNAKEMAKE_MODAL_TEST_MOUNT`` moves it, read
#: when this module is imported: the plugin's tests put it below a temporary folder,
#: the only place where their local Modal server mounts volumes
#: (tests/modal_server/README.md). Not a setting: on Modal the path never matters.
#: Read as ``limits.MOUNT`` where it is used (`app.RunApp`, `jobspec.JobSpecs`), so
#: that a test moves it for this process in one place.
MOUNT = os.environ.get("SNAKEMAKE_MODAL_TEST_MOUNT") or "/snakemake-volume"
#: The most seconds a container may take to start, by default (``--modal-startup-
#: seconds``): declared with every function as Modal's ``startup_timeout`` (a
#: container that takes longer fails) and held by the budget beyond each call's
#: timeout (`Ledger.startup_s`), so that what Modal may bill before a call's timeout
#: starts is what the ledger counts. Modal 1.6.4 otherwise sets ``startup_timeout =
#: timeout`` (``App.function``, ``modal/app.py``; "startup_timeout: Maximum startup
#: time in seconds with higher precedence than timeout", its docstring).
STARTUP_S = 120
#: The shortest timeout a job without a ``runtime`` is started with when its default
#: timeout is cut to what is left of the budget, seconds.
MIN_TIMEOUT_S = 60
#: Modal's longest function timeout, seconds (24 h).
MAX_TIMEOUT_S = 86400
#: Seconds a call may go without an output beyond its timeout and start-up bound,
#: by default (``--modal-deadline-margin-seconds``), before it is cancelled and its
#: job failed (`calls.ContainerCall.deadline_s`). Why a margin at all: neither bound
#: counts the time before the container starts, which the call's clock here does
#: (from its spawn): "The timeout duration ... does not include scheduling time"
#: (Modal's docs, guide "Timeouts"), a GPU input may queue for its GPU (guide "GPU
#: acceleration"), and the output of a container Modal stopped at its timeout comes
#: some seconds after the stop. Why 15 minutes: a queue for a scarce GPU of that
#: long is not unusual, and a retry would queue again; a call past it is taken as
#: one whose status will never come (issue 47: "a call that never answers runs
#: forever").
DEADLINE_MARGIN_S = 900
