"""
The suite's own rules: every test is bounded (pytest-timeout; each process a test
starts, `PROCESS_TIMEOUT_S`) and marked by what it starts (tests/conftest.py:
`MARKERS`; the fast tier, ``-m "not slow"``, is exactly the tests that start
nothing).
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib

import pytest
from conftest import MARKERS, REPO, UnmarkedProcess, modal_tests


def test_a_process_started_without_its_marker_fails_the_test():
    # this test carries no marker: the guard refuses the process, naming both
    with pytest.raises(
        UnmarkedProcess,
        match=r"test_bounds\.py::test_a_process_started_without_its_marker_fails_the_"
        r"test starts a process \(\['true'\]\) but carries no marker",
    ):
        subprocess.run(["true"])


@pytest.mark.process
def test_a_marked_test_starts_its_process_and_is_in_the_slow_tier(request):
    assert subprocess.run(["true"]).returncode == 0
    assert request.node.get_closest_marker("slow") is not None


def test_the_markers_are_registered_as_the_conftest_names_them():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    registered = {m.split(":", 1)[0] for m in ini["ini_options"]["markers"]}
    assert registered == {"slow", *MARKERS}
    assert ini["ini_options"]["timeout"] == 600


@pytest.mark.process
def test_a_process_that_hangs_fails_the_test_naming_its_command(monkeypatch):
    helpers = modal_tests("helpers")
    monkeypatch.setattr(helpers, "PROCESS_TIMEOUT_S", 1)
    start = time.monotonic()
    with pytest.raises(helpers.ProcessHung, match=r"\['sleep', '30'\] did not end"):
        subprocess.run(["sleep", "30"], capture_output=True)
    assert time.monotonic() - start < 10
    # a caller's own timeout keeps subprocess's own error
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sleep", "30"], timeout=0.5)


@pytest.mark.process
def test_a_test_that_hangs_fails_with_its_name(tmp_path):
    """pytest-timeout, as pyproject.toml sets it (here 2 s instead of 600 s), fails
    a hanging test by name and says where it waited."""
    (tmp_path / "test_hang.py").write_text(
        "import time\n\ndef test_waits_for_ever():\n    time.sleep(60)\n"
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
        + ["-o", "timeout=2", "-o", "addopts=", str(tmp_path / "test_hang.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Timeout (>2.0s) from pytest-timeout" in done.stdout, done.stdout[-3000:]
    assert "FAILED test_hang.py::test_waits_for_ever" in done.stdout
    assert "time.sleep(60)" in done.stdout  # where it waited
    assert time.monotonic() - start < 60
