"""
The house style, checked where CI runs the tests: ruff's linter (numpydoc docstrings on
the packages' public names included, `pyproject.toml`) and its formatter. The workflow's
own lint, `snakemake --lint`, is `tests/test_workflow.py::test_lint_is_clean`;
snakefmt's check of the rule files is in `tests/test_conventions.py`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.process
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


@pytest.mark.process
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


def test_the_suites_processes_keep_the_slurm_files_together_and_files_whole():
    """
    pytest-xdist's work units (tests/conftest.py): every SLURM file in one (the one
    cluster, whose accounting one test stops), every other file whole in its own
    (module fixtures made once), on the scheduler method xdist still has.
    """
    from conftest import process_group
    from xdist.scheduler import LoadScopeScheduling

    slurm = sorted(p.name for p in (REPO / "tests").glob("test_slurm*.py"))
    assert slurm == [
        "test_slurm.py",
        "test_slurm_endings.py",
        "test_slurm_site.py",
        "test_slurm_status.py",
    ]
    assert {process_group(f"tests/{name}::test_x") for name in slurm} == {"slurm"}
    assert process_group("tests/test_modal.py::test_x[a::b]") == "tests/test_modal.py"
    plugin = "plugins/snakemake-executor-plugin-modal/tests/test_units.py"
    assert process_group(f"{plugin}::test_y") == plugin
    assert callable(LoadScopeScheduling._split_scope)
