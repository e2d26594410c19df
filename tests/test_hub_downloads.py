"""
Downloads of the paper's checkpoints that never hang a run or poison its cache, against
a fake Hub on 127.0.0.1 (`fakes.FileServer`) and a fake file system for the download's
child processes (`fakes.CHILD_FAKES`): a transfer that stops sending is stopped and
tried again (the third time without Xet) or ends in one line; a stale lock left by a
killed download does not block; a lock held by a live process is waited for, then
bypassed; a damaged cached blob is downloaded again before any job uses it; two
downloads at once where locks do nothing both end with the Hub's file.

Deadlines on progress are 2 s here instead of 300: the fake's stalls send nothing at
all, while its transfers of a few MB on 127.0.0.1 take milliseconds, so 2 s tells
them apart even on a loaded 2-core machine, and keeps each test within seconds.
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from fakes import CHILD_FAKES, FileServer, hub_path

from multigeom_workflow.inputs import hub as hubdl
from multigeom_workflow.inputs.fetch import fetch_checkpoint

REPO_ID = "lab/checkpoints"
FILE = "encoders/onoff/V1/best_model.pt"
PATH = hub_path(REPO_ID, FILE)
#: See the module's docstring.
STALL_S = 2.0
#: What a test may take at most: three deadlines, three child processes starting
#: (about 2 s each on a loaded machine) and the checks, with room to spare.
BOUND_S = 45


def checkpoint_bytes(seed: int, n: int = 650_000) -> bytes:
    """A checkpoint of about 2.6 MB: more than the child's 1 MiB reads, so that a
    stalled transfer leaves a partial file to resume."""
    buf = io.BytesIO()
    torch.manual_seed(seed)
    torch.save({"model_state_dict": {"w": torch.randn(n)}, "epoch": 7}, buf)
    return buf.getvalue()


DATA = checkpoint_bytes(0)
ETAG = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The fake Hub serving `FILE`, a cache folder, and the child processes'
    fakes (`CHILD_FAKES`) on their ``PYTHONPATH``, recording each child's
    ``HF_HUB_DISABLE_XET`` in ``server.record``."""
    site = tmp_path / "child-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CHILD_FAKES)
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    )
    record = tmp_path / "children.txt"
    monkeypatch.setenv("MULTIGEOM_TEST_CHILD_RECORD", str(record))
    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    monkeypatch.delenv(hubdl.STALL_ENV, raising=False)
    with FileServer({PATH: DATA}) as fake:
        fake.cache = tmp_path / "hf-cache"
        fake.record = record
        fake.locks = fake.cache / ".locks" / "models--lab--checkpoints"
        fake.blobs = fake.cache / "models--lab--checkpoints" / "blobs"
        yield fake


def fake_flock(monkeypatch, kind: str) -> None:
    """The cache's file system for this process and the download's children:
    ``nosys`` (no ``flock``) or ``noop`` (a ``flock`` that locks nothing); see
    `fakes.CHILD_FAKES` for the file systems and reports each copies."""
    monkeypatch.setenv("MULTIGEOM_TEST_FLOCK", kind)

    def flock(fd, operation):
        if kind == "nosys":
            raise OSError(38, os.strerror(38))  # ENOSYS

    monkeypatch.setattr(fcntl, "flock", flock)


def fetch(server, out, **kw):
    return fetch_checkpoint(
        "encoders",
        "onoff",
        "V1",
        out,
        repo_id=REPO_ID,
        endpoint=server.url,
        cache_dir=server.cache,
        stall_s=kw.pop("stall_s", STALL_S),
        **kw,
    )


def gets(server) -> list[str | None]:
    """The Range header of every GET of the checkpoint, in order."""
    return [r[2] for r in server.requests if r[:2] == ("GET", PATH)]


def verified_blobs(server) -> dict[str, bool]:
    """Every file in the cache's blob folder: is it the file its name says?"""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() == p.name
        for p in server.blobs.iterdir()
    }


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_stalled_transfer_is_stopped_and_resumed(server, tmp_path, capsys):
    server.stall_next[PATH] = 1_500_000  # 1 MiB written by the child, then nothing
    out = tmp_path / "best_model.pt"
    start = time.monotonic()
    fetch(server, out)
    assert time.monotonic() - start < BOUND_S
    assert out.read_bytes() == DATA
    assert gets(server) == [None, f"bytes={1 << 20}-"]  # resumed from the partial file
    assert capsys.readouterr().out.splitlines() == [
        f"notice: {FILE}: the transfer stopped (no bytes for 2 s), try 1 of 3; "
        "trying again"
    ]
    assert server.record.read_text().splitlines() == ["", ""]  # Xet as by default
    assert verified_blobs(server) == {ETAG: True}


