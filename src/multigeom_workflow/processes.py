"""Processes of this machine: whether one is alive (the GPU slots' and warm workers'
owners in `compute`, a Hub download's lock holder in `inputs.hub`).
"""

from __future__ import annotations

import os

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """
    Whether process `pid` of this machine is alive (signal 0, which checks and sends
    nothing).

    Parameters
    ----------
    pid : int
        A process id.

    Returns
    -------
    bool
        False only when no such process exists; another user's process, which this
        one may not signal, is alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
