"""
A partial TinyImageNet download in any state (empty, short, full, longer than the
archive, corrupt; a server answering HTTP 416) ends in a checked archive, or in one
message naming the partial file and what to do; a transfer that stops sending is
stopped and tried again, three times at most; a damaged archive already in place is
downloaded again.
"""

from __future__ import annotations

import time

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


#: Deadline on progress in these tests: the fake's stalls send nothing at all, its
#: transfers of a few kB on 127.0.0.1 take milliseconds; 1 s tells them apart and
#: keeps each test within seconds (the setting's default is 300 s).
STALL_S = 1.0


@pytest.mark.timeout(60)
def test_a_stalled_archive_transfer_is_stopped_and_tried_again(host, tmp_path, capsys):
    # The host stops sending mid-file and keeps the connection open: upstream's
    # download_file (urlopen without a timeout) would wait forever.
    host.stall_next["/tiny.zip"] = len(ZIP) // 2
    out = tmp_path / "tiny-imagenet-200.zip"
    start = time.monotonic()
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], len(ZIP), STALL_S)
    assert time.monotonic() - start < 30
    assert out.read_bytes() == ZIP
    # Its 1 MiB reads wrote nothing of the first transfer: the second starts anew.
    assert host.requests == [("GET", "/tiny.zip", None)] * 2
    assert capsys.readouterr().out.splitlines() == [
        "notice: TinyImageNet: the transfer stopped (no bytes for 1 s), try 1 of 3; "
        "trying again"
    ]


@pytest.mark.timeout(60)
def test_three_stalled_archive_transfers_end_in_one_line(host, tmp_path):
    host.stall_next["/tiny.zip"] = [100, 100, 100]
    url = f"{host.url}/tiny.zip"
    out = tmp_path / "tiny-imagenet-200.zip"
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        download_tinyimagenet_archive(out, [url, f"{host.url}/mirror.zip"], None, 1)
    assert time.monotonic() - start < 30
    assert str(err.value) == (
        f"could not download TinyImageNet: the transfer stopped 3 times ({url}: no "
        f"bytes for 1 s; {url}: no bytes for 1 s; {url}: no bytes for 1 s); if the "
        "link is slow rather than stalled, set MULTIGEOM_DOWNLOAD_STALL_S above 1 s; "
        f"the partial download {out}.part (0 bytes) is kept: run again to resume it, "
        "or delete it to start over"
    )
    assert len(host.requests) == 3  # the mirror is not asked after three stalls


@pytest.mark.parametrize(
    "archive, problem",
    [
        (corrupt(ZIP), "BadZipFile: corrupt member"),
        (ZIP[:-1], f"{len(ZIP) - 1} bytes, not the published {len(ZIP)}"),
    ],
    ids=["one byte changed", "one byte short"],
)
def test_a_damaged_archive_is_removed_and_downloaded_again(
    host, tmp_path, capsys, archive, problem
):
    out = tmp_path / "tiny-imagenet-200.zip"
    out.write_bytes(archive)
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], len(ZIP))
    assert out.read_bytes() == ZIP
    assert host.requests == [("GET", "/tiny.zip", None)]
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"notice: {out}: {problem}")
    assert line.endswith("; removed, and downloaded again")
