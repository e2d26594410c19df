"""
The CPU time of a whole run, warm workers included: runs a command (by default the
README's demo command) as a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``),
so that every process it starts, detached workers too, is reaped here and its CPU time
counted; prints the wall-clock, the user + system CPU seconds of everything, and the
load average before and after (on a shared machine, the wall-clock depends on the
others' load, the CPU seconds much less).

Usage: python benchmarks/demo_cpu.py [-- COMMAND ...]
(default command: snakemake --profile profiles/local-cpu; run it in a fresh clone)
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--":
        argv = argv[1:]
    command = argv or ["snakemake", "--profile", "profiles/local-cpu"]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    load_before = os.getloadavg()
    start = time.time()
    rc = subprocess.call(command)
    wall = time.time() - start
    while True:  # orphaned descendants (detached workers) end with the run: reap them
        try:
            os.wait()
        except ChildProcessError:
            break
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print(
        f"exit status {rc}; wall-clock {wall:.0f} s; CPU {cpu:.0f} s (user "
        f"{usage.ru_utime:.0f} s, system {usage.ru_stime:.0f} s), {cpu / wall:.2f} "
        f"cores busy on average; load average (1, 5, 15 min) before "
        f"{', '.join(f'{x:.2f}' for x in load_before)}, after "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
