"""
Fetching the paper's inputs from servers on 127.0.0.1 that stand in for the Hugging
Face Hub and TinyImageNet's host: downloads verified, interrupted transfers resumed or
redone, bad answers failing with a clear message and leaving nothing that looks
finished; a shared cache whose lock file this user cannot write does not stop a run.
"""

from __future__ import annotations

import getpass
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import REPO
from fakes import FileServer, hub_path, tinyimagenet_zip

from multigeom_workflow.inputs.fetch import (
    BACKBONE_WEIGHTS,
    download_tinyimagenet_archive,
    extract_member,
    fetch_checkpoint,
    torch_hub_checkpoints_dir,
)
from multigeom_workflow.inputs.images import tinyimagenet_val_files

REPO_ID = "lab/checkpoints"


def checkpoint_bytes(seed: int) -> bytes:
    buf = io.BytesIO()
    torch.manual_seed(seed)
    torch.save({"model_state_dict": {"w": torch.randn(3000)}, "epoch": 7}, buf)
    return buf.getvalue()


@pytest.fixture
def hub(tmp_path):
    files = {
        hub_path(REPO_ID, "encoders/onoff/V1/best_model.pt"): checkpoint_bytes(0),
        hub_path(REPO_ID, "diffusion/onoff/V1/final_model.pt"): checkpoint_bytes(1),
        hub_path(REPO_ID, "encoders/onoff/V4/best_model.pt"): b"not a checkpoint",
    }
    with FileServer(files) as server:
        server.cache = tmp_path / "hf-cache"
        yield server


def fetch(hub, kind, area, out, **kw):
    return fetch_checkpoint(
        kind,
        "onoff",
        area,
        out,
        repo_id=REPO_ID,
        endpoint=hub.url,
        cache_dir=hub.cache,
        **kw,
    )


@pytest.mark.process
def test_checkpoint_lands_in_the_run_layout_through_the_cache(
    hub, tmp_path, monkeypatch
):
    out = tmp_path / "runs/encoders/onoff/V1/best_model.pt"
    fetch(hub, "encoders", "V1", out)
    assert out.read_bytes() == checkpoint_bytes(0)
    assert list(hub.cache.rglob("best_model.pt"))  # huggingface_hub's cache
    # The cache answers when the server is gone (no network). huggingface_hub 0.36
    # tries a refused connection five times, waiting 1+2+4+8+8 s between
    # (utils/_http.py, http_backoff): the tries are kept, the waits skipped.
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda s: None))
    hub.stop()
    again = tmp_path / "again.pt"
    fetch(hub, "encoders", "V1", again)
    assert again.read_bytes() == checkpoint_bytes(0)
    assert not [r for r in hub.requests if r[0] == "GET"][1:]  # one download


@pytest.mark.process
def test_no_network_and_nothing_cached_says_so(hub, tmp_path, monkeypatch):
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda s: None))
    hub.stop()
    with pytest.raises(RuntimeError) as err:
        fetch(hub, "encoders", "V1", tmp_path / "best_model.pt")
    message = str(err.value)
    assert message.startswith(
        f"could not download encoders/onoff/V1/best_model.pt of {REPO_ID} on "
        f"{hub.url}: ConnectionError: "
    )
    assert "Failed to establish a new connection" in message
    assert message.endswith(
        f"; the Hub did not answer, and {hub.cache} does not hold it"
    )


@pytest.mark.process
@pytest.mark.parametrize(
    "kind, area, match",
    [
        ("diffusion", "V4", "could not download diffusion/onoff/V4/final_model.pt"),
        ("encoders", "V4", "encoders/onoff/V4/best_model.pt of lab/checkpoints .* is "),
    ],
    ids=["missing file", "not a checkpoint"],
)
def test_bad_checkpoint_fails_and_leaves_nothing(hub, tmp_path, kind, area, match):
    out = tmp_path / "checkpoint.pt"
    with pytest.raises(RuntimeError, match=match):
        fetch(hub, kind, area, out)
    assert not out.exists()


