"""Files appear complete or not at all, with the user's usual permissions."""

from __future__ import annotations

import os

import pytest

from multigeom_workflow.atomic import atomic_path


def test_written_file_appears_whole_with_usual_permissions(tmp_path):
    out = tmp_path / "sub" / "result.json"
    with atomic_path(out) as tmp:
        assert tmp.parent == out.parent and not tmp.exists()
        tmp.write_text("{}")
        assert not out.exists()
    assert out.read_text() == "{}"
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask
    assert os.listdir(out.parent) == ["result.json"]


def test_failed_write_leaves_nothing(tmp_path):
    out = tmp_path / "result.json"
    out.write_text("old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert out.read_text() == "old"
    assert os.listdir(tmp_path) == ["result.json"]
