"""
Reruns follow content, not dates: `keep_dates_of_unchanged_content` gives a file whose
bytes are the recorded ones its recorded date back, and leaves a changed file's date.
"""

from __future__ import annotations

import hashlib
import json
import os

from multigeom_workflow.planning.content_dates import (
    REGISTRY_NAME,
    keep_dates_of_unchanged_content,
    sha256_of,
)

OLD = 1_600_000_000_000_000_000  # ns: September 2020


def make(path, data: bytes, mtime_ns: int = OLD):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_sha256_is_hashlibs(tmp_path):
    f = make(tmp_path / "a.pt", b"x" * 3_000_000)
    assert sha256_of(f) == hashlib.sha256(b"x" * 3_000_000).hexdigest()


def test_a_touched_file_gets_its_recorded_date_back(tmp_path):
    ckpt = make(tmp_path / "final_model.pt", os.urandom(2_000_000))
    registry = tmp_path / REGISTRY_NAME
    first = keep_dates_of_unchanged_content([ckpt], registry)
    assert (first.hashed, first.restored, first.changed) == (1, [], [])
    entry = json.loads(registry.read_text())["files"][str(ckpt)]
    assert entry[:2] == [2_000_000, OLD] and entry[3] == sha256_of(ckpt)

    os.utime(ckpt)  # touch: a new date, the same bytes
    assert ckpt.stat().st_mtime_ns > OLD
    report = keep_dates_of_unchanged_content([ckpt], registry)
    assert report.restored == [str(ckpt)] and report.changed == []
    assert ckpt.stat().st_mtime_ns == OLD
    assert "same content" in report.lines()[0] and str(ckpt) in report.lines()[0]
    # nothing changed since: nothing hashed, nothing said
    again = keep_dates_of_unchanged_content([ckpt], registry)
    assert (again.hashed, again.lines()) == (0, [])


def test_a_copy_with_new_dates_gets_the_recorded_dates(tmp_path):
    """`cp -r` of a run (registry included): new dates, same bytes."""
    import shutil

    src = tmp_path / "src"
    files = [make(src / f"runs/encoders/e/a{i}.pt", os.urandom(1000)) for i in range(3)]
    keep_dates_of_unchanged_content(files, src / REGISTRY_NAME)
    dst = tmp_path / "dst"
    shutil.copytree(src, dst)  # copies dates too: make them new, as `cp -r` does
    copied = sorted((dst / "runs/encoders/e").iterdir())
    for f in copied:
        os.utime(f)
    os.chdir(dst)  # the registry's paths are relative to the working directory
    try:
        rel = [os.path.relpath(f, dst) for f in copied]
        registry = dst / REGISTRY_NAME
        data = json.loads(registry.read_text())
        data["files"] = {os.path.relpath(k, src): v for k, v in data["files"].items()}
        registry.write_text(json.dumps(data))
        report = keep_dates_of_unchanged_content(rel, registry)
    finally:
        os.chdir(tmp_path)
    assert sorted(report.restored) == rel
    assert all(f.stat().st_mtime_ns == OLD for f in copied)


def test_new_content_keeps_its_new_date(tmp_path):
    ckpt = make(tmp_path / "best_model.pt", b"a" * 100)
    registry = tmp_path / REGISTRY_NAME
    keep_dates_of_unchanged_content([ckpt], registry)
    # same size, other bytes, the old date kept (a restore with `cp -p`, say)
    make(ckpt, b"b" * 100, OLD)
    report = keep_dates_of_unchanged_content([ckpt], registry)
    assert report.changed == [str(ckpt)] and report.restored == []
    assert "new content" in report.lines()[0]
    assert json.loads(registry.read_text())["files"][str(ckpt)][3] == sha256_of(ckpt)


def test_missing_files_are_skipped_and_a_damaged_registry_is_started_afresh(
    tmp_path,
):
    registry = tmp_path / REGISTRY_NAME
    registry.write_text("{not json")
    f = make(tmp_path / "x.pt", b"1")
    report = keep_dates_of_unchanged_content([tmp_path / "missing.pt", f], registry)
    assert report.hashed == 1
    assert list(json.loads(registry.read_text())["files"]) == [str(f)]


def test_recording_only_keeps_the_new_date(tmp_path):
    """At the end of a run: a file a job rewrote with the same bytes keeps its date."""
    f = make(tmp_path / "train_crops.pt", b"same")
    registry = tmp_path / REGISTRY_NAME
    keep_dates_of_unchanged_content([f], registry)
    os.utime(f)  # the job's new file, same bytes
    new = f.stat().st_mtime_ns
    report = keep_dates_of_unchanged_content([f], registry, restore=False)
    assert report.restored == [] and f.stat().st_mtime_ns == new
    assert json.loads(registry.read_text())["files"][str(f)][1] == new
