"""
Shared fixtures: the reduced demo, run once per test session by the real workflow; a
local Modal server (the Modal plugin's tests' own, `local_modal`); and the test tiers
(`pytest_collection_modifyitems`: ``-m "not slow"``, the fast one).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock

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
    timeout: float | None = None,
):
    """
    Run the workflow's Snakefile in `workdir` (``--directory``) with the reduced demo's
    configuration (and `env` added to the environment); returns the CompletedProcess
    (stdout and stderr as text). It is killed after `timeout` seconds (default: the
    bound on every process of the tests, 540 s), failing the test with the command.
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
        timeout=timeout,
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


def python_path(*folders: Path) -> str:
    """
    PYTHONPATH with `folders` first, then this process's PYTHONPATH: a Snakemake
    installed there (``.ci/snakemake-releases`` tries each release that way) stays
    the one every process of the test runs.
    """
    kept = os.environ.get("PYTHONPATH")
    return os.pathsep.join(p for p in (*map(str, folders), kept) if p)


#: The environment of a run in a Python without the Modal executor plugin and the
#: Modal client (a local or SLURM-only install): tests/data/without_modal.
WITHOUT_MODAL = {"PYTHONPATH": python_path(REPO / "tests" / "data" / "without_modal")}


#: The Modal executor plugin's folder: its ``tests`` package holds the local Modal
#: server (``tests/modal_server``, its README.md) and ``tests/helpers.py``.
MODAL_PLUGIN = REPO / "plugins" / "snakemake-executor-plugin-modal"


def modal_tests(name: str):
    """
    A module of the Modal plugin's ``tests`` package (``"modal_server"``,
    ``"helpers"``), imported as pytest imports the plugin's tests: its folder first
    on ``sys.path``, the package named ``tests`` (this folder has no
    ``__init__.py``: it is no package of that name).

    Parameters
    ----------
    name : str
        The module's name in the package.

    Returns
    -------
    module
        ``tests.<name>``.
    """
    if str(MODAL_PLUGIN) not in sys.path:
        sys.path.insert(0, str(MODAL_PLUGIN))
    return importlib.import_module(f"tests.{name}")


# The SLURM executor plugin runs `which sacct` when first imported
# (snakemake_executor_plugin_slurm/__init__.py, `_get_status_command_default`): imported
# here, so that no test starts that process by being the first to import it, and a
# test's tier does not depend on the order the tests run in.
importlib.import_module("snakemake_executor_plugin_slurm")

# Every process a test starts ends within a bound where the test gives none
# (PROCESS_TIMEOUT_S, 540 s: the Modal plugin's tests/helpers.py, one mechanism for
# both suites); past it the test fails naming the command.
modal_tests("helpers").bound_subprocess_run()


@contextmanager
def local_modal(root: Path, **kwargs) -> Iterator:
    """
    A local Modal server (the plugin's tests' ``modal_server.serve``) running in this
    process, and this process's environment pointed at it for the block's duration,
    so that every process a test starts (Snakemake, the CLI, the ``modal`` CLI, and
    the server's containers, which inherit this process's environment) runs the
    installed ``modal`` client against it: ``client_env`` (its ``MODAL_SERVER_URL``
    and credentials, no other ``MODAL_*`` setting, heartbeats every second), the
    plugin's volume mount path below `root` (``SNAKEMAKE_MODAL_TEST_MOUNT``, read by
    the plugin at import: the server mounts volumes below its own or the temporary
    folder only), and this Python first on ``PATH`` (a container's jobs start
    ``python``, as an image has its own). The same settings as the plugin's
    ``modal_server`` fixture, for a module's fixture too.

    Parameters
    ----------
    root : Path
        A folder for the server (``modal-server/``: volumes, containers) and the
        mount path (``mnt/``).
    **kwargs
        For ``serve``: ``token_secret``, ``gpu_queue_delay_s``...

    Yields
    ------
    LocalModal
        The running server: ``state`` (apps, volumes, function calls, containers,
        every RPC received), ``env`` (dict, the environment set here) and ``mount``
        (Path).
    """
    serve = modal_tests("modal_server").serve
    mount = root / "mnt" / "snakemake-volume"
    with (
        serve(root / "modal-server", container_heartbeat_s=1.0, **kwargs) as server,
        pytest.MonkeyPatch.context() as patch,
    ):
        env = server.client_env(heartbeat_interval_s=1.0)
        env["SNAKEMAKE_MODAL_TEST_MOUNT"] = str(mount)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
        for k in set(os.environ) - set(env):
            patch.delenv(k)
        for k, v in env.items():
            patch.setenv(k, v)
        server.env, server.mount = env, mount
        yield server