@pytest.mark.process
@pytest.mark.timeout(60)
def test_three_stalls_end_in_one_line_the_last_without_xet(server, tmp_path, capsys):
    server.stall_next[PATH] = [1000, 1000, 1000]
    out = tmp_path / "best_model.pt"
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        fetch(server, out)
    assert time.monotonic() - start < BOUND_S
    assert str(err.value) == (
        f"could not download {FILE} of {REPO_ID} on {server.url}: TransferFailed: the "
        "transfer stopped 3 times (no bytes for 2 s; no bytes for 2 s; no bytes for "
        "2 s (Xet disabled)), the last one with Xet disabled as HF_HUB_DISABLE_XET=1 "
        "does; if the link is slow rather than stalled, set MULTIGEOM_DOWNLOAD_STALL_S "
        f"above 2 s, else check the network or proxy to {server.url}"
    )
    assert server.record.read_text().splitlines() == ["", "", "1"]
    assert capsys.readouterr().out.splitlines() == [
        f"notice: {FILE}: the transfer stopped (no bytes for 2 s), try 1 of 3; "
        "trying again",
        f"notice: {FILE}: the transfer stopped (no bytes for 2 s), try 2 of 3; "
        "trying again with Xet disabled",
    ]
    assert not out.exists()
    assert len(gets(server)) == 3


@pytest.mark.process
def test_the_child_given_the_setting_has_xet_off():
    """What the third try's environment does: huggingface_hub reads
    ``HF_HUB_DISABLE_XET`` at its import (``constants.py``), and `is_xet_available`
    (``utils/_runtime.py``) is then False although hf_xet is installed."""
    code = (
        "from huggingface_hub.utils._runtime import is_xet_available\n"
        "import hf_xet\n"
        "print(is_xet_available())\n"
    )
    env = {**os.environ, "HF_HUB_DISABLE_XET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_stale_lock_left_by_a_killed_download_is_removed(
    server, tmp_path, monkeypatch, capsys
):
    # A download killed on a file system without flock leaves its empty marker
    # (huggingface_hub #2543); filelock 4.3 never breaks an empty one
    # (_soft/_exclusive/_recovery.py, RECORDLESS_MARKER): without the check, every
    # later download of the file waits for it forever.
    fake_flock(monkeypatch, "nosys")
    server.locks.mkdir(parents=True)
    lock = server.locks / f"{ETAG}.lock"
    lock.touch()
    out = tmp_path / "best_model.pt"
    fetch(server, out)
    assert out.read_bytes() == DATA
    assert capsys.readouterr().out.splitlines() == [
        "notice: removed 1 stale lock file(s) of the Hugging Face cache that no live "
        f"process on this machine holds ({lock}): a killed download leaves them on a "
        "file system without flock, where they block every later download of the "
        "file (huggingface_hub #2543)"
    ]
    assert verified_blobs(server) == {ETAG: True}  # downloaded into the shared cache
    assert not lock.exists()  # filelock's own marker, removed on release


