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


def test_a_dry_run_writes_nothing_and_hands_the_dates_on(tmp_path):
    """``snakemake -n``: no date set, no registry written; the dates a real run would
    set are handed to the planning (`ContentDates.dates`), and the line says
    "would"."""
    ckpt = make(tmp_path / "final_model.pt", os.urandom(2_000_000))
    registry = tmp_path / REGISTRY_NAME
    keep_dates_of_unchanged_content([ckpt], registry)
    recorded = registry.read_bytes()
    os.utime(ckpt)
    touched = ckpt.stat().st_mtime_ns
    new = make(tmp_path / "best_model.pt", b"new")  # new to the registry
    report = keep_dates_of_unchanged_content([ckpt, new], registry, dry=True)
    assert report.restored == [str(ckpt)] and report.dates == {str(ckpt): OLD}
    assert ckpt.stat().st_mtime_ns == touched
    assert registry.read_bytes() == recorded
    assert report.lines()[0].startswith("would keep the recorded date of 1 input")


def test_a_date_that_cannot_be_set_is_said_and_shown_to_the_planning(
    tmp_path, monkeypatch
):
    """A file of another user (utimensat(2): EPERM) or on a read-only mount (EROFS):
    one warning line, the recorded date handed to the planning, nothing raised; its
    registry entry stays as it was, so the next run tries again."""
    import errno

    ckpt = make(tmp_path / "final_model.pt", os.urandom(1000))
    registry = tmp_path / REGISTRY_NAME
    keep_dates_of_unchanged_content([ckpt], registry)
    entry = json.loads(registry.read_text())["files"][str(ckpt)]
    os.utime(ckpt)

    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "utime", refused)
    report = keep_dates_of_unchanged_content([ckpt], registry)
    assert report.dates == {str(ckpt): OLD}
    assert report.refused == [(str(ckpt), "PermissionError: Operation not permitted")]
    warning = [line for line in report.lines() if line.startswith("warning:")]
    assert len(warning) == 1 and str(ckpt) in warning[0]
    assert json.loads(registry.read_text())["files"][str(ckpt)] == entry


def test_a_registry_that_cannot_be_written_is_said(tmp_path, monkeypatch):
    """A read-only ``runs_dir``: the registry's write fails with one line, no
    error."""
    import errno

    f = make(tmp_path / "x.pt", b"1")
    registry = tmp_path / "ro" / REGISTRY_NAME

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(type(registry), "write_text", read_only)
    report = keep_dates_of_unchanged_content([f], registry)
    assert report.registry_problem.endswith("OSError: Read-only file system")
    assert report.lines()[-1].startswith("warning: could not write the content")


def test_a_new_link_to_the_same_bytes_gets_both_dates_back(tmp_path):
    """A checkpoint replaced by a new symbolic link to a copy of it: Snakemake reads the
    later of the link's own date and its target's, so both get the recorded date."""
    import shutil

    ckpt = make(tmp_path / "runs/final_model.pt", os.urandom(3000))
    registry = tmp_path / REGISTRY_NAME
    keep_dates_of_unchanged_content([ckpt], registry)
    shared = tmp_path / "shared.pt"
    shutil.copyfile(ckpt, shared)  # a new date
    ckpt.unlink()
    ckpt.symlink_to(shared)  # a new link: its own date is new too
    dry = keep_dates_of_unchanged_content([ckpt], registry, dry=True)
    assert dry.dates == {str(ckpt): OLD} and os.lstat(ckpt).st_mtime_ns > OLD
    report = keep_dates_of_unchanged_content([ckpt], registry)
    assert report.restored == [str(ckpt)]
    assert os.lstat(ckpt).st_mtime_ns == OLD == shared.stat().st_mtime_ns
    # only the link's own date moved (the target's recorded): given back too
    os.utime(ckpt, follow_symlinks=False)
    again = keep_dates_of_unchanged_content([ckpt], registry)
    assert again.restored == [str(ckpt)] and os.lstat(ckpt).st_mtime_ns == OLD


def test_kept_entries_stay_as_recorded_and_refused_dates_are_not_restored(
    tmp_path, monkeypatch
):
    """A date refused at parse time is not counted as restored, and the end of the run
    (`keep`) leaves its entry as recorded: the next run shows the recorded date."""
    import errno

    ckpt = make(tmp_path / "final_model.pt", os.urandom(1000))
    registry = tmp_path / REGISTRY_NAME
    keep_dates_of_unchanged_content([ckpt], registry)
    os.utime(ckpt)

    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    with monkeypatch.context() as m:
        m.setattr(os, "utime", refused)
        report = keep_dates_of_unchanged_content([ckpt], registry)
    assert report.restored == [] and [f for f, _ in report.refused] == [str(ckpt)]
    end = keep_dates_of_unchanged_content(
        [ckpt], registry, restore=False, keep=[str(ckpt)]
    )
    assert end.hashed == 0
    assert json.loads(registry.read_text())["files"][str(ckpt)][1] == OLD
    assert keep_dates_of_unchanged_content([ckpt], registry, dry=True).dates == {
        str(ckpt): OLD
    }
