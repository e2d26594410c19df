"""
The CPU time of a whole run, warm workers included: runs a command (by default the
README's demo command) as a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``),
so that every process it starts, detached workers too, is reaped here and its CPU time
counted; prints the wall-clock, the user + system CPU seconds of everything, and the
load average before and after (on a shared machine, the wall-clock depends on the
others' load, the CPU seconds much less).

With ``--against REV``, the demo of two commits side by side, one after the other in
this one process: each commit is cloned from this repository into a fresh folder and
its demo run there (the installed packages are shared; the clone's own ``src/`` comes
first on ``PYTHONPATH``, so its workflow code is the commit's), then its science is
printed (``benchmarks/demo_science.py``) and, at the end, the ratio of the two
wall-clocks and of the two CPU times. The speed goal of the demo is read from that
ratio, never from two runs made at different times (the machine is shared).

Usage:
    python benchmarks/demo_cpu.py [-- COMMAND ...]
        (default command: snakemake --profile profiles/local-cpu; in a fresh clone)
    python benchmarks/demo_cpu.py --against REV [--this REV] [--keep DIR]
        (REV first, then --this, by default HEAD: commits, so commit your work first)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
REPO = Path(__file__).resolve().parents[1]
DEMO = ["snakemake", "--profile", "profiles/local-cpu"]


def measure(command: list[str], cwd: str | None = None, env: dict | None = None):
    """
    Run `command` to its end with every process it starts reaped here.

    Returns
    -------
    dict
        ``rc`` (exit status), ``wall_s``, ``cpu_s``, ``user_s``, ``system_s`` (seconds
        of this call's descendants only), ``load_before`` and ``load_after`` (the 1, 5
        and 15 min load averages).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()
    start = time.time()
    rc = subprocess.call(command, cwd=cwd, env=env)
    wall = time.time() - start
    while True:  # orphaned descendants (detached workers) end with the run: reap them
        try:
            os.wait()
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return {
        "rc": rc,
        "wall_s": wall,
        "cpu_s": user + system,
        "user_s": user,
        "system_s": system,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def describe(m: dict) -> str:
    """One line for a `measure` result."""
    return (
        f"exit status {m['rc']}; wall-clock {m['wall_s']:.0f} s; "
        f"CPU {m['cpu_s']:.0f} s "
        f"(user {m['user_s']:.0f} s, system {m['system_s']:.0f} s), "
        f"{m['cpu_s'] / m['wall_s']:.2f} cores busy on average; load average (1, 5, "
        f"15 min) before {', '.join(f'{x:.2f}' for x in m['load_before'])}, after "
        f"{', '.join(f'{x:.2f}' for x in m['load_after'])}"
    )


def _revision(rev: str) -> str:
    return subprocess.check_output(
        ["git", "-C", str(REPO), "rev-parse", "--short", f"{rev}^{{commit}}"],
        text=True,
    ).strip()


def run_commit(rev: str, folder: Path) -> dict:
    """Clone `rev` into `folder`, run its demo there (`measure`), print its science."""
    sha = _revision(rev)
    subprocess.check_call(["git", "clone", "--quiet", str(REPO), str(folder)])
    subprocess.check_call(["git", "-C", str(folder), "checkout", "--quiet", sha])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(folder / "src"), env.get("PYTHONPATH")])
    )
    print(f"== {rev} ({sha}) in {folder}: {' '.join(DEMO)}", flush=True)
    result = measure(DEMO, cwd=str(folder), env=env) | {"rev": rev, "sha": sha}
    print(f"== {rev} ({sha}): {describe(result)}", flush=True)
    science = REPO / "benchmarks" / "demo_science.py"
    # with this checkout's code, so that both runs are scored the same way
    subprocess.call([sys.executable, str(science), str(folder)])
    return result


def compare(against: str, this: str, keep: str | None) -> int:
    """The demo of `against`, then of `this`, and the ratios of their times."""
    root = Path(keep or tempfile.mkdtemp(prefix="demo-side-by-side-"))
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    for label, rev in (("before", against), ("after", this)):
        folder = root / label
        if folder.exists():
            shutil.rmtree(folder)
        runs.append(run_commit(rev, folder))
    before, after = runs
    print(
        f"side by side: {after['rev']} ({after['sha']}) / {before['rev']} "
        f"({before['sha']}): wall-clock {after['wall_s']:.0f} / "
        f"{before['wall_s']:.0f} s = {after['wall_s'] / before['wall_s']:.2f}, CPU "
        f"{after['cpu_s']:.0f} / {before['cpu_s']:.0f} s = "
        f"{after['cpu_s'] / before['cpu_s']:.2f}"
    )
    print(json.dumps({"before": before, "after": after}))
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return before["rc"] or after["rc"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    else:
        command = []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--against", help="the commit to compare with (run first)")
    p.add_argument("--this", default="HEAD", help="the commit compared (run second)")
    p.add_argument("--keep", help="run in this folder and keep both runs")
    args = p.parse_args(argv)
    if args.against:
        return compare(args.against, args.this, args.keep)
    result = measure(command or DEMO)
    print(describe(result))
    return result["rc"]


if __name__ == "__main__":
    sys.exit(main())
