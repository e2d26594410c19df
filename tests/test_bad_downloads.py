"""
A partial TinyImageNet download in any state (empty, short, full, longer than the
archive, corrupt; a server answering HTTP 416) ends in a checked archive, or in one
message naming the partial file and what to do.
"""

from __future__ import annotations

import pytest
from fakes import FileServer, tinyimagenet_zip

from multigeom_workflow.inputs.fetch import download_tinyimagenet_archive

ZIP = tinyimagenet_zip(12)


@pytest.fixture
def host():
    with FileServer({"/tiny.zip": ZIP}) as server:
        yield server


def corrupt(data: bytes) -> bytes:
    """The archive with one byte of a member's data changed (its CRC fails)."""
    i = len(data) // 3
    return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]


PARTS = {
    # state of the .part: (its bytes, requests the download must make)
    "empty": (b"", [("GET", "/tiny.zip", None)]),
    "short": (ZIP[:1000], [("GET", "/tiny.zip", "bytes=1000-")]),
    "full": (ZIP, []),  # killed after the last byte, before the rename
    "longer": (ZIP + b"junk", [("GET", "/tiny.zip", None)]),
    "full but corrupt": (corrupt(ZIP), [("GET", "/tiny.zip", None)]),
    "short and corrupt": (
        corrupt(ZIP)[: len(ZIP) // 2],
        [("GET", "/tiny.zip", f"bytes={len(ZIP) // 2}-"), ("GET", "/tiny.zip", None)],
    ),
}


@pytest.mark.parametrize("state", PARTS)
def test_partial_download_ends_in_a_checked_archive(host, tmp_path, state):
    data, requests = PARTS[state]
    out = tmp_path / "tiny-imagenet-200.zip"
    (tmp_path / "tiny-imagenet-200.zip.part").write_bytes(data)
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], len(ZIP))
    assert out.read_bytes() == ZIP
    assert host.requests == requests
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_range_refused_with_416_is_redone_from_the_start(host, tmp_path):
    # Without a known size, a complete .part is resumed from its end: the server
    # answers 416 (nothing after it), and the download starts over.
    out = tmp_path / "tiny-imagenet-200.zip"
    (tmp_path / "tiny-imagenet-200.zip.part").write_bytes(ZIP + b"x")
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], None)
    assert out.read_bytes() == ZIP
    assert host.requests == [
        ("GET", "/tiny.zip", f"bytes={len(ZIP) + 1}-"),
        ("GET", "/tiny.zip", None),
    ]


def test_failure_names_the_partial_file_and_what_to_do(host, tmp_path):
    out = tmp_path / "tiny-imagenet-200.zip"
    part = tmp_path / "tiny-imagenet-200.zip.part"
    part.write_bytes(ZIP[:1000])
    with pytest.raises(RuntimeError) as err:
        download_tinyimagenet_archive(out, [f"{host.url}/gone.zip"], len(ZIP))
    message = str(err.value)
    assert "HTTP Error 404" in message
    assert f"the partial download {part} (1000 bytes) is kept" in message
    assert "run again to resume it, or delete it to start over" in message
    assert "\n" not in message
    assert not out.exists()
