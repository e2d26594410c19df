"""
Files appear complete or not at all, with the user's usual permissions; a full disk or
a read-only folder met while writing is one line naming the file and what to do.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG
from PIL import Image

from multigeom_workflow.atomic import atomic_path, write_error_line
from multigeom_workflow.scenario import validated_scenario


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


def test_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch):
    import multigeom.pipeline.per_image as per_image

    from multigeom_workflow.compute.estimate import Models, estimate_to_file

    s = validated_scenario(yaml.safe_load(TINY_CONFIG.read_text()), REPO)
    eig = SimpleNamespace(eigenvalues=torch.ones(5), eigenvectors=torch.eye(5, 4096))
    # Upstream's estimator is stood in for (its result does not matter here); its
    # torch.save writes to /dev/full, which answers every write with ENOSPC as a full
    # disk does: torch says "[enforce fail at inline_container.cc:664] . unexpected
    # pos ...".
    monkeypatch.setattr(per_image, "estimate_image", lambda *a, **k: (eig, eig))
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, "/dev/full"))
    models = Models(None, None, None, None, torch.device("cpu"))
    out = tmp_path / "per_image" / "img0000.pt"
    image = tmp_path / "x.png"
    Image.new("L", (64, 64), 100).save(image)
    with pytest.raises(OSError) as err:
        estimate_to_file(
            models, image, 0, out, s.estimator, encoder_name="onoff", area="complex"
        )
    message = str(err.value)
    # It names the file, its folder and the folder's free space, and what to do
    # (free space, or another disk for the config key runs_dir).
    assert "\n" not in message and message.startswith(f"{out}: ")
    assert str(out.parent) in message and "MB free" in message
    assert "free space" in message and "runs_dir" in message
    assert "unexpected pos" in str(err.value.__cause__)
    assert not out.exists() and not list(out.parent.iterdir())


def test_read_only_write_is_named(tmp_path):
    err = PermissionError(13, "Permission denied")
    line = write_error_line(err, tmp_path / "runs/per_image/a/b/img0000.pt")
    # The file, the nearest existing folder (read-only) and the system's reason.
    assert line.startswith(f"{tmp_path}/runs/per_image/a/b/img0000.pt: ")
    assert f"{tmp_path} is read-only" in line and "(Permission denied)" in line
    assert write_error_line(ValueError("other"), tmp_path / "x.pt") is None
