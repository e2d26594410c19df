"""
Fetching the paper's inputs: the published checkpoints from the Hugging Face Hub, the
TinyImageNet test images, and the check that torchvision's backbone weights are cached.

* Checkpoints: ``encoders/<enc>/<area>/best_model.pt`` and
  ``diffusion/<enc>/<area>/final_model.pt`` of the Hub repository upstream uses
  (`HUB_REPO`), downloaded with `huggingface_hub.hf_hub_download` (its cache, an
  optional revision, ``HF_TOKEN`` when set, ``HF_ENDPOINT`` for another server) in a
  child process with a deadline on progress (`multigeom_workflow.inputs.hub`), then
  checked against the Hub's SHA-256 while they are copied into upstream's run layout.
* TinyImageNet: the archive is downloaded with upstream's
  `multigeom.datasets.download.download_file` (resumes an interrupted transfer, checks
  the size) under the same deadline, checked as a zip, and only the test images the
  run needs are extracted, one file per job.

Every file appears complete or not at all (`multigeom_workflow.atomic.atomic_path`).
No download waits without end: no new byte for ``MULTIGEOM_DOWNLOAD_STALL_S``
seconds (default 300) and the transfer is stopped and tried again, three times at
most, then the job ends with one line. A stale lock file in the Hugging Face cache
(a killed download's, huggingface_hub #2543) is removed; a cached copy that is not
the Hub's file (two downloads at once where locks do nothing, #4306) is removed and
downloaded again. A shared Hugging Face cache that this user cannot write (a lab's
``HF_HOME`` holding another member's lock file without group write,
huggingface_hub #2580) does not stop the run: the checkpoint is downloaded into a
private folder, with one notice naming the file and the fix (`fetch_checkpoint`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import zipfile
from http.client import HTTPException
from pathlib import Path

from ..atomic import atomic_path
from ..settings.layout import checkpoint_relpath
from . import hub

__all__ = [
    "BACKBONE_WEIGHTS",
    "HUB_REPO",
    "TINYIMAGENET_BYTES",
    "TINYIMAGENET_URLS",
    "download_tinyimagenet_archive",
    "extract_member",
    "fetch_checkpoint",
    "hub_filename",
    "missing_backbone_weights",
    "torch_hub_checkpoints_dir",
]

#: The Hub repository of the paper's checkpoints (upstream
#: `multigeom.encoders.neural.DEFAULT_REPO`).
HUB_REPO = "steevelaquitaine/multigeom"
#: Where TinyImageNet comes from and its archive's size in bytes (upstream
#: `multigeom.datasets.download.TINYIMAGENET_URLS` and `TINYIMAGENET_BYTES`).
TINYIMAGENET_URLS = (
    "https://cs231n.stanford.edu/tiny-imagenet-200.zip",
    "https://image-net.org/data/tiny-imagenet-200.zip",
)
TINYIMAGENET_BYTES = 248100043
#: Torchvision's weight files of the paper's backbones (the file names of
#: `Inception_V3_Weights.IMAGENET1K_V1` and `ResNet50_Weights.IMAGENET1K_V2`), and how
#: to put each in torchvision's cache.
BACKBONE_WEIGHTS = {
    "inception": (
        "inception_v3_google-0cc3c7bd.pth",
        'python -c "import torchvision; '
        "torchvision.models.inception_v3(weights='IMAGENET1K_V1')\"",
    ),
    "resnet50": (
        "resnet50-11ad3fa6.pth",
        'python -c "import torchvision; '
        "torchvision.models.resnet50(weights='IMAGENET1K_V2')\"",
    ),
}


def hub_filename(kind: str, encoder: str, area: str) -> str:
    """
    The checkpoint's path in the Hub repository, e.g.
    ``encoders/inception/V1/best_model.pt`` (kind ``encoders``) or
    ``diffusion/inception/V1/final_model.pt`` (kind ``diffusion``).
    """
    return checkpoint_relpath(kind, encoder, area)


def fetch_checkpoint(
    kind: str,
    encoder: str,
    area: str,
    out: str | Path,
    *,
    repo_id: str = HUB_REPO,
    revision: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
    stall_s: float | None = None,
) -> Path:
    """
    Download a published checkpoint into the Hugging Face cache, check it is the
    Hub's file, and copy it to `out`.

    Parameters
    ----------
    kind : {"encoders", "diffusion"}
    encoder, area : str
    out : str or Path
        Its place in upstream's run layout.
    repo_id, revision : str
        The Hub repository and an optional revision (commit, tag or branch).
    endpoint, cache_dir : str, optional
        The Hub server and the cache folder; by default huggingface_hub's own
        (``HF_ENDPOINT``, ``HF_HUB_CACHE`` or ``HF_HOME``). ``HF_TOKEN`` is sent when
        set.
    stall_s : float, optional
        Seconds without a new byte after which a transfer is stopped and tried again;
        by default ``MULTIGEOM_DOWNLOAD_STALL_S``, else 300
        (`multigeom_workflow.inputs.hub.stall_seconds`).

    Returns
    -------
    Path
        `out`, a file whose bytes are the Hub's (its SHA-256 is the Hub's etag), that
        `torch.load` reads and that holds ``model_state_dict``.

    Raises
    ------
    RuntimeError
        One line naming the file, the repository and the server, and why: the
        server's answer (missing file, no access, no network), three transfers that
        stalled or broke off (with what to set), a copy that is not the Hub's file
        twice, or a file that is not a checkpoint. Nothing is written to `out` then.

    Notes
    -----
    The download itself (`multigeom_workflow.inputs.hub.download`) has a deadline on
    progress, tries again (the third time without Xet), and removes stale lock files
    first. Every cached copy is then hashed while it is copied to `out` and compared
    with the Hub's etag (asked with one HEAD request; offline, the blob's name in the
    cache, which is that etag). Where the first download cannot be used, the
    checkpoint is downloaded once more into a private folder next to `out` (removed
    once `out` is written), and one ``notice:`` line says why:

    * a cached copy that is not the Hub's file (a damaged disk, or two downloads at
      once into one partial file where locks do nothing: huggingface_hub #4306,
      fixed only in 1.18, which multigeom's pin excludes): it is removed from the
      cache first, so the next run downloads it there again. A second download
      into the shared cache could meet the same other writer; a private one cannot.
    * a lock file held by a live process whose download makes no progress for
      `stall_s` (a hung download of another run).
    * a cache this user cannot write. huggingface_hub takes a lock before it
      downloads a file into its cache, ``<cache>/.locks/<repo folder>/<etag>.lock``
      (`huggingface_hub.file_download._hf_hub_download_to_cache_dir`, 0.36), with
      filelock's `FileLock`, which opens an existing lock file for writing and
      raises ``PermissionError`` when it cannot (filelock 4.3, ``_native/_unix.py``).
      In a lab's shared ``HF_HOME`` the file is another member's, made without group
      write (umask 022): every other member's download of that file fails, and a
      retry fails the same way (huggingface_hub #2580). huggingface_hub has no
      setting for another lock folder, so a private lock folder means a private
      cache. The notice names the file, its owner and the fix (its owner runs
      ``chmod g+w`` on it; or ``HF_HUB_CACHE`` set to a folder of one's own).

    Chosen over stopping because the run then ends with its checkpoints, the shared
    cache is not written by a download that may collide, and no second cache grows
    (the run keeps its copy in the run layout anyway); the cost is one download the
    shared cache might have saved. If the private download fails too, the error says
    both; if its copy is not the Hub's either, it stops there.
    """
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    stall_s = hub.stall_seconds(stall_s)
    filename = hub_filename(kind, encoder, area)
    server = endpoint or constants.ENDPOINT
    where = f"{filename} of {repo_id}" + (f"@{revision}" if revision else "")
    where += f" on {server}"
    shared = Path(cache_dir or constants.HF_HUB_CACHE)
    blobs = shared / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    out = Path(out)
    meta, offline = hub.file_metadata(
        repo_id,
        filename,
        revision=revision,
        endpoint=endpoint,
        token=os.environ.get("HF_TOKEN") or None,
    )
    etag, size = (meta.etag, meta.size) if meta else (None, None)
    hint = (
        f"; if the link is slow rather than stalled, set {hub.STALL_ENV} above "
        f"{stall_s:g} s, else check the network or proxy to {server}"
    )

    def download(cache) -> str:
        return hub.download(
            repo_id,
            filename,
            cache,
            revision=revision,
            endpoint=endpoint,
            etag=etag,
            offline=offline is not None,
            stall_s=stall_s,
        )

    def reason(err: Exception) -> str:
        unanswered = ""
        if offline and getattr(err, "name", "") == "LocalEntryNotFoundError":
            err = offline  # not in the cache: the Hub's silence is the reason
            unanswered = f"; the Hub did not answer, and {shared} does not hold it"
        name = getattr(err, "name", type(err).__name__)
        text = f"{name}: " + " ".join(str(err).split())[:300] + unanswered
        return text + (hint if isinstance(err, hub.TransferFailed) else "")

    with contextlib.ExitStack() as private_folder:
        why = None  # (what was wrong with the shared cache, the fix or "")
        try:
            cached = download(shared)
        except PermissionError as err:
            why = _unwritable_cache_file(err, shared)
            if why is None:
                message = f"could not download {where}: {reason(err)}"
                raise RuntimeError(message) from err
        except hub.LockStillHeld as err:
            why = (str(err), "")
        except hub.DamagedTransfer as err:
            removed = hub.remove_damaged(None, None, blobs, etag, size)
            why = (
                f"the download of {filename} into the Hugging Face cache {shared} "
                "was damaged "
                f"({err}; two downloads at once where locks do nothing, "
                f"huggingface_hub #4306){_removed(removed)}",
                "",
            )
        except Exception as err:  # huggingface_hub's and the network's errors alike
            raise RuntimeError(f"could not download {where}: {reason(err)}") from err
        else:
            damage = _install(cached, out, etag, where)
            if damage is None:
                return out
            problem, read = damage
            removed = hub.remove_damaged(cached, read, blobs, etag, size)
            why = (
                f"the cached copy of {filename} is not the Hub's file ({problem}; a "
                "damaged disk, or two downloads at once where locks do nothing, "
                f"huggingface_hub #4306){_removed(removed)}",
                "",
            )
        problem, fix = why
        fix = f"; {fix}" if fix else ""
        out.parent.mkdir(parents=True, exist_ok=True)
        folder = private_folder.enter_context(
            tempfile.TemporaryDirectory(prefix=f".{out.name}.hf-cache-", dir=out.parent)
        )
        try:
            cached = download(folder)
        except Exception as err:
            raise RuntimeError(
                f"could not download {where}: {problem}, and the download into a "
                f"private folder failed too ({reason(err)}){fix}"
            ) from err
        damage = _install(cached, out, etag, where)
        if damage is not None:
            raise RuntimeError(
                f"could not download {where}: {problem}, and the download into a "
                f"private folder is not the Hub's file either ({damage[0]}): the "
                f"server or a proxy on the way to it changes the file; try again "
                f"later or from another network"
            )
        print(
            f"notice: {problem}; {filename} is downloaded into a private folder "
            f"for this run instead{fix}"
        )
    return out


class _NotTheHubs(Exception):
    """A copy whose hash is not the Hub's etag (`_install`)."""


def _removed(paths: list[Path]) -> str:
    return f"; removed {', '.join(map(str, paths))}" if paths else ""


def _install(
    cached: str, out: Path, etag: str | None, where: str
) -> tuple[str, os.stat_result] | None:
    """
    Copy the cached checkpoint to `out`, checking on the way that its bytes are the
    Hub's (`etag`; offline, the blob's name) and after it that it is a checkpoint.
    Returns None when `out` is written, or (what differs, the stat of the file read)
    when the bytes are not the Hub's (`out` is not written).

    Raises
    ------
    RuntimeError
        When the file is not a readable checkpoint, or holds no ``model_state_dict``.
    """
    import torch

    etag = etag or Path(os.path.realpath(cached)).name
    try:
        with atomic_path(out) as tmp:
            problem, read, checked = hub.copy_verified(cached, tmp, etag)
            if problem is not None:
                raise _NotTheHubs(problem, read)
            try:
                ckpt = torch.load(tmp, map_location="cpu", weights_only=False)
            except Exception as err:
                what_to_do = (
                    f": the Hub's file itself ({checked} checked)"
                    if checked
                    else f"; delete {cached} from the Hugging Face cache and try again"
                )
                raise RuntimeError(
                    f"{where} is not a readable checkpoint ({type(err).__name__}: "
                    f"{err}){what_to_do}"
                ) from err
            if not isinstance(ckpt, dict) or "model_state_dict" not in ckpt:
                raise RuntimeError(f"{where} holds no 'model_state_dict'")
    except _NotTheHubs as damage:
        return damage.args
    return None


def _unwritable_cache_file(err: PermissionError, cache: Path) -> tuple[str, str] | None:
    """
    For a ``PermissionError`` on a file inside the Hugging Face cache `cache` (its
    lock files above all, see `fetch_checkpoint`), what to say of it (the file, its
    owner and mode) and the fix; None for one elsewhere.
    """
    if not err.filename:
        return None
    path = Path(os.path.abspath(err.filename))
    if not path.is_relative_to(os.path.abspath(cache)):
        return None
    try:
        import pwd

        st = path.stat()
        owner = pwd.getpwuid(st.st_uid).pw_name
        held = f"{owner}, {stat.filemode(st.st_mode)}"
    except (OSError, KeyError, ImportError):
        owner = held = "its owner"
    problem = (
        f"the Hugging Face cache {cache} holds {path} ({held}), which this user "
        f"cannot write ({err.strerror})"
    )
    fix = (
        f"to share the cache again, ask {owner} to run `chmod g+w {path}` (a shared "
        "cache wants `umask 002` of every member), or set HF_HUB_CACHE to a folder "
        "of your own"
    )
    return problem, fix


def _valid_zip(path: Path) -> str | None:
    """None if `path` is a zip whose members all pass their CRC check, else why not."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (OSError, zipfile.BadZipFile) as err:
        return f"{type(err).__name__}: {err}"
    return None if bad is None else f"BadZipFile: corrupt member {bad}"


def _settle_partial(part: Path, out: Path, expected_bytes: int | None) -> str | None:
    """
    What a partial download left by an earlier attempt becomes before any request:
    kept to be resumed (shorter than expected), renamed to `out` (complete and a valid
    zip: killed between the last byte and the rename), or deleted (empty, longer than
    expected, complete but corrupt). Returns a line saying what was done, or None.
    """
    if not part.exists():
        return None
    size = part.stat().st_size
    if size == 0:
        part.unlink()
        return f"{part}: empty partial download deleted"
    if expected_bytes is None or size < expected_bytes:
        return f"{part}: {size} bytes, resumed"
    if size == expected_bytes:
        problem = _valid_zip(part)
        if problem is None:
            part.replace(out)
            return f"{part}: complete and a valid zip, renamed to {out.name}"
        part.unlink()
        return f"{part}: complete size but not a valid zip ({problem}): deleted"
    part.unlink()
    return f"{part}: {size} bytes, longer than the archive's {expected_bytes}: deleted"


def _archive_problem(path: Path, expected_bytes: int | None) -> str | None:
    """None if `path` has the published size (when known) and is a zip whose
    members all pass their CRC check, else why not.
    """
    size = path.stat().st_size
    if expected_bytes is not None and size != expected_bytes:
        return f"{size} bytes, not the published {expected_bytes}"
    return _valid_zip(path)


def _say(notes: list[str | None]) -> None:
    """Print the lines of `notes` that are not None, if any."""
    for note in filter(None, notes):
        print(note)


def _transfer_stopped(err: BaseException, stall_s: float) -> str | None:
    """
    What a failed transfer of upstream's `download_file` was, in words, if it
    stopped on the way (no bytes for `stall_s`, the connection closed, fewer bytes
    than the published size: tried again); None for other errors (an HTTP error, no
    such host, a corrupt archive).
    """
    from urllib.error import HTTPError, URLError

    if isinstance(err, HTTPError):
        return None
    if isinstance(err, URLError):
        err = err.reason if isinstance(err.reason, BaseException) else err
    if isinstance(err, TimeoutError):  # socket_deadline's
        return f"no bytes for {stall_s:g} s"
    if isinstance(err, (HTTPException, ConnectionError)):
        return f"{type(err).__name__}: {err}"
    # upstream's check of the size: "<url>: <n> bytes, expected <m>"
    words = str(err).rsplit(": ", 1)[-1].split()
    if (
        len(words) == 4
        and words[0].isdigit()
        and words[3].isdigit()
        and int(words[0]) < int(words[3])
    ):
        return f"cut short: {err}"
    return None


def download_tinyimagenet_archive(
    out: str | Path,
    urls=TINYIMAGENET_URLS,
    expected_bytes: int | None = None,
    stall_s: float | None = None,
) -> Path:
    """
    Download TinyImageNet's archive to `out`, trying `urls` in order, with upstream's
    `download_file` (an interrupted transfer is resumed from ``<out>.part`` when the
    server allows it, else redone; the file gets its final name only at the expected
    size), then check it is a valid zip.

    An archive already at `out` is checked the same way (its size against
    `expected_bytes`, the CRC-32 of every member: upstream publishes no checksum of
    the whole archive); one that fails is removed, with a notice, and downloaded
    again. A partial download ``<out>.part`` in any state ends in a checked archive
    or in a message naming it: empty, longer than `expected_bytes`, or complete but
    corrupt, it is deleted; complete and valid (a job killed before the rename), it
    is renamed without a request; shorter, it is resumed, and redone from the start
    when the server refuses the range (HTTP 416) or the resumed archive is corrupt.

    Every transfer has a deadline on progress: no bytes for `stall_s` seconds (by
    default ``MULTIGEOM_DOWNLOAD_STALL_S``, else 300; `hub.socket_deadline`, since
    upstream's `urlopen` is given no timeout), and it is stopped. A transfer that
    stalls, breaks off or ends short is tried again from where it stopped, with a
    notice; the third such end stops the download.

    Raises
    ------
    RuntimeError
        When no URL gives a valid archive, or transfers stopped three times: one
        line with each URL's error, what to set, and the partial file left (if any)
        with what to do. A corrupt or truncated archive is deleted.
    """
    from urllib.error import HTTPError

    from multigeom.datasets.download import download_file

    stall_s = hub.stall_seconds(stall_s)
    out = Path(out)
    part = out.with_name(out.name + ".part")
    notes = [_settle_partial(part, out, expected_bytes)]
    if out.exists():
        problem = _archive_problem(out, expected_bytes)
        if problem is None:
            _say(notes)
            return out
        out.unlink()
        print(f"notice: {out}: {problem}; removed, and downloaded again")
    errors, stops = [], []
    for url in urls:
        attempt = "resume"
        while True:
            resumed = part.exists() and part.stat().st_size > 0
            try:
                with hub.socket_deadline(stall_s):
                    download_file(url, out, expected_bytes)
                problem = _valid_zip(out)
                if problem is not None:
                    raise zipfile.BadZipFile(problem)
                _say(notes)
                return out
            except (OSError, HTTPException, zipfile.BadZipFile) as err:
                # URLError is an OSError; a transfer cut short is an IncompleteRead
                out.unlink(missing_ok=True)
                stopped = _transfer_stopped(err, stall_s)
                if stopped is not None:
                    stops.append(f"{url}: {stopped}")
                    if len(stops) < len(hub.ATTEMPTS):
                        print(
                            f"notice: TinyImageNet: the transfer stopped ({stopped}), "
                            f"try {len(stops)} of {len(hub.ATTEMPTS)}; trying again"
                        )
                        continue
                    errors = [
                        f"the transfer stopped {len(stops)} times ("
                        + "; ".join(stops)
                        + f"); if the link is slow rather than stalled, set "
                        f"{hub.STALL_ENV} above {stall_s:g} s"
                    ]
                    break
                refused = isinstance(err, HTTPError) and err.code == 416
                corrupt = isinstance(err, zipfile.BadZipFile)
                if attempt == "resume" and resumed and (refused or corrupt):
                    # The server has no bytes after ours, or ours were not its own:
                    # start over from byte 0.
                    notes.append(f"{part}: {type(err).__name__}: {err}; redone")
                    part.unlink(missing_ok=True)
                    attempt = "anew"
                    continue
                errors.append(f"{url}: {type(err).__name__}: {err}")
                break
        if len(stops) >= len(hub.ATTEMPTS):
            break
    left = ""
    if part.exists():
        left = (
            f"; the partial download {part} ({part.stat().st_size} bytes) is kept: "
            "run again to resume it, or delete it to start over"
        )
    raise RuntimeError("could not download TinyImageNet: " + "; ".join(errors) + left)


def extract_member(archive: str | Path, member: str, out: str | Path) -> Path:
    """
    Copy one member of a zip archive to `out`, atomically.

    Raises
    ------
    KeyError
        If the archive has no such member (the message names both).
    """
    with zipfile.ZipFile(archive) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise KeyError(f"{archive} has no member {member}") from None
        with z.open(info) as src, atomic_path(out) as tmp, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return Path(out)


def torch_hub_checkpoints_dir() -> Path:
    """
    Torchvision's weight cache, ``<torch hub dir>/checkpoints``, found as
    `torch.hub.get_dir` finds it ($TORCH_HOME, else $XDG_CACHE_HOME/torch, else
    ~/.cache/torch; then ``hub``) without importing torch.
    """
    home = os.environ.get("TORCH_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch"
    )
    return Path(os.path.expanduser(home)) / "hub" / "checkpoints"


def missing_backbone_weights(encoder: str) -> tuple[Path, str] | None:
    """
    For an encoder with an ImageNet backbone from torchvision, (its weight file, a
    command that caches it) if the file is not in torchvision's cache; else None.
    """
    if encoder not in BACKBONE_WEIGHTS:
        return None
    name, command = BACKBONE_WEIGHTS[encoder]
    path = torch_hub_checkpoints_dir() / name
    return None if path.is_file() else (path, command)