@pytest.mark.process
def test_interrupted_checkpoint_transfer_is_redone(hub, tmp_path, capsys):
    path = hub_path(REPO_ID, "diffusion/onoff/V1/final_model.pt")
    hub.cut_next[path] = 5000
    out = tmp_path / "final_model.pt"
    fetch(hub, "diffusion", "V1", out)
    assert out.read_bytes() == checkpoint_bytes(1)
    gets = [r for r in hub.requests if r[0] == "GET" and r[1] == path]
    # Tried again at once: from the start (the child reads 1 MiB at a time, so none of
    # the 5000 bytes was written to the partial file).
    assert gets == [("GET", path, None), ("GET", path, None)]
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(
        "notice: diffusion/onoff/V1/final_model.pt: the transfer stopped "
        "(ChunkedEncodingError: ('Connection broken: IncompleteRead(5000 bytes read"
    )
    assert line.endswith("try 1 of 3; trying again")


def test_wrong_checkpoint_size_is_refused(hub, tmp_path):
    path = hub_path(REPO_ID, "encoders/onoff/V1/best_model.pt")
    hub.announce[path] = len(hub.files[path]) + 10
    out = tmp_path / "best_model.pt"
    with pytest.raises(RuntimeError, match="could not download"):
        fetch(hub, "encoders", "V1", out)
    assert not out.exists()


@pytest.fixture
def shared_cache():
    """
    A lab's shared Hugging Face cache (folders writable by all, as a group-writable
    ``HF_HOME`` is to its members) holding the lock file another member's download of
    ``encoders/onoff/V1/best_model.pt`` left: ``<cache>/.locks/models--lab--checkpoints
    /<etag>.lock`` (huggingface_hub 0.36 ``file_download.py``; the etag is the one the
    server sends, `fakes.FileServer`: the SHA-256 of the file), made with umask 022.
    Outside pytest's own temporary folder, which only its owner can enter.
    """
    root = Path(tempfile.mkdtemp(prefix="shared-"))
    root.chmod(0o777)
    cache = root / "hf-cache"
    locks = cache / ".locks" / "models--lab--checkpoints"
    locks.mkdir(parents=True)
    for folder in (cache, cache / ".locks", locks):
        folder.chmod(0o777)
    lock = locks / f"{hashlib.sha256(checkpoint_bytes(0)).hexdigest()}.lock"
    lock.touch()
    lock.chmod(0o644)
    yield cache, lock
    shutil.rmtree(root)


