"""A function for the fake's own tests, importable in a fake container."""

from __future__ import annotations

import os


def sees(path: str, reload: bool) -> bool:
    """Whether a file of the mounted volume ``probe`` is there, after
    ``Volume.reload()`` if `reload`."""
    import modal

    if reload:
        modal.Volume.from_name("probe").reload()
    return os.path.exists(path)
