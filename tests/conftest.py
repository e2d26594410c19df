"""Shared fixtures: the reduced demo, run once per test session by the real workflow."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO / "tests" / "data" / "tiny.yaml"
CONFIGURATIONS = [
    ("onoff", "complex"),
    ("smallcnn", "complex"),
    ("onoff", "simple"),
    ("smallcnn", "simple"),
]


def run_snakemake(
    workdir: Path,
    *args: str,
    configfile: Path | None = TINY_CONFIG,
    env: dict | None = None,
):
    """
    Run the workflow's Snakefile in `workdir` (``--directory``) with the reduced demo's
    configuration (and `env` added to the environment); returns the CompletedProcess
    (stdout and stderr as text).
    """
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(workdir), "--cores", "2"]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    return subprocess.run(
        [*cmd, *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


#: The line Snakemake writes first when it reads profiles, the workflow's own
#: (profiles/default) at every run: "Using [profile X and ]workflow specific profile
#: P for setting default command line arguments." (snakemake/cli.py, parse_args).
PROFILES_LINE = re.compile(
    r"^Using (profiles? .+ and )?workflow specific profile .+ for setting default "
    r"command line arguments\.$"
)


def said_lines(stderr: str) -> list[str]:
    """The non-empty lines of a Snakemake run's stderr, less its line naming the
    profiles it reads (`PROFILES_LINE`)."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not PROFILES_LINE.match(line)
    ]


def planned_jobs(result) -> dict[str, int]:
    """Job counts per rule from the "Job stats" table of a (dry) run's output."""
    text = result.stdout + result.stderr
    if "Job stats:" not in text:
        return {}
    table = text.split("Job stats:", 1)[1].splitlines()[3:]
    counts = {}
    for line in table:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A working directory in which the reduced demo ran to the end (read-only use)."""
    workdir = tmp_path_factory.mktemp("tiny-demo")
    result = run_snakemake(workdir)
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir


@pytest.fixture
def tiny_copy(tiny_run, tmp_path) -> Path:
    """A private copy of the reduced demo's working directory (times preserved)."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy, symlinks=True)
    return copy