def fetch_as_another_member(hub, cache, lock, out):
    """
    `fetch_checkpoint` in a process of a user who cannot write `lock`: the real
    ``PermissionError`` of filelock's ``open(lock, O_RDWR)``. Root ignores file modes,
    so as root the fetch runs as ``nobody`` (`setpriv`); another user runs it as
    itself, the lock file made read-only.
    """
    as_other = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: no user to refuse")
        as_other = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    else:
        lock.chmod(0o444)
    code = (
        "from multigeom_workflow.inputs.fetch import fetch_checkpoint\n"
        f"fetch_checkpoint('encoders', 'onoff', 'V1', {str(out)!r}, "
        f"repo_id={REPO_ID!r}, endpoint={hub.url!r}, cache_dir={str(cache)!r})\n"
    )
    home = cache.parent / "home"
    home.mkdir(mode=0o777, exist_ok=True)
    home.chmod(0o777)
    env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf")}
    return subprocess.run(
        [*as_other, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def lock_owner_and_mode() -> tuple[str, str]:
    """Of the lock file of `shared_cache` as `fetch_as_another_member` leaves it."""
    if os.geteuid() == 0:
        return "root", "-rw-r--r--"
    return getpass.getuser(), "-r--r--r--"


@pytest.mark.process
def test_a_shared_cache_lock_this_user_cannot_write_is_not_a_failure(hub, shared_cache):
    cache, lock = shared_cache
    out = cache.parent / "runs/encoders/onoff/V1/best_model.pt"
    out.parent.mkdir(parents=True)
    out.parent.chmod(0o777)
    done = fetch_as_another_member(hub, cache, lock, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_bytes() == checkpoint_bytes(0)
    owner, mode = lock_owner_and_mode()
    assert done.stdout.splitlines() == [
        f"notice: the Hugging Face cache {cache} holds {lock} ({owner}, {mode}), "
        "which this user cannot write (Permission denied); "
        "encoders/onoff/V1/best_model.pt is downloaded into a private folder for "
        f"this run instead; to share the cache again, ask {owner} to run "
        f"`chmod g+w {lock}` (a shared cache wants `umask 002` of every member), or "
        "set HF_HUB_CACHE to a folder of your own"
    ]
    # One download, into the private folder; it is gone, and the shared cache is as
    # it was (no blob, the lock file untouched).
    path = hub_path(REPO_ID, "encoders/onoff/V1/best_model.pt")
    assert [r for r in hub.requests if r[0] == "GET" and r[1] == path] == [
        ("GET", path, None)
    ]
    assert sorted(p.name for p in out.parent.iterdir()) == ["best_model.pt"]
    assert not list(cache.rglob("blobs/*"))
    assert stat.filemode(lock.stat().st_mode) == mode


@pytest.mark.process
def test_a_failed_private_download_says_both_in_one_line(hub, shared_cache):
    cache, lock = shared_cache
    owner, _ = lock_owner_and_mode()
    out = cache.parent / "best_model.pt"
    hub.cut_next[hub_path(REPO_ID, "encoders/onoff/V1/best_model.pt")] = [5000] * 3
    done = fetch_as_another_member(hub, cache, lock, out)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "RuntimeError: could not download encoders/onoff/V1/best_model.pt of "
        f"lab/checkpoints on {hub.url}: the Hugging Face cache {cache} holds {lock}"
    )
    assert (
        ", and the download into a private folder failed too (TransferFailed: the "
        "transfer stopped 3 times (ChunkedEncodingError: ('Connection broken: "
        "IncompleteRead(5000 bytes read"
    ) in last
    assert last.endswith(
        f"to share the cache again, ask {owner} to run `chmod g+w {lock}` (a shared "
        "cache wants `umask 002` of every member), or set HF_HUB_CACHE to a folder "
        "of your own"
    )
    assert not out.exists()
    assert not [p for p in cache.parent.iterdir() if ".hf-cache-" in p.name]


ZIP = tinyimagenet_zip(12)


@pytest.fixture
def host():
    with FileServer({"/tiny.zip": ZIP, "/bad.zip": b"x" * len(ZIP)}) as server:
        yield server


def test_archive_download_is_checked(host, tmp_path):
    out = tmp_path / "tiny-imagenet-200.zip"
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], len(ZIP))
    assert out.read_bytes() == ZIP


def test_interrupted_archive_transfer_is_redone(host, tmp_path, capsys):
    out = tmp_path / "tiny-imagenet-200.zip"
    host.cut_next["/tiny.zip"] = 1000
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], len(ZIP))
    assert out.read_bytes() == ZIP
    # upstream's download_file drops the part of a short transfer: redone from byte 0
    assert host.requests == [("GET", "/tiny.zip", None)] * 2
    assert capsys.readouterr().out.splitlines() == [
        f"notice: TinyImageNet: the transfer stopped (cut short: {host.url}/tiny.zip: "
        f"1000 bytes, expected {len(ZIP)}), try 1 of 3; trying again"
    ]


def test_partial_archive_left_by_a_killed_job_is_resumed(host, tmp_path):
    out = tmp_path / "tiny-imagenet-200.zip"
    (tmp_path / "tiny-imagenet-200.zip.part").write_bytes(ZIP[:1000])
    download_tinyimagenet_archive(out, [f"{host.url}/tiny.zip"], len(ZIP))
    assert out.read_bytes() == ZIP
    assert host.requests[-1] == ("GET", "/tiny.zip", "bytes=1000-")


@pytest.mark.parametrize(
    "urls, expected, match",
    [
        (["/missing.zip"], len(ZIP), "HTTP Error 404"),
        (["/tiny.zip"], len(ZIP) + 1, f"{len(ZIP)} bytes, expected {len(ZIP) + 1}"),
        (["/bad.zip"], len(ZIP), "BadZipFile"),
    ],
    ids=["404", "wrong size", "corrupt zip"],
)
def test_bad_archive_fails_and_leaves_nothing(host, tmp_path, urls, expected, match):
    out = tmp_path / "tiny-imagenet-200.zip"
    with pytest.raises(RuntimeError, match=match):
        download_tinyimagenet_archive(out, [host.url + u for u in urls], expected)
    assert list(tmp_path.iterdir()) == []