def this_process() -> str:
    """`hub.Holder`'s words for this process."""
    comm = Path("/proc/self/comm").read_text().strip()
    return f"process {os.getpid()} ({getpass.getuser()}, {comm})"


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["flock", "soft marker"])
def test_a_lock_held_by_a_live_process_is_waited_for_then_bypassed(
    server, tmp_path, monkeypatch, capsys, how
):
    server.locks.mkdir(parents=True)
    lock = server.locks / f"{ETAG}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    if how == "flock":  # a download of another run, hung while holding it
        fcntl.flock(fd, fcntl.LOCK_EX)
    else:  # the same on a file system without flock: filelock 4.3's marker
        # (_soft/_records.py, its older format: pid, host), naming this process
        fake_flock(monkeypatch, "nosys")
        os.write(fd, f"{os.getpid()}\n{hubdl._this_host()}\n".encode())
    try:
        out = tmp_path / "best_model.pt"
        start = time.monotonic()
        fetch(server, out)
        assert time.monotonic() - start < BOUND_S
    finally:
        os.close(fd)
    assert out.read_bytes() == DATA
    assert capsys.readouterr().out.splitlines() == [
        f"notice: {lock} is held by {this_process()}: waiting for its download of "
        f"{FILE} while it makes progress, at most 2 s without any "
        "(MULTIGEOM_DOWNLOAD_STALL_S), then downloading into a private folder",
        f"notice: {lock} is held by {this_process()}, whose download made no "
        f"progress for 2 s; {FILE} is downloaded into a private folder for this run "
        "instead",
    ]
    assert len(gets(server)) == 1  # the private download's
    assert not server.blobs.exists() or not list(server.blobs.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["best_model.pt", "child-site", "children.txt", "hf-cache"]
    )


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_damaged_cached_blob_is_downloaded_again_before_use(server, tmp_path, capsys):
    # One byte changed in the cached blob: a damaged disk, or a download that went
    # wrong in a way huggingface_hub 0.36 does not see (it checks sizes only,
    # file_download.py http_get; a cached blob is never checked again).
    fetch(server, tmp_path / "first.pt")
    blob = server.blobs / ETAG
    damaged = bytearray(blob.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    blob.write_bytes(bytes(damaged))
    capsys.readouterr()
    out = tmp_path / "runs/encoders/onoff/V1/best_model.pt"
    fetch(server, out)
    assert out.read_bytes() == DATA
    got = hashlib.sha256(damaged).hexdigest()
    assert capsys.readouterr().out.splitlines() == [
        f"notice: the cached copy of {FILE} is not the Hub's file (SHA-256 {got}, "
        f"the Hub's {ETAG}; {len(DATA)} bytes; a damaged disk, or two downloads at "
        f"once where locks do nothing, huggingface_hub #4306); removed {blob}; "
        f"{FILE} is downloaded into a private folder for this run instead"
    ]
    assert not blob.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["best_model.pt"]
    # The next run downloads it into the shared cache again.
    fetch(server, tmp_path / "third.pt")
    assert verified_blobs(server) == {ETAG: True}
    assert len(gets(server)) == 3


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_copy_that_is_not_the_hubs_twice_stops_with_one_line(server, tmp_path):
    # A server (or a proxy on the way) whose bytes are not the file its etag names.
    server.etags[PATH] = hashlib.sha256(b"another file").hexdigest()
    out = tmp_path / "best_model.pt"
    with pytest.raises(RuntimeError) as err:
        fetch(server, out)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"could not download {FILE} of {REPO_ID} on {server.url}: the cached copy of "
        f"{FILE} is not the Hub's file (SHA-256 {ETAG}, the Hub's "
        f"{server.etags[PATH]}; "
    )
    assert message.endswith(
        ", and the download into a private folder is not the Hub's file either "
        f"(SHA-256 {ETAG}, the Hub's {server.etags[PATH]}; {len(DATA)} bytes): the "
        "server or a proxy on the way to it changes the file; try again later or "
        "from another network"
    )
    assert not out.exists()
    assert len(gets(server)) == 2
    assert not list(server.blobs.iterdir())  # nothing damaged left in the cache


@pytest.mark.process
@pytest.mark.timeout(60)
def test_two_downloads_at_once_where_locks_do_nothing_both_end_verified(
    server, tmp_path, monkeypatch, capsys
):
    # Two runs sharing one cache on a file system whose flock locks nothing: both
    # append to one blobs/<etag>.incomplete (huggingface_hub 0.36,
    # _download_to_tmp_and_move opens it with "ab"; #4306): one ends with a blob of
    # twice the size, or both with a size error.
    fake_flock(monkeypatch, "noop")
    server.together[PATH] = 2
    server.pace[PATH] = (256 * 1024, 0.05)  # about 0.5 s each, so that they overlap
    outs = [tmp_path / f"run{i}/best_model.pt" for i in (1, 2)]
    errors = []

    def run(out):
        try:
            fetch(server, out, stall_s=10)  # the transfers here never stall
        except Exception as err:  # noqa: BLE001  (said by the assertion below)
            errors.append(err)

    threads = [threading.Thread(target=run, args=(out,)) for out in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=BOUND_S)
    assert not errors
    assert [out.read_bytes() == DATA for out in outs] == [True, True]
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("huggingface_hub #4306" in line for line in lines)
    assert len(gets(server)) == 2 + len(lines)  # one private download per notice
    # Nothing damaged is left in the cache: no blob that is not its name's file,
    # and no partial file longer than the file.
    assert all(verified_blobs(server).values())
    assert not list(server.blobs.glob("*.incomplete"))


@pytest.mark.parametrize(
    "value, seconds",
    [(None, 300.0), ("", 300.0), ("2.5", 2.5), (" 60 ", 60.0)],
)
def test_the_deadline_on_progress_is_a_setting(monkeypatch, value, seconds):
    monkeypatch.delenv(hubdl.STALL_ENV, raising=False)
    if value is not None:
        monkeypatch.setenv(hubdl.STALL_ENV, value)
    assert hubdl.stall_seconds() == seconds
    assert hubdl.stall_seconds(7) == 7.0  # given by the caller


@pytest.mark.parametrize("value", ["0", "-1", "five", "inf", "nan"])
def test_a_bad_deadline_is_named_in_one_line(monkeypatch, value):
    monkeypatch.setenv(hubdl.STALL_ENV, value)
    with pytest.raises(ValueError) as err:
        hubdl.stall_seconds()
    assert str(err.value) == (
        "MULTIGEOM_DOWNLOAD_STALL_S must be a number of seconds above 0 (default "
        f"300), not {value!r}"
    )
