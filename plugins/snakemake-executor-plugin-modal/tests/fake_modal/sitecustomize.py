"""
Part of the fake ``modal`` (tests only): in a fake container's Python processes, drop
from ``sys.path`` the client's folders of the image's local sources
(``FAKE_MODAL_HIDDEN_PATHS``, set by ``Function.spawn``), as a Modal image holds them
only where Modal mounts them, under ``/root`` (``modal/mount.py``).
"""

import json
import os
import sys

_hidden = set(json.loads(os.environ.get("FAKE_MODAL_HIDDEN_PATHS") or "[]"))
if _hidden:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in _hidden]
