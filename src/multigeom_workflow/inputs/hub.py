"""
Downloads from the Hugging Face Hub that never hang a run or poison its cache: the
guards around `huggingface_hub.hf_hub_download` that `fetch.fetch_checkpoint` uses.

* A deadline on progress (`download`): each try runs in a child process watched from
  here; no new bytes of the file for `stall_seconds` (default 300 s, environment
  variable ``MULTIGEOM_DOWNLOAD_STALL_S``) and the child is killed. A transfer that
  stalls or breaks is tried again (resumed from huggingface_hub's ``.incomplete``
  file), the third time with Xet disabled; a third failure ends with one line.
* Lock files (`check_locks`): before each try, a lock file of the repository in the
  cache that no live process on this machine holds, and that would block (a file
  system without ``flock``), is removed with one notice; one held by a live process
  is named, with how long it is waited for.
* Verification (`copy_verified`, `remove_damaged`): the cached file is hashed while it
  is copied out and compared with the Hub's etag (SHA-256 for LFS files, the git blob
  SHA-1 for others), which is also the blob's name in the cache.

References
----------
huggingface_hub 0.36, ``file_download.py`` (`hf_hub_download`,
`_hf_hub_download_to_cache_dir`, `http_get`), ``utils/_fixes.py`` (`WeakFileLock`),
``utils/_runtime.py`` (`is_xet_available`); filelock 4.3, ``_soft/_records.py``
(lock markers). Reports: huggingface_hub #2543 (a killed download's lock blocks every
later one), #4306 (two downloads append to one partial file where ``flock`` lies);
xet-core #800, #883 (Xet transfers that stall).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..processes import alive

__all__ = [
    "ATTEMPTS",
    "DEFAULT_STALL_S",
    "STALL_ENV",
    "STARTUP_S",
    "ChildError",
    "DamagedTransfer",
    "Holder",
    "HubFile",
    "LockStillHeld",
    "TransferFailed",
    "check_locks",
    "copy_verified",
    "download",
    "file_metadata",
    "remove_damaged",
    "socket_deadline",
    "stall_seconds",
]

#: The environment variable that sets the deadline on progress, in seconds.
STALL_ENV = "MULTIGEOM_DOWNLOAD_STALL_S"
#: Its default: five minutes without a byte.
DEFAULT_STALL_S = 300.0
#: Seconds a child process may take to start (import huggingface_hub) before its
#: deadline on progress begins, at least; 1.7-1.9 s on a loaded 2-core machine.
STARTUP_S = 60.0
#: Tries of one download: with Xet (huggingface_hub's default), again, then without.
ATTEMPTS = (True, True, False)
#: Bytes huggingface_hub's `http_get` reads per chunk in the child (its default,
#: ``constants.DOWNLOAD_CHUNK_SIZE``, is 10 MiB: one write per 10 MiB, so a slow link
#: would show no progress on disk for minutes).
CHILD_CHUNK_BYTES = 1 << 20
_CHILD = "from multigeom_workflow.inputs.hub import _child; _child()"
#: The child runs the binary this process runs, named as this process names it
#: (``sys.executable`` as its ``argv[0]``, where Python finds its virtual environment):
#: a path to it may be one this user cannot follow (an interpreter under another
#: user's home, run through a link), while the running binary can always be run again.
_SELF = "/proc/self/exe"


def stall_seconds(value: float | None = None) -> float:
    """
    The deadline on progress of every download, in seconds.

    Parameters
    ----------
    value : float, optional
        Given by the caller; else ``MULTIGEOM_DOWNLOAD_STALL_S``, else
        `DEFAULT_STALL_S` (300 s).

    Returns
    -------
    float
        Seconds without a new byte after which a transfer is stopped.

    Raises
    ------
    ValueError
        One line, when the value is not a number of seconds above 0.
    """
    given = value
    if value is None:
        given = os.environ.get(STALL_ENV, "").strip()
        if not given:
            return DEFAULT_STALL_S
    try:
        seconds = float(given)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"{STALL_ENV} must be a number of seconds above 0 (default "
            f"{DEFAULT_STALL_S:g}), not {given!r}"
        )
    return seconds


@contextlib.contextmanager
def socket_deadline(seconds: float):
    """
    Every socket made in the block waits at most `seconds` for one operation (a
    connect, a read of any size): ``socket.setdefaulttimeout``, which `urllib` uses
    when it is given no timeout. A stalled read raises ``TimeoutError``.
    """
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)


@dataclass(frozen=True)
class HubFile:
    """What the Hub says of a file: its etag (for LFS files the SHA-256 of its bytes,
    for others the git blob SHA-1) and its size in bytes.
    """

    etag: str
    size: int | None


def file_metadata(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    endpoint: str | None = None,
    token: str | None = None,
) -> tuple[HubFile | None, Exception | None]:
    """
    The Hub's etag and size of a file: one HEAD request, huggingface_hub's
    `get_hf_file_metadata` (which tries a refused or timed-out connection five times,
    waiting 1 to 8 s between, ``utils/_http.py`` `http_backoff`).

    Returns
    -------
    meta : HubFile or None
        None when the Hub gave none.
    offline : Exception or None
        The error when the Hub could not be reached at all (no network: what
        `hf_hub_download` then answers from its cache, ``file_download.py``
        `_get_metadata_or_catch_error`); None otherwise (another error, no such file
        or no access: `download` meets it again and says it).
    """
    import requests
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import OfflineModeIsEnabled

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(
            url, token=token, timeout=constants.HF_HUB_ETAG_TIMEOUT, endpoint=endpoint
        )
    except (requests.exceptions.SSLError, requests.exceptions.ProxyError):
        return None, None
    except (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        OfflineModeIsEnabled,
    ) as err:
        return None, err
    except Exception:
        return None, None
    return (HubFile(meta.etag, meta.size) if meta.etag else None), None


@dataclass(frozen=True)
class Holder:
    """Who holds a lock file: a process id, its user and command, and the host it
    runs on (None: this machine).
    """

    pid: int | None
    user: str | None = None
    command: str | None = None
    host: str | None = None

    def __str__(self) -> str:
        if self.host is not None:
            if self.pid and self.host:
                return f"process {self.pid} on {self.host} (another machine)"
            return "a process on another machine"
        details = ", ".join(filter(None, (self.user, self.command)))
        return f"process {self.pid}" + (f" ({details})" if details else "")


class ChildError(RuntimeError):
    """An error of huggingface_hub in the child process, named by its class there
    (`name`); its text is the child's.
    """

    def __init__(self, info: dict):
        super().__init__(info.get("message", ""))
        self.name = info.get("type", "Error")
        self.info = info


class TransferFailed(RuntimeError):
    """Three tries of a download stalled or broke; the text says each."""


class DamagedTransfer(RuntimeError):
    """A download ended with a file that is not the Hub's (huggingface_hub's size
    check failed, or its partial file was longer than the file): two writers of one
    partial file where locks do nothing (huggingface_hub #4306).
    """


class LockStillHeld(RuntimeError):
    """The lock file of the download is held by a live process whose own download
    made no progress for the deadline.
    """

    def __init__(self, lock: Path, holder: Holder, stall_s: float):
        super().__init__(
            f"{lock} is held by {holder}, whose download made no progress for "
            f"{stall_s:g} s"
        )
        self.lock, self.holder = lock, holder


def _this_host() -> str:
    """
    The name of this machine as filelock writes it in a lock marker: the host name,
    and the process id namespace when it is not the first (filelock 4.3
    ``_identity/_host.py``, `host_name`, without its escaping of odd characters).
    """
    name = socket.gethostname()
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return name
    return name if namespace == 0xEFFFFFFC else f"{name}?pidns-{namespace:x}"


def _marker(content: str) -> tuple[int, str] | None:
    """(pid, host) written in a soft lock marker, in filelock 4.3's two formats
    (``_soft/_records.py``: ``filelock/2`` then ``key=value`` lines, or the older
    ``<pid>``, ``<host>``, ``[<start>]`` lines); None for an empty or unreadable marker.
    """
    lines = content.splitlines()
    if lines[:1] == ["filelock/2"]:
        fields = dict(line.partition("=")[::2] for line in lines[1:])
        pid, host = fields.get("pid", ""), fields.get("host", "")
    elif len(lines) in (2, 3):
        pid, host = lines[0], lines[1]
    else:
        return None
    return (int(pid), host) if pid.isdigit() and host else None


def _process(pid: int) -> Holder:
    """A live process of this machine, with its user and command name."""
    user = command = None
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{pid}/comm").read_text().strip()
    with contextlib.suppress(OSError, KeyError, ValueError, ImportError):
        import pwd

        status = Path(f"/proc/{pid}/status").read_text()
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
        user = pwd.getpwuid(uid).pw_name
    return Holder(pid, user, command)


def _flock_holders(st: os.stat_result) -> list[int]:
    """
    Processes of this machine holding a lock on the file of `st`, from
    ``/proc/locks`` (``<n>: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> ...``):
    those whose device and inode match, else those whose inode does (an overlay
    mount's files may name another device there than `os.stat` gives).
    """
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    exact, inode = [], []
    for line in lines:
        parts = line.split()
        if "->" in parts or len(parts) < 6 or not parts[4].isdigit():
            continue  # a process waiting for a lock, or not a line of a lock
        dev, _, ino = parts[5].rpartition(":")
        if ino == str(st.st_ino):
            (exact if dev == device else inode).append(int(parts[4]))
    return exact or inode


def _opened_by(path: Path) -> list[int]:
    """Other processes of this machine that have `path` open (those whose
    ``/proc/<pid>/fd`` this user may read: its own, or all for root).
    """
    target = os.path.realpath(path)
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                pids.append(pid)
    return pids


def _lock_state(lock: Path) -> tuple[str, Holder | None]:
    """
    ``("idle", None)``: nobody holds `lock` and it blocks nobody (``flock`` works
    here, and the file is only where the lock is taken); ``("held", holder)``;
    ``("stale", None)``: a marker of a file system without ``flock`` (huggingface_hub
    falls back to filelock's `SoftFileLock`, whose marker's existence is the lock)
    that no live process on this machine holds.
    """
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "idle", None  # gone, or not ours to read: huggingface_hub says so
    try:
        st = os.fstat(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pids = _flock_holders(st)
                return "held", _process(pids[0]) if pids else Holder(None, host="")
            if err.errno != errno.ENOSYS:
                return "idle", None
        else:
            return "idle", None  # closing the descriptor releases the probe's lock
        content = os.read(fd, 1025).decode("utf-8", "replace")
    finally:
        os.close(fd)
    marker = _marker(content)
    if marker is not None:
        pid, host = marker
        if host != _this_host():
            return "held", Holder(pid, host=host)
        return ("held", _process(pid)) if alive(pid) else ("stale", None)
    pids = _opened_by(lock)
    return ("held", _process(pids[0])) if pids else ("stale", None)


def check_locks(lock_dir: Path, own: Path | None) -> tuple[list[Path], Holder | None]:
    """
    Remove the stale lock files of one repository's lock folder in a Hugging Face
    cache (``<cache>/.locks/models--<owner>--<name>``), and say who holds `own`.

    Returns
    -------
    removed : list of Path
        The lock files removed: markers of a file system without ``flock`` that no
        live process on this machine holds, left by a killed download (filelock 4.3
        breaks a marker that names a dead process itself, never an empty one;
        huggingface_hub's `WeakFileLock` then waits forever, #2543).
    holder : Holder or None
        Who holds `own` (the lock of the file to download), if anyone.
    """
    removed, holder = [], None
    for lock in sorted(Path(lock_dir).glob("*.lock")):
        state, who = _lock_state(lock)
        if state == "stale":
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
                removed.append(lock)
        elif state == "held" and own is not None and lock == Path(own):
            holder = who
    return removed, holder


def _describe(err: BaseException) -> dict:
    """An exception of the child as JSON: its class (and its bases'), text, the
    fields of an OSError, and the HTTP status of a response it or its cause holds.
    """
    info = {
        "type": type(err).__name__,
        "mro": [c.__name__ for c in type(err).__mro__],
        "message": " ".join(str(err).split())[:600],
    }
    if isinstance(err, OSError):
        info.update(errno=err.errno, strerror=err.strerror, filename=err.filename)
    for e in (err, err.__cause__):
        response = getattr(e, "response", None)
        if response is not None and getattr(response, "status_code", None):
            info["status"] = response.status_code
            break
    if err.__cause__ is not None:
        info["cause"] = [c.__name__ for c in type(err.__cause__).__mro__]
    return info


def _child() -> None:
    """
    One try of a download, in a child process (`download`): its arguments for
    `hf_hub_download` as JSON in ``sys.argv[1]``; writes ``started`` once imports are
    done, then one JSON line, ``{"path": ...}`` or the error (`_describe`).
    """
    args = json.loads(sys.argv[1])
    from huggingface_hub import constants, hf_hub_download

    constants.DOWNLOAD_CHUNK_SIZE = CHILD_CHUNK_BYTES  # read by http_get at each call
    print("started", flush=True)
    try:
        path = hf_hub_download(**args, token=os.environ.get("HF_TOKEN") or None)
    except BaseException as err:
        print(json.dumps(_describe(err)), flush=True)
        sys.exit(1)
    print(json.dumps({"path": path}), flush=True)


def _snapshot(blobs: Path, etag: str | None) -> tuple:
    """What tells progress: the size and time of the file's partial download and
    blob (all the repository's blobs when the etag is unknown).
    """
    names = [f"{etag}.incomplete", etag] if etag else None
    try:
        paths = [blobs / n for n in names] if names else sorted(blobs.iterdir())
    except OSError:
        return ()
    seen = []
    for path in paths:
        with contextlib.suppress(OSError):
            st = path.stat()
            seen.append((path.name, st.st_size, st.st_mtime_ns))
    return tuple(seen)


def _run_child(args: dict, *, xet: bool, blobs: Path, etag, stall_s: float):
    """
    Run one try (`_child`) and watch it: killed when no progress (`_snapshot`) was
    seen for `stall_s` seconds after it started. Returns ``("stalled", None)``,
    ``("ok", path)`` or ``("error", info)``; the child's standard error is passed on
    to this process's.
    """
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"  # read by huggingface_hub at its import
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(args)],
            executable=_SELF if os.path.exists(_SELF) else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            start_new_session=True,  # its own process group, killed whole
        )
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        poll = min(0.2, stall_s / 10)
        last, moved, started, stalled = _snapshot(blobs, etag), time.monotonic(), 0, 0
        while True:
            try:
                proc.wait(timeout=poll)
                break
            except subprocess.TimeoutExpired:
                pass
            now, seen = time.monotonic(), _snapshot(blobs, etag)
            if not started and "started\n" in lines:
                started, moved = 1, now
            if seen != last:
                last, moved = seen, now
            if now - moved > (stall_s if started else max(stall_s, STARTUP_S)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                stalled = 1
                break
        reader.join()
        err.seek(0)
        sys.stderr.write(err.read())
    if stalled:
        return "stalled", None
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if "path" in result:
        return "ok", result["path"]
    exit_code = {
        "type": "ChildExit",
        "mro": ["ChildExit"],
        "message": f"the download's process ended with code {proc.returncode}",
    }
    return "error", result or exit_code


#: Classes of errors in the child that mean the transfer broke off (requests',
#: urllib3's, http.client's and the builtin ones): tried again.
_BROKEN = {"ChunkedEncodingError", "ConnectionError", "ReadTimeout", "IncompleteRead"}


def _kind(info: dict) -> str:
    """What an error of the child means: ``broken`` (try again), ``damaged`` (the
    partial file is not the Hub's) or ``fatal``.
    """
    names = set(info.get("mro", [])) | set(info.get("cause", []))
    status = info.get("status")
    message = info.get("message", "")
    # huggingface_hub 0.36 http_get: "Consistency check failed: file should be of
    # size N but has size M"; a partial file longer than the file: HTTP 416 on resume.
    if "Consistency check failed" in message or status == 416:
        return "damaged"
    # The partial file moved away by another download of it (shutil.move in
    # _chmod_and_move), where locks do nothing.
    filename = info.get("filename") or ""
    if "FileNotFoundError" in names and filename.endswith(".incomplete"):
        return "damaged"
    if names & {"SSLError", "ProxyError"}:  # the same at every try
        return "fatal"
    # A child that died without a word (killed, or a crash in hf_xet's Rust code)
    # is tried again like a broken transfer: the third try is without Xet.
    if names & _BROKEN or status in (429, 500, 502, 503, 504) or "ChildExit" in names:
        return "broken"
    return "fatal"


def _raise_child_error(info: dict) -> None:
    if info.get("type") == "PermissionError":
        raise PermissionError(info.get("errno"), info.get("strerror"), info["filename"])
    raise ChildError(info)


def download(
    repo_id: str,
    filename: str,
    cache_dir: str | Path,
    *,
    revision: str | None = None,
    endpoint: str | None = None,
    etag: str | None = None,
    offline: bool = False,
    stall_s: float,
    say=print,
) -> str:
    """
    `hf_hub_download` into `cache_dir`, tried up to three times in a child process
    each, with a deadline on progress.

    Parameters
    ----------
    repo_id, filename, revision, endpoint
        As `hf_hub_download` takes them; ``HF_TOKEN`` is sent when set.
    cache_dir : str or Path
        The Hugging Face cache to download into.
    etag : str, optional
        The Hub's etag of the file (`file_metadata`): progress is then that file's,
        and its lock is checked; without it, any blob of the repository counts.
    offline : bool
        The Hub could not be reached (`file_metadata`): the cached file or an error,
        without asking the Hub again (``local_files_only``).
    stall_s : float
        Seconds without a new byte after which a try is stopped (`stall_seconds`).
    say : callable
        Where notices go (one line each): stale locks removed, a lock held, a try
        stopped.

    Returns
    -------
    str
        The cached file (huggingface_hub's pointer in ``snapshots/``).

    Raises
    ------
    TransferFailed
        Three tries stalled or broke off (the second stall or break is followed by a
        try with Xet disabled, as ``HF_HUB_DISABLE_XET=1`` does).
    LockStillHeld
        A live process holds the file's lock and its download made no progress for
        `stall_s`: the caller downloads elsewhere.
    DamagedTransfer
        The download ended with a file that is not the Hub's.
    PermissionError
        huggingface_hub's, on a file of the cache this user cannot write.
    ChildError
        Any other error of huggingface_hub (no such file, no access, no network).

    Notes
    -----
    Why a child process: huggingface_hub's HTTP path has a read timeout (10 s,
    ``HF_HUB_DOWNLOAD_TIMEOUT``, then 5 resumed tries), but its Xet path, the default
    since hf-xet is installed, has none (xet-core #800, #883), and a call into Rust
    cannot be interrupted from Python; a child can be killed. Xet is disabled per try
    in the child's environment, because huggingface_hub reads ``HF_HUB_DISABLE_XET``
    into ``constants`` at its import (``constants.py``; `is_xet_available` in
    ``utils/_runtime.py``). Progress is the growth of ``blobs/<etag>.incomplete``
    (where `http_get` and `xet_get` write), another process's download of the same
    file included (this try then waits for its lock): the child reads 1 MiB at a time
    (`CHILD_CHUNK_BYTES`), so a link slower than 1 MiB per `stall_s` counts as
    stalled.
    """
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache_dir = Path(cache_dir)
    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    lock_dir = cache_dir / ".locks" / folder
    own = lock_dir / f"{etag}.lock" if etag else None
    blobs = cache_dir / folder / "blobs"
    args = dict(
        repo_id=repo_id,
        filename=filename,
        revision=revision,
        endpoint=endpoint,
        cache_dir=str(cache_dir),
        local_files_only=offline,
    )
    attempts = (False,) * 3 if constants.HF_HUB_DISABLE_XET else ATTEMPTS
    failures: list[str] = []
    told = None
    for i, xet in enumerate(attempts):
        removed, holder = check_locks(lock_dir, own)
        if removed:
            say(
                f"notice: removed {len(removed)} stale lock file(s) of the Hugging "
                f"Face cache that no live process on this machine holds "
                f"({', '.join(map(str, removed))}): a killed download leaves them on a "
                "file system without flock, where they block every later download "
                "of the file (huggingface_hub #2543)"
            )
        if holder is not None and holder != told:
            say(
                f"notice: {own} is held by {holder}: waiting for its download of "
                f"{filename} while it makes progress, at most {stall_s:g} s without "
                f"any ({STALL_ENV}), then downloading into a private folder"
            )
            told = holder
        outcome, value = _run_child(
            args, xet=xet, blobs=blobs, etag=etag, stall_s=stall_s
        )
        if outcome == "ok":
            return value
        if outcome == "stalled":
            _, holder = check_locks(lock_dir, own)
            if holder is not None:
                raise LockStillHeld(own, holder, stall_s)
            what = f"no bytes for {stall_s:g} s"
        else:
            kind = _kind(value)
            if kind == "damaged":
                raise DamagedTransfer(f"{value['type']}: {value['message']}")
            if kind == "fatal":
                _raise_child_error(value)
            what = f"{value['type']}: {value['message']}"
        failures.append(what + ("" if xet else " (Xet disabled)"))
        if i + 1 < len(attempts):
            then = " with Xet disabled" if xet and not attempts[i + 1] else ""
            say(
                f"notice: {filename}: the transfer stopped ({what}), try {i + 1} of "
                f"{len(attempts)}; trying again{then}"
            )
    how = (
        "the last one with Xet disabled as HF_HUB_DISABLE_XET=1 does"
        if attempts[0]
        else "all with Xet disabled (HF_HUB_DISABLE_XET is set)"
    )
    raise TransferFailed(
        f"the transfer stopped {len(attempts)} times ({'; '.join(failures)}), {how}"
    )


def copy_verified(
    cached: str | Path, dest: str | Path, etag: str
) -> tuple[str | None, os.stat_result, str | None]:
    """
    Copy `cached` to `dest`, hashing the bytes on the way, and compare with the Hub's
    `etag`: SHA-256 for an LFS file (64 hex digits), the git blob SHA-1 for others
    (40 hex digits: SHA-1 of ``blob <size>``, a NUL byte and the bytes, as
    huggingface_hub's ``utils/sha.py`` `git_hash`).

    Returns
    -------
    problem : str or None
        None when the bytes are the Hub's, or when `etag` is neither kind of hash
        (another server's: nothing to compare with); else what differs, in words.
    stat : os.stat_result
        Of the file read (`remove_damaged` removes that one only).
    checked : str or None
        The hash compared (``SHA-256``, ``git SHA-1``), None when there was none.
    """
    with open(cached, "rb") as src, open(dest, "wb") as dst:
        st = os.fstat(src.fileno())
        if re.fullmatch(r"[0-9a-f]{64}", etag):
            kind, digest = "SHA-256", hashlib.sha256()
        elif re.fullmatch(r"[0-9a-f]{40}", etag):
            kind, digest = "git SHA-1", hashlib.sha1(f"blob {st.st_size}\0".encode())
        else:
            kind, digest = None, None
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            if digest is not None:
                digest.update(chunk)
    if digest is None or digest.hexdigest() == etag:
        return None, st, kind
    got = digest.hexdigest()
    return f"{kind} {got}, the Hub's {etag}; {st.st_size} bytes", st, kind


def remove_damaged(
    cached: str | Path | None,
    read: os.stat_result | None,
    blobs: Path,
    etag: str | None,
    size: int | None,
) -> list[Path]:
    """
    Remove from a Hugging Face cache what a damaged download left: the blob read as
    `read` (if it is still that file) and its pointer `cached`, and the partial file
    ``<etag>.incomplete`` when it is at least `size` bytes (it can never be resumed
    into the file) and no other process of this machine has it open. Returns what was
    removed.
    """
    removed = []
    if cached is not None and read is not None:
        blob = Path(os.path.realpath(cached))
        with contextlib.suppress(OSError):
            if os.path.samestat(blob.stat(), read):
                blob.unlink()
                removed.append(blob)
        if Path(cached).is_symlink():
            with contextlib.suppress(OSError):
                Path(cached).unlink()
    if etag:
        part = blobs / f"{etag}.incomplete"
        with contextlib.suppress(OSError):
            if (size is None or part.stat().st_size >= size) and not _opened_by(part):
                part.unlink()
                removed.append(part)
    return removed
