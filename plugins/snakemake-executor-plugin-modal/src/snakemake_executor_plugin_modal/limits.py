"""
The fixed facts of a run, defined once and imported everywhere: Modal's limits, the
plugin's own bounds, and where containers mount the volume.
"""

from __future__ import annotations

import os

__all__ = ["MAX_TIMEOUT_S", "MIN_TIMEOUT_S", "MOUNT", "STARTUP_S"]

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
