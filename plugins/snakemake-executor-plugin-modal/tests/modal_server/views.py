"""
A container's view of a volume on the local Modal server: Modal's semantics of a
mounted volume, read from the client (modal 1.6.4) and Modal's documentation.

- A container sees the volume as committed when it started, until it reloads: "you
  need to explicitly reload the volume to see changes made since it was mounted"
  (``_Volume``'s docstring, modal/volume.py). Here each container gets its own copy
  of the volume's folder (:func:`make_view`), mounted at the function's mount path in
  the container's own mount namespace (:mod:`.containers`).
- Its changes reach the volume, and other containers' next reloads, only when
  committed: "you need to explicitly commit any changes you make to the volume for
  the changes to become visible outside the current container" (same docstring;
  ``_Volume.commit``: "If successful, the changes made are now persisted in durable
  storage and available to other containers"). :func:`publish` puts the files the
  container changed, added or removed since its view was last made or published;
  the rest of the volume is left as it is, so "last write wins in case of concurrent
  modification of the same file" (``_Volume``'s docstring).
- A commit answers ``skip_reload=False``, so the client reloads right after it
  (``_Volume.commit``); a reload makes "latest committed state of volume available in
  the running container", and "any uncommitted changes to the volume, such as new or
  modified files, may implicitly be committed when reloading" (``_Volume.reload``):
  :func:`refresh` publishes first, then makes the view the volume's current files.
- The container commits its volumes when its function ends, returns or raises
  (``volume_commit`` in modal/_runtime/user_code_imports.py, step 8, for mounts with
  ``allow_background_commits``, which ``_volume_to_mount_proto`` always sets), and
  Modal commits in the background "every few seconds while your Function executes"
  (Modal's docs, guide "Volumes", "Background commits"): the worker does that, not the
  client, so the server does it (``LocalModal(background_commit_s=...)``). A container
  killed (timeout, cancel, preemption) has no exit commit.

A path is compared by its modification time (nanoseconds) and size; a part file of an
upload (``.upload-tmp``) is never published.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["VolumeView", "make_view", "manifest", "publish", "refresh"]

#: A folder's entry in a manifest.
DIR = "dir"


def manifest(folder: Path) -> dict[str, object]:
    """
    What a folder holds: relative POSIX path -> ``(mtime_ns, size)`` for a file or a
    link, :data:`DIR` for a folder.

    Parameters
    ----------
    folder : pathlib.Path

    Returns
    -------
    dict
    """
    found: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for name in dirnames:
            p = base / name
            rel = p.relative_to(folder).as_posix()
            if p.is_symlink():
                st = p.lstat()
                found[rel] = (st.st_mtime_ns, st.st_size)
            else:
                found[rel] = DIR
        for name in filenames:
            if name.endswith(".upload-tmp"):
                continue
            p = base / name
            st = p.lstat()
            found[p.relative_to(folder).as_posix()] = (st.st_mtime_ns, st.st_size)
    return found


def _copy_in(src: Path, dst: Path) -> None:
    """Copy one file or link (times kept) to ``dst``, replacing it atomically."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.view-tmp")
    if src.is_symlink():
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.readlink(src))
    else:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _apply(src: Path, dst: Path, want: dict, have: dict) -> int:
    """
    Make ``dst`` hold ``want`` (the manifest of ``src``) where it differs from
    ``have`` (``dst``'s manifest as last known): copy what changed, remove what is
    gone. Returns the number of paths changed.
    """
    changed = 0
    for rel in sorted(have, reverse=True):  # children before their folders
        if rel not in want or (want[rel] == DIR) != (have[rel] == DIR):
            _remove(dst / rel)
            changed += 1
    for rel, what in sorted(want.items()):
        if what == DIR:
            if have.get(rel) != DIR:
                (dst / rel).mkdir(parents=True, exist_ok=True)
                changed += 1
        elif have.get(rel) != what:
            _copy_in(src / rel, dst / rel)
            changed += 1
    return changed


@dataclass
class VolumeView:
    """
    One container's view of one volume.

    Attributes
    ----------
    volume_id : str
        The volume.
    volume_folder : pathlib.Path
        The volume's committed files (:attr:`~.state.VolumeRecord.folder`).
    folder : pathlib.Path
        The container's copy, mounted at its mount path.
    mount_path : str
        Where the container sees it.
    base : dict
        The view's manifest when it was last made, published or refreshed: what
        :func:`publish` compares against.
    commits : int
        Commits that published this view (explicit, at exit and in the background).
    reloads : int
        Reloads of this view.
    """

    volume_id: str
    volume_folder: Path
    folder: Path
    mount_path: str
    base: dict = field(default_factory=dict)
    commits: int = 0
    reloads: int = 0


def make_view(
    volume_id: str, volume_folder: Path, folder: Path, mount_path: str
) -> VolumeView:
    """
    A container's view of a volume: a copy of its committed files now (times kept).

    Parameters
    ----------
    volume_id : str
    volume_folder : pathlib.Path
        The volume's committed files.
    folder : pathlib.Path
        Where the copy goes (must not exist).
    mount_path : str
        Where the container will see it.

    Returns
    -------
    VolumeView
    """
    shutil.copytree(volume_folder, folder, symlinks=True)
    return VolumeView(volume_id, volume_folder, folder, mount_path, manifest(folder))


def publish(view: VolumeView) -> int:
    """
    Commit a view: put on the volume what the container changed since the view was
    last made, published or refreshed (new and modified files, removals); the rest of
    the volume is left as it is (last write wins, per path).

    Returns
    -------
    int
        The number of paths changed on the volume.
    """
    now = manifest(view.folder)
    # only the paths the container touched: `have` is what the container last saw
    touched = {
        rel for rel in set(now) | set(view.base) if now.get(rel) != view.base.get(rel)
    }
    want = {rel: now[rel] for rel in touched if rel in now}
    have = {rel: view.base[rel] for rel in touched if rel in view.base}
    changed = _apply(view.folder, view.volume_folder, want, have)
    view.base = now
    view.commits += 1
    return changed


def refresh(view: VolumeView) -> None:
    """
    Reload a view: publish its changes (:func:`publish`), then make it the volume's
    current files.
    """
    publish(view)
    _apply(view.volume_folder, view.folder, manifest(view.volume_folder), view.base)
    view.base = manifest(view.folder)
    view.reloads += 1
