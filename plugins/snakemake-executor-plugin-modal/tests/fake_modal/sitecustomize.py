"""
Part of the fake ``modal`` (tests only): in a fake container's Python processes, drop
from ``sys.path`` the client's folders of the image's local sources
(``FAKE_MODAL_HIDDEN_PATHS``, set by ``Function.spawn``), as a Modal image holds them
only where Modal mounts them, under ``/root`` (``modal/mount.py``); and find the
packages named in ``FAKE_MODAL_HIDDEN_MODULES`` (local sources the client had
installed among its other packages) only under ``/root`` (``$HOME`` of the container).
"""

import json
import os
import sys

_hidden = set(json.loads(os.environ.get("FAKE_MODAL_HIDDEN_PATHS") or "[]"))
if _hidden:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in _hidden]

_modules = set(json.loads(os.environ.get("FAKE_MODAL_HIDDEN_MODULES") or "[]"))
if _modules:
    import importlib.machinery

    class _OnlyUnderRoot:
        """Top-level `_modules` from the container's /root only (Modal's mounts)."""

        def find_spec(self, fullname, path=None, target=None):
            if path is not None or fullname not in _modules:
                return None  # submodules: through their package's own __path__
            root = os.environ.get("HOME") or os.getcwd()
            spec = importlib.machinery.PathFinder.find_spec(fullname, [root])
            if spec is None:
                msg = f"No module named {fullname!r}"
                raise ModuleNotFoundError(msg, name=fullname)
            return spec

    sys.meta_path.insert(0, _OnlyUnderRoot())
