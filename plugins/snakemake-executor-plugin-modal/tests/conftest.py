"""
The plugin's tests run its real code against the fake Modal backend in ``fake_modal/``
(containers are local subprocesses, a Volume is a folder that shows only committed
files): ``import modal`` gives the fake while a test uses the ``fake_modal`` fixture.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from .helpers import FAKE


def _import_fake():
    saved = {
        k: v for k, v in sys.modules.items() if k == "modal" or k.startswith("modal.")
    }
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(FAKE))
    try:
        fake = importlib.import_module("modal")
        importlib.import_module("modal.exception")
        importlib.import_module("modal.volume")
        importlib.import_module("modal.config")
    finally:
        sys.path.remove(str(FAKE))
    fakes = {
        k: v for k, v in sys.modules.items() if k == "modal" or k.startswith("modal.")
    }
    return fake, saved, fakes


@pytest.fixture
def fake_modal(tmp_path, monkeypatch):
    """
    The fake ``modal`` package, rooted at a fresh ``FAKE_MODAL_DIR``; containers find
    this interpreter's ``python`` first on PATH (as an image would have its own).
    """
    root = tmp_path / "fake-modal"
    root.mkdir()
    monkeypatch.setenv("FAKE_MODAL_DIR", str(root))
    monkeypatch.setenv(
        "PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    fake, saved, fakes = _import_fake()
    try:
        yield fake
    finally:
        # containers outlive the client that spawned them (as on Modal, until
        # cancelled or their app stops): the test's are stopped here
        fake.fake_kill_all()
        for k in fakes:
            sys.modules.pop(k, None)
        sys.modules.update(saved)
