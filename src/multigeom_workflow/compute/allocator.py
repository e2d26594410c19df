"""
The memory allocator's settings that every job of a run inherits: glibc's malloc keeps
the memory torch frees for the next tensor instead of handing it back to the kernel.

With glibc's defaults, a block above the mmap threshold (128 KiB at first, raised by
glibc up to 32 MiB as blocks are freed) is mapped on allocation and unmapped on free,
and freed memory at the top of the heap above the trim threshold is returned at once.
PyTorch on the CPU allocates every intermediate tensor afresh (it has no caching
allocator there), so a training loop maps, touches and unmaps the same megabytes at
every step: each page costs a page fault and the kernel zeroes it again. That was the
demo's system time (measured 2026-12-03 on a 2-core machine, one thread per job, the
demo's settings: fitting the smallcnn encoder took 26 CPU s of user time and 24 s of
system time with 9.7 million minor page faults; with `ENVIRONMENT`, 0.8 s of system
time and 0.24 million faults, the same weights to the bit).

Memory is not lost: what a process frees is reused by its next allocation, and a
process never holds more than its own peak. Results do not change: torch's CPU
allocator aligns every tensor to 64 bytes either way, and where a tensor lies does not
enter any computation.

The settings are environment variables read by glibc when a process starts
(``mallopt(3)``: ``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``; ``MALLOC_MMAP_THRESHOLD_``
and ``MALLOC_TRIM_THRESHOLD_`` in the environment), so the workflow sets them once when
Snakemake parses it (`multigeom_workflow.on_snakemake.start`), for the processes it
starts: the rules' scripts, the per-image jobs and their warm workers. A value the user
set already is kept.
"""

from __future__ import annotations

import os

__all__ = ["ENVIRONMENT", "keep_freed_memory"]

#: Blocks up to 1 GiB come from the heap (above it, from their own mapping, as before);
#: up to 1 GiB freed at the heap's top stays there for the next allocation.
ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}


def keep_freed_memory(environ=None) -> dict[str, str]:
    """
    Set `ENVIRONMENT` in `environ` (by default ``os.environ``), for the processes
    started after it; a variable set already keeps its value.

    Parameters
    ----------
    environ : mapping, optional
        The environment to change (``os.environ`` when None).

    Returns
    -------
    dict of str to str
        The variables this call set (those that were not set before).

    Notes
    -----
    glibc reads these variables when a process starts: they change nothing in the
    calling process, only in its children.

    References
    ----------
    mallopt(3), Linux man-pages: M_MMAP_THRESHOLD, M_TRIM_THRESHOLD and the
    environment variables MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_.
    """
    environ = os.environ if environ is None else environ
    added = {k: v for k, v in ENVIRONMENT.items() if k not in environ}
    environ.update(added)
    return added
