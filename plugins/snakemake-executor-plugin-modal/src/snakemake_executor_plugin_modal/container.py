"""
What runs inside the Modal container: stage the job's files from the volume, run the
command Snakemake formatted for the job, and put its results back on the volume.

Only the standard library and ``modal`` are used here, so the container needs nothing
but this module (added to the image as local Python source).

The job runs in a scratch folder of the container, not on the volume: a file appears on
the volume only once it is finished (written to a temporary name, then renamed, then
committed), so a job that is preempted or killed leaves no partial output there.

Finished work is not paid twice: beside each output committed to the volume, a marker
``.snakemake/modal/done/<output>@<key>`` records the key of the job that made it (a
hash of its rule, wildcards, parameters and input contents, computed by the
executor). A job of a group whose outputs are all on the volume with its own key is
left out of the command (``--target-jobs``), whether this is a retry, a rerun, or
Modal restarting a preempted input in a new container.

The command's output goes to the container's stdout (Modal's logs show it) and to the
job's log, which is committed to the volume with the outputs while the job runs.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

__all__ = [
    "DONE",
    "JOB_LOG",
    "PART",
    "TARGETS",
    "python_path",
    "remove_parts",
    "retried",
    "run_job",
]

#: Where, below the working directory, the container's log of a job is written.
JOB_LOG = ".snakemake/modal/{name}.log"
#: Folder of the markers of finished outputs (``<output>@<key>``) on the volume.
DONE = ".snakemake/modal/done"
#: What marks a part file (a copy to the volume not yet renamed into place).
PART = ".part-"
#: Stands in the command for the ``--target-jobs`` of the jobs left to run.
TARGETS = "@MODAL_TARGET_JOBS@"
#: Seconds waited before each new try of a job's last sync or commit that failed (a
#: ``Volume.commit`` refused: a conflict, a transient error): 4 tries more, 15 s in
#: all, before the job fails.
FINAL_RETRY_WAITS_S = (1.0, 2.0, 4.0, 8.0)


def run_job(spec: dict) -> dict:
    """
    Run one Snakemake job in this container.

    Parameters
    ----------
    spec : dict
        ``mount`` (where the volume is mounted), ``volume`` (its name), ``prefix``
        (this working directory's folder on the volume), ``stage`` (paths relative to
        the working directory to copy from the volume before the job: workflow sources
        and the job's inputs), ``command`` (the shell command), ``env`` (extra
        environment variables), ``outputs`` (``[path, key]`` pairs: the outputs of the
        job's rules, relative to the working directory, and the key Snakemake records
        them under), ``results`` (logs and benchmark files, copied once the command
        has ended), ``log`` (where to write the job's stdout and stderr),
        ``sync_every_s`` (seconds between commits of finished outputs while it runs),
        ``python_packages`` (the image's local packages: named on the command's
        ``PYTHONPATH``, see :func:`python_path`), and ``members`` (per job of the
        group: ``target``, its quoted
        ``--target-jobs`` entry; ``outputs``, its files; ``key``, the hash that a
        reusable output's marker must carry). The command holds :data:`TARGETS`
        where the entries of the jobs left to run go.

    Returns
    -------
    dict
        ``returncode`` (int), ``seconds`` (float, wall-clock of the command),
        ``started`` (float, epoch seconds when this function was entered: the end of
        the container's cold start),
        ``log_tail`` (str, the last 40 lines of the job's log), ``synced`` (outputs
        now on the volume), ``reused`` (outputs found finished on the volume).
    """
    entered = time.time()
    import modal

    volume = modal.Volume.from_name(spec["volume"])
    # The container mounts the volume as committed when it started, which may be
    # before this job's inputs were uploaded (Modal can hand an input to a
    # container started earlier): the latest committed state first ("Make latest
    # committed state of volume available in the running container":
    # ``_Volume.reload``, modal/volume.py; nothing is open on the volume yet).
    volume.reload()
    root = Path(spec["mount"]) / spec["prefix"]
    work = Path(tempfile.mkdtemp(prefix="snakemake-job-"))
    for rel in spec["stage"]:
        _copy(root / rel, work / rel)
    # part files of an earlier container of this job, killed mid-copy
    remove_parts(
        root, [*(rel for rel, _ in spec["outputs"]), *spec["results"], spec["log"]]
    )
    members = spec.get("members", [])
    keys = {rel: m["key"] for m in members for rel in m["outputs"]}
    done = [m for m in members if _finished(root, m)]
    todo = [m for m in members if m not in done]
    reused = sorted(rel for m in done for rel in m["outputs"])

    log = work / spec["log"]
    log.parent.mkdir(parents=True, exist_ok=True)
    if members and not todo:
        log.write_text(
            f"all {len(reused)} output(s) of this job are on the volume, made with the "
            "same inputs and settings: reused, nothing run\n"
        )
        _copy_atomically(log, root / spec["log"])
        retried(volume.commit, "the commit of the job's log")
        return {
            "returncode": 0,
            "seconds": 0.0,
            "started": entered,
            "log_tail": log.read_text(),
            "synced": [],
            "reused": reused,
        }
    command = spec["command"]
    if TARGETS in command:
        command = command.replace(TARGETS, " ".join(m["target"] for m in todo))
    # Snakemake keeps the records of a remote run (which outputs are being written) in
    # a temporary folder: under TMPDIR, so that the syncs below can read them.
    tmp = work / ".snakemake" / "modal-tmp"
    tmp.mkdir(parents=True)
    env = {**os.environ, **spec.get("env", {}), "TMPDIR": str(tmp)}
    # the job's own Python runs from the scratch folder: it finds the local packages
    # of the image only if PYTHONPATH names where Modal mounted them (/root)
    env["PYTHONPATH"] = python_path(
        spec.get("python_packages", []), env.get("PYTHONPATH")
    )
    outputs = [tuple(pair) for pair in spec["outputs"]]
    started = time.monotonic()
    done = threading.Event()
    synced: set[str] = set()
    markers = Markers(root)

    def sync(ended: bool = False) -> None:
        _sync_finished(work, root, tmp, outputs, synced, ended, keys, markers)
        if log.exists():  # the log so far: there even if the container is lost
            _copy_atomically(log, root / spec["log"])
        volume.commit()

    def sync_periodically() -> None:
        sync_until(done, spec.get("sync_every_s", 30), sync)

    syncer = threading.Thread(target=sync_periodically, daemon=True)
    syncer.start()
    # The command goes to the shell in a file, not as `sh -c` text: one argument is
    # capped at 128 KiB (MAX_ARG_STRLEN) and a shard's targets (thousands of
    # `--target-jobs` entries) are longer; the shell then starts Snakemake with each
    # target as its own argument.
    script = work / ".snakemake" / "modal" / "command.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(command + "\n")
    with open(log, "wb") as out:
        if reused:
            out.write(f"reused from the volume: {' '.join(reused)}\n".encode())
            out.flush()
        proc = subprocess.Popen(
            ["/bin/sh", str(script)],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for line in proc.stdout:  # to the log and to Modal's logs
            out.write(line)
            out.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        proc.wait()
    seconds = time.monotonic() - started
    done.set()
    syncer.join()
    # the last sync and commit are retried as the periodic ones are: one refused
    # commit never fails a job whose command succeeded
    retried(lambda: sync(ended=True), "the last sync of finished outputs")
    # An output synced while its job ran, then deleted by Snakemake because that job
    # failed, must not stay on the volume.
    for rel in sorted(synced):
        if not (work / rel).exists():
            _remove(root / rel)
            markers.mark(rel, None)
            synced.discard(rel)
    for rel in spec.get("results", []):
        if (work / rel).exists():
            _copy_atomically(work / rel, root / rel)
    _copy_atomically(log, root / spec["log"])
    retried(volume.commit, "the last commit of the job's files")
    tail = log.read_text(errors="replace").splitlines()[-40:]
    return {
        "returncode": proc.returncode,
        "seconds": seconds,
        "started": entered,
        "log_tail": "\n".join(tail),
        "synced": sorted(synced),
        "reused": reused,
    }


def python_path(packages: list[str], existing: str | None = None) -> str:
    """
    ``PYTHONPATH`` for the job's command: the folders this process imported the
    image's local packages from, then ``existing``.

    Modal mounts ``add_local_python_source`` packages under ``/root``
    (``modal/mount.py``), where the function's own process (started there) finds
    them; nothing in the client puts that folder on a subprocess's ``PYTHONPATH``, and
    the job's ``python -m snakemake`` runs from a scratch folder. The folders are read
    from where the packages were actually found, so this holds wherever Modal puts
    them; those of installed packages (``site-packages``) are left out.

    Parameters
    ----------
    packages : list of str
        Importable names (this plugin and ``--modal-local-packages``).
    existing : str or None
        The ``PYTHONPATH`` already set.

    Returns
    -------
    str
    """
    import importlib.util

    folders: list[str] = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            found = [Path(p).parent for p in spec.submodule_search_locations]
        else:
            found = [Path(spec.origin).parent] if spec.origin else []
        for folder in found:
            text = os.path.abspath(folder)
            if Path(text).name in ("site-packages", "dist-packages"):
                continue
            if text not in folders:
                folders.append(text)
    return os.pathsep.join([*folders, *([existing] if existing else [])])


def sync_until(done: threading.Event, every_s: float, sync, say=print) -> int:
    """
    Call `sync` every `every_s` seconds until `done` is set. A sync that raises (a
    ``Volume.commit`` refused once: a conflict, a transient error) is said in one
    line and the next one is made as planned: one failure never ends the later
    syncs, so a timeout, a preemption or a cancel loses at most what one interval
    finished. Returns the number of syncs that raised.
    """
    failed = 0
    while not done.wait(every_s):
        try:
            sync()
        except Exception as e:  # noqa: BLE001 (any failure: the next sync is made)
            failed += 1
            say(
                f"modal: a periodic sync of finished outputs failed ({type(e).__name__}"
                f": {e}); trying again in {every_s:g} s",
                flush=True,
            )
    return failed


def retried(action, what: str, waits=FINAL_RETRY_WAITS_S, say=print, sleep=time.sleep):
    """
    Call `action` (a job's last sync or commit); where it raises, say so in one line,
    as a periodic sync that fails is said (`sync_until`), and call it again after
    each of `waits` seconds in turn. Returns what `action` returned.

    Raises
    ------
    Exception
        What the last try raised, once every wait is spent: the job fails.
    """
    for wait in (*waits, None):
        try:
            return action()
        except Exception as e:
            if wait is None:
                raise
            say(
                f"modal: {what} failed ({type(e).__name__}: {e}); trying again in "
                f"{wait:g} s",
                flush=True,
            )
            sleep(wait)


def remove_parts(root: Path, paths) -> list[str]:
    """
    Delete the part files (``.<name>.part-*``) that an earlier container, killed while
    copying, left beside these paths of the volume; returns those removed (relative
    to ``root``). Only the job that writes a path copies to its part files. Each
    folder is listed once, however many of its files the job writes (a shard of
    10,000 images in one folder: one listing, not 10,000).
    """
    by_folder: dict[Path, set[str]] = {}
    for rel in paths:
        target = root / rel
        by_folder.setdefault(target.parent, set()).add(f".{target.name}{PART}")
    gone = []
    for folder, prefixes in by_folder.items():
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            head, sep, _ = name.partition(PART)
            if sep and head + PART in prefixes:
                part = folder / name
                _remove(part)
                gone.append(part.relative_to(root).as_posix())
    return sorted(gone)


def _finished(root: Path, member: dict) -> bool:
    """Whether all outputs of a job are on the volume, marked with its key."""
    return bool(member["outputs"]) and all(
        (root / rel).exists() and _marker(root, rel, member["key"]).exists()
        for rel in member["outputs"]
    )


def _marker(root: Path, rel: str, key: str) -> Path:
    return root / DONE / f"{rel}@{key}"


class Markers:
    """
    The markers of a container's outputs on the volume
    (``<prefix>/.snakemake/modal/done/<file>@<key>``), each folder listed once: a
    marker of an output is written only by the job that writes the output, so what
    this container does not write it does not need to see again. Marking the 10,000
    outputs of one folder lists it once, not once per output.
    """

    def __init__(self, root: Path):
        self.root = root
        self._folders: dict[Path, dict[str, set[str]]] = {}

    def _of(self, folder: Path) -> dict[str, set[str]]:
        """Output name -> its marker files in `folder` (a key holds no ``@``:
        a SHA-256 in hex)."""
        if folder not in self._folders:
            index: dict[str, set[str]] = {}
            try:
                names = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                names = []
            for name in names:
                output, sep, _ = name.rpartition("@")
                if sep:
                    index.setdefault(output, set()).add(name)
            self._folders[folder] = index
        return self._folders[folder]

    def mark(self, rel: str, key: str | None) -> None:
        """Record that the output ``rel`` on the volume was made by the job ``key``
        (None: by no known job); markers of other keys are removed first."""
        folder = (self.root / DONE / rel).parent
        index, name = self._of(folder), Path(rel).name
        for old in index.pop(name, set()):
            try:
                (folder / old).unlink()
            except FileNotFoundError:
                pass
        if key:
            folder.mkdir(parents=True, exist_ok=True)
            _marker(self.root, rel, key).write_text(key)
            index[name] = {f"{name}@{key}"}


def _sync_finished(
    work: Path,
    root: Path,
    tmp: Path,
    outputs: list[tuple[str, str]],
    synced: set[str],
    ended: bool,
    keys: dict[str, str] | None = None,
    markers: Markers | None = None,
) -> bool:
    """
    Copy the finished, not yet copied outputs to the volume; True if any. While the
    command runs, an output is finished when Snakemake no longer marks it incomplete;
    once it has ended, every output left is (Snakemake deletes those of failed jobs).
    """
    records = sorted(tmp.glob("snakemake*/persistence/incomplete"))
    if not ended and not records:  # no job started yet (or records kept elsewhere)
        return False
    changed = False
    markers = markers or Markers(root)
    for rel, key in outputs:
        if rel in synced or not (work / rel).exists():
            continue
        if not ended and _incomplete(records, key):
            continue
        markers.mark(rel, None)  # the old file's marker goes before the file changes
        _copy_atomically(work / rel, root / rel)
        markers.mark(rel, (keys or {}).get(rel))
        synced.add(rel)
        changed = True
    return changed


def _incomplete(records: list[Path], key: str) -> bool:
    """
    Whether Snakemake still marks the output recorded under ``key`` as being written.

    Snakemake's file persistence records a started output as the file
    ``<records>/<urlsafe base64 of the key>``, cut into folder names of at most 254
    characters, all but the last prefixed with ``@``; in a remote job the records are
    in ``$TMPDIR/snakemake*/persistence/incomplete`` (``snakemake.persistence.file``
    and ``snakemake.workflow``, Snakemake 9).
    """
    b64 = base64.urlsafe_b64encode(key.encode()).decode()
    parts = [b64[i : i + 254] for i in range(0, len(b64), 254)]
    parts = ["@" + p for p in parts[:-1]] + parts[-1:]
    return any(folder.joinpath(*parts).exists() for folder in records)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def _copy_atomically(src: Path, dst: Path) -> None:
    """
    Copy a file or folder so that ``dst`` never exists half-written: to
    ``.<name>.part-<random>`` beside it, then renamed. (A container killed between the
    two can leave the part file, which Modal's background commits may have committed:
    :func:`remove_parts` deletes those of a job's outputs when it starts again, and
    the executor never lists them.)
    """
    tmp = dst.with_name(f".{dst.name}{PART}{uuid.uuid4().hex[:12]}")
    _copy(src, tmp)
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