def test_second_source_is_tried(host, tmp_path):
    out = tmp_path / "tiny-imagenet-200.zip"
    urls = [f"{host.url}/missing.zip", f"{host.url}/tiny.zip"]
    download_tinyimagenet_archive(out, urls, len(ZIP))
    assert out.read_bytes() == ZIP


def test_extracting_one_test_image(tmp_path):
    archive = tmp_path / "a.zip"
    archive.write_bytes(ZIP)
    out = tmp_path / "val_3.JPEG"
    extract_member(archive, "tiny-imagenet-200/val/images/val_3.JPEG", out)
    with zipfile.ZipFile(archive) as z:
        assert out.read_bytes() == z.read("tiny-imagenet-200/val/images/val_3.JPEG")
    with pytest.raises(KeyError, match="no member tiny-imagenet-200/val/images/val_99"):
        extract_member(archive, "tiny-imagenet-200/val/images/val_99.JPEG", out)


def test_known_val_order_is_upstreams_on_the_full_set(tmp_path):
    """The names known before the download are listed in upstream's order."""
    from multigeom.datasets import TinyImageNetDataset

    expected = tinyimagenet_val_files(tmp_path, count=120)
    for f in expected:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"")
    upstream = TinyImageNetDataset("val", tmp_path / "tiny-imagenet-200").image_paths
    assert [str(p) for p in upstream] == expected
    assert [p.rsplit("/", 1)[1] for p in expected[:4]] == [
        "val_0.JPEG",
        "val_1.JPEG",
        "val_10.JPEG",
        "val_100.JPEG",
    ]


@pytest.mark.parametrize(
    "env", [{}, {"TORCH_HOME": "/x/th"}, {"XDG_CACHE_HOME": "/x/c"}]
)
def test_torch_cache_found_as_torch_finds_it(monkeypatch, env):
    for key in ("TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert str(torch_hub_checkpoints_dir()) == torch.hub.get_dir() + "/checkpoints"


def test_backbone_weight_files_are_torchvisions():
    from torchvision.models import Inception_V3_Weights, ResNet50_Weights

    for encoder, weights in (
        ("inception", Inception_V3_Weights.IMAGENET1K_V1),
        ("resnet50", ResNet50_Weights.IMAGENET1K_V2),
    ):
        assert BACKBONE_WEIGHTS[encoder][0] == weights.url.rsplit("/", 1)[1]


def test_sources_agree_with_upstream_and_the_schema():
    """The Hub repository, TinyImageNet's URLs and size: upstream's, in every place."""
    import yaml
    from conftest import REPO
    from multigeom.datasets import download
    from multigeom.encoders import neural

    from multigeom_workflow.inputs.fetch import (
        HUB_REPO,
        TINYIMAGENET_BYTES,
        TINYIMAGENET_URLS,
    )

    schema = yaml.safe_load((REPO / "config/schemas/config.schema.yaml").read_text())
    props = schema["properties"]
    assert (
        HUB_REPO
        == neural.DEFAULT_REPO
        == props["checkpoints"]["properties"]["repo_id"]["default"]
    )
    test_images = props["test_images"]["properties"]
    assert list(TINYIMAGENET_URLS) == list(download.TINYIMAGENET_URLS)
    assert test_images["urls"]["default"] == list(TINYIMAGENET_URLS)
    assert TINYIMAGENET_BYTES == download.TINYIMAGENET_BYTES
    assert test_images["archive_bytes"]["default"] == TINYIMAGENET_BYTES


def test_modal_image_caches_the_backbone_weights_a_run_needs():
    """The Modal profile builds into the container image the torchvision weights the
    paper's encoders need (a container has no other way to get them)."""
    import yaml

    from multigeom_workflow.inputs.fetch import BACKBONE_WEIGHTS

    profile = yaml.safe_load((REPO / "profiles/modal/profile.yaml").read_text())
    expected = sorted(command for _, command in BACKBONE_WEIGHTS.values())
    assert sorted(profile["modal-image-commands"]) == expected
