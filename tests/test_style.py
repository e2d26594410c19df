"""
The house style, checked where CI runs the tests: ruff's linter (numpydoc docstrings on
the packages' public names included, `pyproject.toml`) and its formatter. The workflow's
own lint, `snakemake --lint`, is `tests/test_workflow.py::test_lint_has_only_the_one_
environment_remark`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize(
    "command",
    [["check", "."], ["format", "--check", "."]],
    ids=["ruff check", "ruff format --check"],
)
def test_ruff_is_clean(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_flags_a_public_function_without_docstring(tmp_path):
    """The docstring rules are on under src/ and off elsewhere (the config's own)."""
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    for folder in ("src/pkg", "scripts"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "probe.py").write_text("def probe():\n    return 1\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            ".",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    flagged = {
        line.split(":")[0] for line in result.stdout.splitlines() if " D" in line
    }
    assert flagged == {"src/pkg/probe.py"}, result.stdout
    assert "D103" in result.stdout
