"""Fake ``modal.config``: only ``config.get(key)`` for the token.

Like real Modal, ``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` are read from the
environment; without them the fake has a token (as if ``modal token new`` had been
run), unless ``FAKE_MODAL_NO_TOKEN=1`` says there is none.
"""

from __future__ import annotations

import os
from typing import Any


class Config:
    """The client's configuration (tokens only)."""

    def get(self, key: str, *, profile: str | None = None, use_env: bool = True) -> Any:
        env = {"token_id": "MODAL_TOKEN_ID", "token_secret": "MODAL_TOKEN_SECRET"}
        if key not in env:
            return None
        if use_env and os.environ.get(env[key]):
            return os.environ[env[key]]
        if os.environ.get("FAKE_MODAL_NO_TOKEN") == "1":
            return None
        return f"fake-{key}"


config = Config()
