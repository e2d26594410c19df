"""
Fetching the paper's inputs: the published checkpoints from the Hugging Face Hub, the
TinyImageNet test images, and the check that torchvision's backbone weights are cached.

* Checkpoints: ``encoders/<enc>/<area>/best_model.pt`` and
  ``diffusion/<enc>/<area>/final_model.pt`` of the Hub repository upstream uses
  (`HUB_REPO`), downloaded with `huggingface_hub.hf_hub_download` (its cache, an
  optional revision, ``HF_TOKEN`` when set, ``HF_ENDPOINT`` for another server), then
  copied into upstream's run layout.
* TinyImageNet: the archive is downloaded with upstream's
  `multigeom.datasets.download.download_file` (resumes an interrupted transfer, checks
  the size), checked as a zip, and only the test images the run needs are extracted,
  one file per job.

Every file appears complete or not at all (`multigeom_workflow.atomic.atomic_path`).
A shared Hugging Face cache that this user cannot write (a lab's ``HF_HOME`` holding
another member's lock file without group write, huggingface_hub #2580) does not stop
the run: the checkpoint is downloaded into a private folder, with one notice naming
the file and the fix (`fetch_checkpoint`).
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
) -> Path:
    """
    Download a published checkpoint into the Hugging Face cache and copy it to `out`.

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

    Returns
    -------
    Path
        `out`, a file that `torch.load` reads and that holds ``model_state_dict``.

    Raises
    ------
    RuntimeError
        One line naming the file, the repository and the server's answer (missing file,
        no access, no network), or a download that is not a checkpoint. Nothing is
        written to `out` then.

    Notes
    -----
    A cache this user cannot write. huggingface_hub takes a lock before it downloads
    a file into its cache, ``<cache>/.locks/<repo folder>/<etag>.lock``
    (`huggingface_hub.file_download._hf_hub_download_to_cache_dir`, 0.36), with
    filelock's `FileLock`, which opens an existing lock file for writing and raises
    ``PermissionError`` when it cannot (filelock 4.3, ``_native/_unix.py``). In a
    lab's shared ``HF_HOME`` the file is another member's, made without group write
    (umask 022): every other member's download of that file fails, and a retry fails
    the same way (huggingface_hub #2580). huggingface_hub has no setting for another
    lock folder, so a private lock folder means a private cache: on a
    ``PermissionError`` on a file inside the cache, the checkpoint is downloaded again
    into a private folder next to `out` (removed once `out` is written), and one
    ``notice:`` line names the file, its owner and the fix (its owner runs
    ``chmod g+w`` on it; or ``HF_HUB_CACHE`` set to a folder of one's own). Chosen
    over stopping with that line because the run then ends with its checkpoints
    rather than on a colleague's file mode, the shared cache is left untouched, and
    no second cache grows (the run keeps its copy in the run layout anyway); the
    cost is one download the shared cache might have saved. If the private download
    fails too, the error says both.
    """
    import torch
    from huggingface_hub import constants, hf_hub_download

    filename = hub_filename(kind, encoder, area)
    where = f"{filename} of {repo_id}" + (f"@{revision}" if revision else "")
    where += f" on {endpoint or constants.ENDPOINT}"
    shared = Path(cache_dir or constants.HF_HUB_CACHE)
    out = Path(out)

    def download(cache) -> str:
        return hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            endpoint=endpoint,
            cache_dir=cache,
            token=os.environ.get("HF_TOKEN") or None,
        )

    with contextlib.ExitStack() as private_folder:
        unwritable = None  # (the cache's file this user cannot write, the fix)
        try:
            try:
                cached = download(cache_dir)
            except PermissionError as err:
                unwritable = _unwritable_cache_file(err, shared)
                if unwritable is None:
                    raise
                out.parent.mkdir(parents=True, exist_ok=True)
                folder = private_folder.enter_context(
                    tempfile.TemporaryDirectory(
                        prefix=f".{out.name}.hf-cache-", dir=out.parent
                    )
                )
                cached = download(folder)
        except Exception as err:  # huggingface_hub's and the network's errors alike
            reason = f"{type(err).__name__}: " + " ".join(str(err).split())[:300]
            if unwritable:
                problem, fix = unwritable
                reason = (
                    f"{problem}, and the download into a private folder failed too "
                    f"({reason}); {fix}"
                )
            raise RuntimeError(f"could not download {where}: {reason}") from err
        if unwritable:
            problem, fix = unwritable
            print(
                f"notice: {problem}; {filename} is downloaded into a private folder "
                f"for this run instead; {fix}"
            )
        try:
            ckpt = torch.load(cached, map_location="cpu", weights_only=False)
        except Exception as err:
            what_to_do = (
                ""
                if unwritable
                else f"; delete {cached} from the Hugging Face cache and try again"
            )
            raise RuntimeError(
                f"{where} is not a readable checkpoint ({type(err).__name__}: "
                f"{err}){what_to_do}"
            ) from err
        if not isinstance(ckpt, dict) or "model_state_dict" not in ckpt:
            raise RuntimeError(f"{where} holds no 'model_state_dict'")
        with atomic_path(out) as tmp:
            shutil.copyfile(cached, tmp)
    return out


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


def download_tinyimagenet_archive(
    out: str | Path, urls=TINYIMAGENET_URLS, expected_bytes: int | None = None
) -> Path:
    """
    Download TinyImageNet's archive to `out`, trying `urls` in order, with upstream's
    `download_file` (an interrupted transfer is resumed from ``<out>.part`` when the
    server allows it, else redone; the file gets its final name only at the expected
    size), then check it is a valid zip.

    A partial download ``<out>.part`` in any state ends in a checked archive or in a
    message naming it: empty, longer than `expected_bytes`, or complete but corrupt, it
    is deleted; complete and valid (a job killed before the rename), it is renamed
    without a request; shorter, it is resumed, and redone from the start when the
    server refuses the range (HTTP 416) or the resumed archive is corrupt.

    Raises
    ------
    RuntimeError
        When no URL gives a valid archive: one line per URL with its error, and the
        partial file left (if any) with what to do. A corrupt or truncated archive is
        deleted.
    """
    from urllib.error import HTTPError

    from multigeom.datasets.download import download_file

    out = Path(out)
    part = out.with_name(out.name + ".part")
    notes = [_settle_partial(part, out, expected_bytes)]
    if out.exists() and _valid_zip(out) is None:
        print(*filter(None, notes), sep="\n")
        return out
    errors = []
    for url in urls:
        for attempt in ("resume", "anew"):
            resumed = part.exists() and part.stat().st_size > 0
            try:
                download_file(url, out, expected_bytes)
                problem = _valid_zip(out)
                if problem is not None:
                    raise zipfile.BadZipFile(problem)
                print(*filter(None, notes), sep="\n")
                return out
            except (OSError, HTTPException, zipfile.BadZipFile) as err:
                # URLError is an OSError; a transfer cut short is an IncompleteRead
                out.unlink(missing_ok=True)
                refused = isinstance(err, HTTPError) and err.code == 416
                corrupt = isinstance(err, zipfile.BadZipFile)
                if attempt == "resume" and resumed and (refused or corrupt):
                    # The server has no bytes after ours, or ours were not its own:
                    # start over from byte 0.
                    notes.append(f"{part}: {type(err).__name__}: {err}; redone")
                    part.unlink(missing_ok=True)
                    continue
                errors.append(f"{url}: {type(err).__name__}: {err}")
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
