"""Helpers of the plugin's tests: the fake Modal backend's location, a Snakemake run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The fake ``modal`` package (see fake_modal/modal/__init__.py for its conventions).
FAKE = Path(__file__).resolve().parent / "fake_modal"


def run_snakemake(
    workdir: Path,
    snakefile: str,
    *args: str,
    env=None,
    popen: dict | None = None,
    timeout: float | None = None,
):
    """
    Run ``snakemake --executor modal`` on `snakefile` (its text) in `workdir`, in a
    subprocess that imports the fake ``modal`` (use with the ``fake_modal`` fixture).
    Returns the CompletedProcess (text), or a Popen started with the ``popen`` options;
    ``timeout`` (seconds) stops a run that would not end (raising
    ``subprocess.TimeoutExpired``).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(snakefile)
    cmd = [sys.executable, "-m", "snakemake", "--executor", "modal", "--jobs", "2"]
    cmd += ["--modal-volume", "tests", "--modal-gpu", "T4", "--latency-wait", "1"]
    # Snakemake asks for the jobs' states every 10 s by default: every 2 s here
    cmd += ["--seconds-between-status-checks", "2"]
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(FAKE), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        **(env or {}),
    }
    if popen is not None:
        return subprocess.Popen([*cmd, *args], cwd=workdir, env=full_env, **popen)
    return subprocess.run(
        [*cmd, *args],
        cwd=workdir,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
