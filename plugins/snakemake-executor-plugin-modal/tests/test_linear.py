"""
Work that grows with a shard's outputs grows linearly (issue 37): bringing a failed
shard's finished outputs home and deleting outputs with their reuse markers list
the volume a fixed number of times, however many outputs and entries there are.

The volume is a stand-in that counts its listings and the entries they return
(``Volume.listdir`` of modal 1.6.4: a folder's entries, or every entry below it with
``recursive=True``; paths relative to the volume's root).
"""

from __future__ import annotations

import types
from pathlib import PurePosixPath

import pytest

from snakemake_executor_plugin_modal.container import DONE
from snakemake_executor_plugin_modal.staging import MANIFEST, VolumeStager

#: Per-image files in the shard's folder on the volume.
ENTRIES = 10_000
#: Outputs brought home or removed.
OUTPUTS = 4
KEY = "k" * 64


class CountingVolume:
    """A volume of named files (path -> bytes) that counts what it lists."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.listings = 0
        self.scanned = 0

    def listdir(self, path: str, recursive: bool = False):
        self.listings += 1
        base = PurePosixPath(path.strip("/") or ".")
        found = []
        for name in self.files:
            p = PurePosixPath(name)
            inside = base == PurePosixPath(".") or base in p.parents
            if inside and (recursive or p.parent == base):
                found.append(
                    types.SimpleNamespace(
                        path=name, type=types.SimpleNamespace(name="FILE"), mtime=0
                    )
                )
        if not found:
            raise FileNotFoundError(path)
        self.scanned += len(found)
        return found

    def read_file(self, path: str):
        if path not in self.files:
            raise FileNotFoundError(path)
        yield self.files[path]

    def remove_file(self, path: str, recursive: bool = False):
        if self.files.pop(path, None) is None:
            raise FileNotFoundError(path)

    def batch_upload(self, force: bool = False):
        volume = self

        class Batch:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def put_file(self, local, remote):
                with open(local, "rb") as fh:
                    volume.files[remote.lstrip("/")] = fh.read()

        return Batch()


def _shard(prefix: str = "proj") -> tuple[CountingVolume, list[dict]]:
    """A shard's folder of ENTRIES images with their markers; its first OUTPUTS
    images are the members of the failed job."""
    files = {f"{prefix}/{MANIFEST}": b"{}"}
    for i in range(ENTRIES):
        rel = f"runs/per_image/img{i:05d}.pt"
        files[f"{prefix}/{rel}"] = b"x"
        files[f"{prefix}/{DONE}/{rel}@{KEY}"] = KEY.encode()
    members = [
        {"outputs": [f"runs/per_image/img{i:05d}.pt"], "key": KEY}
        for i in range(OUTPUTS)
    ]
    return CountingVolume(files), members


def test_a_failed_shard_comes_home_with_a_fixed_number_of_listings(tmp_path):
    """`VolumeStager.finished` and `download` (what ``handle_job_error`` calls):
    one listing each, each entry scanned once per listing, whatever the outputs."""
    volume, members = _shard()
    stager = VolumeStager(volume, "proj", tmp_path)
    finished = stager.finished(members)
    assert finished == sorted(m["outputs"][0] for m in members)
    assert stager.download(finished) == finished
    assert volume.listings == 2
    assert volume.scanned == 2 * (2 * ENTRIES + 1)  # images, markers, manifest
    assert (tmp_path / finished[0]).read_bytes() == b"x"


@pytest.mark.parametrize("outputs", [OUTPUTS, 4 * OUTPUTS])
def test_removing_outputs_lists_each_marker_folder_once(tmp_path, outputs):
    """`VolumeStager.remove` (the workflow's ``clear``): the markers' folder is
    listed once for all the outputs removed, not once per output; another output's
    marker (``img00001.pt0`` begins as ``img00001.pt``) is kept."""
    volume, _ = _shard()
    rels = [f"runs/per_image/img{i:05d}.pt" for i in range(outputs)]
    other = f"proj/{DONE}/runs/per_image/img00001.pt0@{KEY}"
    volume.files[other] = b"k"
    stager = VolumeStager(volume, "proj", tmp_path)
    assert stager.remove([*rels, "runs/per_image/missing.pt"]) == rels
    assert volume.listings == 1
    assert volume.scanned == ENTRIES + 1
    for rel in rels:
        assert f"proj/{rel}" not in volume.files
        assert f"proj/{DONE}/{rel}@{KEY}" not in volume.files
    assert other in volume.files
    assert f"proj/{DONE}/runs/per_image/img{outputs:05d}.pt@{KEY}" in volume.files