def modal_cli(*args: str) -> str:
    """
    Run Modal's own command line (``python -m modal``, the installed client's) in
    this process's environment, as a user would (e.g. ``modal_cli("volume",
    "create", "vol")``); returns its standard output.

    Raises
    ------
    AssertionError
        If it exits with a non-zero status (its output in the message).
    """
    done = subprocess.run(
        [sys.executable, "-m", "modal", *args], capture_output=True, text=True
    )
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.fixture
def modal_server(tmp_path):
    """
    A local Modal server for the test, this process's environment pointed at it
    (`local_modal`).
    """
    with local_modal(tmp_path) as server:
        yield server


def tiny_lock_dir(workdir: Path) -> Path:
    """
    The slot-lock folder of the reduced demo run in `workdir` (`tiny_run`): its own
    (``MULTIGEOM_GPU_LOCK_DIR``), so that a test finds its workers among those of
    the tests that run beside it (pytest-xdist).
    """
    return workdir.with_name(f"{workdir.name}-locks")


def _run_tiny_demo(workdir: Path) -> None:
    env = {**WITHOUT_MODAL, "MULTIGEOM_GPU_LOCK_DIR": str(tiny_lock_dir(workdir))}
    # 600 s: its build took 338 s with three test processes and other work beside
    # it on 2 cores (2026-12-05), the longest single run of the suite
    result = run_snakemake(workdir, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """
    A working directory in which the reduced demo ran to the end (read-only use),
    in a Python without the Modal plugin (`WITHOUT_MODAL`): a local install runs the
    demo without it. Its slot locks and workers are in `tiny_lock_dir`.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: its own
        workdir = tmp_path_factory.mktemp("tiny-demo")
        _run_tiny_demo(workdir)
        return workdir
    # Under pytest-xdist, the workers' base folders share a parent: the first worker
    # to need the demo builds it there, under a lock, and the others read it (the
    # recipe of pytest-xdist's docs, "Making session-scoped fixtures execute once").
    shared = tmp_path_factory.getbasetemp().parent
    workdir, done = shared / "tiny-demo", shared / "tiny-demo.done"
    with FileLock(shared / "tiny-demo.lock"):
        if not done.exists():
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir()
            _run_tiny_demo(workdir)
            done.touch()
    return workdir


@pytest.fixture(scope="session")
def finished_dry_run(tiny_run):
    """
    ``snakemake -n`` in the finished reduced demo (`tiny_run`), run once per test
    process and read by every test that checks what a finished run plans (a dry run
    changes nothing: tests/test_plan_count.py checks it byte for byte); the
    CompletedProcess (text).
    """
    result = run_snakemake(tiny_run, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture
def tiny_copy(tiny_run, tmp_path) -> Path:
    """A private copy of the reduced demo's working directory (times preserved)."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy, symlinks=True)
    return copy


#: What a test may start, each a marker (pyproject.toml lists them): `MARKERS`'s
#: names. ``slow`` is added to a test that carries any (the fast tier, ``-m "not
#: slow"``, is exactly the tests that start no process: `guard_processes` fails a
#: test that starts one without its marker).
MARKERS = {
    "workflow": "runs the workflow: Snakemake, the workflow's CLI or a worker",
    "slurm": "uses the local SLURM cluster (.ci/slurm-cluster.sh)",
    "modal_server": "starts the local Modal server (its containers are processes)",
    "process": "starts another program (ruff, git, a child Python)",
}
#: The fixtures that start each: a test using one carries its marker.
FIXTURE_MARKERS = {
    "tiny_run": "workflow",
    "tiny_copy": "workflow",
    "finished_dry_run": "workflow",
    "slurm_cluster": "slurm",
    "slurm_run": "slurm",
    "modal_run": "modal_server",
    "modal_server": "modal_server",
    "local_modal": "modal_server",  # the Modal plugin's test_modal_server.py
}


class UnmarkedProcess(AssertionError):
    """A test without a marker of `MARKERS` started a process."""


@pytest.fixture(autouse=True)
def guard_processes(request, monkeypatch):
    """
    Fail a test that starts a process (``subprocess.Popen``, through which
    ``subprocess.run`` and every helper here go) without one of `MARKERS`: its
    tier would be wrong. The message names the test and the command.
    """
    if any(request.node.get_closest_marker(m) for m in MARKERS):
        yield
        return

    def refuse(self, args, *more, **kwargs):
        raise UnmarkedProcess(
            f"{request.node.nodeid} starts a process ({args!r}) but carries no "
            f"marker of what it starts: mark it with one of {sorted(MARKERS)} "
            "(tests/conftest.py, MARKERS)"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield


def pytest_configure(config):
    """
    Under pytest-xdist, each worker's torch gets its share of the cores (cores /
    workers): torch's default, a thread per core in every worker, oversubscribes
    the machine and its OpenMP threads spin while they wait (the fast tier took
    twice as long on 2 cores, and three times the CPU). The processes a test starts
    keep their own defaults.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def process_group(nodeid: str) -> str:
    """
    The pytest-xdist work unit of the test `nodeid`: its file, so that a file's
    module fixtures are made once; every file of the SLURM cluster
    (``test_slurm*.py``) in one unit, as they share the one cluster (its
    allocations, and a test that stops its accounting).
    """
    file = nodeid.split("::", 1)[0]
    return "slurm" if Path(file).name.startswith("test_slurm") else file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """
    ``-n auto``: a process per core, and two more: the SLURM unit
    (`process_group`) mostly waits for the cluster's jobs, and the Modal tests for
    their containers' timeouts and retries (the suite on 2 cores used 1.2 of them
    with 2 processes, 2026-12-03; 1.3 with 3, 2026-12-06: 16 min 41 s alone; with 4,
    each process busy 907-923 s, 15 min 43 s beside two other developers' tests,
    and 14 min 18 s alone in CI's run, 2026-12-06: docs/measurements.md).
    """
    return (os.cpu_count() or 1) + 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """
    pytest-xdist's scheduler by scope (``loadscope``, larger units first) with
    `process_group` as the scope. xdist's own groups (``--dist loadgroup`` and the
    ``xdist_group`` mark) do nothing on pytest 9.2: xdist 3.8 renames a test by
    setting ``item._nodeid``, which pytest 9.2 no longer reads (``Node.nodeid``
    is ``str(self._id)``, _pytest/nodes.py).

    Raises
    ------
    pytest.UsageError
        pytest-xdist's ``LoadScopeScheduling`` no longer has ``_split_scope`` (the
        method xdist's own ``LoadFileScheduling`` overrides): one line naming it.
    """
    from xdist.scheduler import LoadScopeScheduling

    if not callable(getattr(LoadScopeScheduling, "_split_scope", None)):
        raise pytest.UsageError(
            "pytest-xdist's LoadScopeScheduling has no _split_scope: the SLURM tests "
            "cannot be kept in one process (tests/conftest.py); run with -n 0"
        )

    class ByProcessGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return process_group(nodeid)

    return ByProcessGroup(config, log)


def pytest_collection_modifyitems(config, items):
    """
    Mark each collected test by what it starts: the marker of each fixture of
    `FIXTURE_MARKERS` it uses, beside those written on it; then ``slow`` on every
    test that carries one of `MARKERS`. Pytest hands this hook every test of the
    session, the Modal plugin's included, so that ``python -m pytest -m "not
    slow"`` is the fast tier (README.md).
    """
    for item in items:
        for fixture in set(getattr(item, "fixturenames", ())) & set(FIXTURE_MARKERS):
            item.add_marker(FIXTURE_MARKERS[fixture])
        if any(item.get_closest_marker(m) for m in MARKERS):
            item.add_marker(pytest.mark.slow)
