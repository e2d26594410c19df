"""
Per-image files finished in a SLURM allocation that then ended early (time limit,
``scancel``, preemption, a node failing) are kept, not lost.

A shard is one Snakemake group job, one allocation. When the allocation ends before
all of its images are done, Snakemake on the login node fails the whole group and
removes the outputs of every job of it, finished ones included ("Removing output
files of failed job ... since they might be corrupted": Snakemake 9.27,
``jobs.py``, ``Job.postprocess(error=True)`` then ``Job.cleanup``; the per-image
files cannot be corrupted here, each one is renamed into place only when complete).
So every per-image job run in an allocation also keeps its finished file under a
second name in a folder of that allocation beside it
(``.kept-slurm-<jobid>/img0005.pt``, a name Snakemake does not know): a hard link
(no copy), or a copy where the file system refuses hard links between folders
(BeeGFS up to v7: EPERM; many FUSE, SMB and object-store mounts), chosen once per
run on the login node (`choose_keep_method`, ``MULTIGEOM_KEEP_BY``) and said in its
log. Keeping never fails the image: a file system that refuses both costs only the
second name (a line in the job's log). And:

- a job whose file is missing takes it back from such a folder instead of computing
  it: another allocation's (Snakemake's ``--retries`` resubmits a failed shard whole:
  its finished images come back in milliseconds), or its own allocation's (SLURM
  requeued it: the same job id runs its batch script again, and the allocation's
  Snakemake, run with ``--force``, removed the outputs first);
- at the start of a run, on the login node, before Snakemake plans what is left
  (`restore_after_ended_allocations`), the folders of allocations that SLURM says did
  not complete put back the files Snakemake removed; those of allocations that
  completed are dropped (their files were accepted; one removed since was removed on
  purpose and is computed again).

Snakemake's own record of the file (``.snakemake/metadata``: written before it removed
the file) still holds its params, so a file put back is recomputed only if the
settings changed since (the profile's ``rerun-triggers``).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..settings.slurm_states import LIVE_STATES, word

__all__ = [
    "KEEP_ENV",
    "KEPT_PREFIX",
    "EndedAllocations",
    "choose_keep_method",
    "drop_kept",
    "ended_allocation_files",
    "keep_finished",
    "kept_files",
    "put_back",
    "restore_after_ended_allocations",
    "second_name",
    "slurm_job_states",
    "take_kept",
]

#: The folder beside a per-image file that keeps what one allocation finished.
KEPT_PREFIX = ".kept-slurm-"
#: Set by the workflow (multigeom_workflow.on_snakemake.start) to the allocation's job
#: id in a shard it submitted; a local run inside an interactive allocation keeps
#: nothing.
SHARD_ENV = "MULTIGEOM_SLURM_SHARD"
#: How the run keeps a second name of a finished file (``link`` or ``copy``), chosen
#: once per run on the login node (`choose_keep_method`) and handed to its jobs.
KEEP_ENV = "MULTIGEOM_KEEP_BY"
#: What `os.link` raises where a file system refuses hard links (or links between
#: folders): BeeGFS up to v7 EPERM, others EXDEV, ENOTSUP / EOPNOTSUPP, EMLINK.
LINKS_REFUSED = {errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP}
LINKS_REFUSED |= {errno.EMLINK, errno.EACCES, errno.ENOSYS}


def second_name(src: Path, dest: Path, how: str = "link") -> str:
    """
    Give the complete file `src` the name `dest` as well (`dest` must not exist): a
    hard link with ``how="link"``, falling back to a copy where the file system
    refuses it (`LINKS_REFUSED`); a copy is written beside `dest` and renamed into
    place, so that `dest` is never partial.

    Returns
    -------
    str
        ``"link"`` or ``"copy"``: how it was given.

    Raises
    ------
    OSError
        When neither works (FileExistsError when `dest` exists).
    """
    if how == "link":
        try:
            os.link(src, dest)
            return "link"
        except OSError as err:
            if err.errno not in LINKS_REFUSED:
                raise
    if dest.exists():
        raise FileExistsError(errno.EEXIST, "exists", str(dest))
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return "copy"


def choose_keep_method(folder: str | Path) -> tuple[str, str | None]:
    """
    How finished files are kept in `folder`'s file system: try a hard link from
    `folder` into a subfolder of it, as `keep_finished` makes one (nothing is left).

    Returns
    -------
    how : str
        ``"link"``, or ``"copy"`` where the link was refused.
    why : str or None
        The refusal (``"PermissionError: Operation not permitted"``), None for
        links.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    probe = Path(tempfile.mkdtemp(dir=folder, prefix=".keep-probe-"))
    try:
        src = probe.with_name(probe.name + ".src")
        src.write_bytes(b"")
        try:
            os.link(src, probe / "dest")
            return "link", None
        except OSError as err:
            return "copy", f"{type(err).__name__}: {err.strerror or err}"
        finally:
            src.unlink(missing_ok=True)
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _job_id() -> str | None:
    job = os.environ.get("SLURM_JOB_ID")
    return job if job and os.environ.get(SHARD_ENV) == job else None


def keep_finished(out: str | Path, job_id: str | None = None) -> Path | None:
    """
    Keep a finished per-image file of an allocation under a second name. Never
    raises: the image is complete whatever happens here; a second name that cannot
    be made is said in one line (the job's log) and only costs what it would save.

    Parameters
    ----------
    out : str or Path
        The per-image file, complete.
    job_id : str, optional
        The allocation (default ``$SLURM_JOB_ID`` in a shard the workflow submitted,
        `SHARD_ENV`); elsewhere nothing is done.

    Returns
    -------
    Path or None
        The kept name (``<folder>/.kept-slurm-<jobid>/<name>``): a hard link to
        `out`, or a copy (`KEEP_ENV`, `second_name`); None where nothing was kept.
    """
    job_id = job_id or _job_id()
    if not job_id:
        return None
    out = Path(out)
    kept = out.parent / f"{KEPT_PREFIX}{job_id}" / out.name
    try:
        kept.parent.mkdir(exist_ok=True)
        kept.unlink(missing_ok=True)
        how = second_name(out, kept, os.environ.get(KEEP_ENV, "link"))
    except OSError as err:
        print(
            f"warning: {out} is complete, but no second name could be kept in "
            f"{kept.parent} ({type(err).__name__}: {err}): if this allocation ends "
            "early, Snakemake removes the image with its shard",
            flush=True,
        )
        return None
    if how != os.environ.get(KEEP_ENV, "link"):
        print(f"{out}: kept as a copy (hard link refused) in {kept.parent}", flush=True)
    return kept


def take_kept(out: str | Path, job_id: str | None = None) -> Path | None:
    """
    Put back a per-image file that an allocation of the run finished and Snakemake
    removed: another allocation's (its failed shard's outputs removed, then
    resubmitted by ``--retries``), or this allocation's own (SLURM requeued it: the
    same job id runs again and its Snakemake, run with ``--force``, removed the
    outputs before their jobs).

    Parameters
    ----------
    out : str or Path
        The per-image file the job is to write (missing).
    job_id : str, optional
        This allocation (default as for `keep_finished`); elsewhere nothing is done.

    Returns
    -------
    Path or None
        The kept file given back the name `out` (`second_name`: a hard link, or a
        copy; its modification time set to now, as for a file the job wrote), or
        None when there is none.
    """
    job_id = job_id or _job_id()
    out = Path(out)
    if not job_id or out.exists():
        return None
    own = out.parent / f"{KEPT_PREFIX}{job_id}" / out.name
    others = sorted(out.parent.glob(f"{KEPT_PREFIX}*/{out.name}"))
    for kept in [own] * own.exists() + [k for k in others if k != own]:
        try:
            second_name(kept, out, os.environ.get(KEEP_ENV, "link"))
        except FileExistsError:
            return None
        except OSError:
            continue  # gone meanwhile, or unreadable: the next one, else compute
        os.utime(out)
        return kept
    return None


def kept_files(folders: Iterable[str | Path], job_ids: Iterable[str]) -> list[Path]:
    """The per-image files the allocations `job_ids` kept in `folders`, in order."""
    ids = list(job_ids)
    return [
        kept
        for folder in folders
        for job in ids
        for kept in sorted(Path(folder).glob(f"{KEPT_PREFIX}{job}/img*.pt"))
    ]


def put_back(folders: Iterable[str | Path], job_ids: Iterable[str]) -> list[Path]:
    """
    Put back every per-image file that the allocations `job_ids` kept and that is
    missing now (their Snakemake removed it as they were cancelled), keeping their
    folders (a later shard still takes back from them); returns the files.
    """
    out = []
    for kept in kept_files(folders, job_ids):
        target = kept.parent.parent / kept.name
        if not target.exists():
            try:
                second_name(kept, target, os.environ.get(KEEP_ENV, "link"))
            except OSError:
                continue
            out.append(target)
    return out


def drop_kept(out: str | Path) -> list[Path]:
    """
    Remove the kept names of a per-image file (every allocation's), so that a file
    cleared on purpose is not put back; returns them.
    """
    out = Path(out)
    dropped = sorted(out.parent.glob(f"{KEPT_PREFIX}*/{out.name}"))
    for kept in dropped:
        kept.unlink(missing_ok=True)
    return dropped


def slurm_job_states(job_ids: Iterable[str]) -> dict[str, str]:
    """
    The states SLURM reports for `job_ids`, as codes (`settings.slurm_states.word`:
    ``COMPLETED``, ``TIMEOUT``, ``CANCELLED``, ``PENDING``, ...): the controller's
    first (``squeue``: the live state of a job it holds, a requeued one's too), then
    job accounting's (``sacct``) for the jobs the controller no longer holds, as
    `settings.slurm_states` settles ``PREEMPTED``. A job neither knows is left out.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    states: dict[str, str] = {}
    controller = _slurm_rows(
        ["squeue", "-h", "--states=all", "-j", ",".join(ids), "-o", "%i|%T"]
    )
    if controller is None and len(ids) > 1:  # squeue refuses the list for one
        # id it no longer knows ("Invalid job id specified"): ask each alone
        controller = [
            row
            for job in ids
            for row in _slurm_rows(
                ["squeue", "-h", "--states=all", "-j", job, "-o", "%i|%T"]
            )
            or []
        ]
    for job, state in controller or []:
        if job in ids and word(state) in LIVE_STATES:
            states[job] = word(state)
    left = [job for job in ids if job not in states]
    accounting = left and _slurm_rows(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(left), "-o", "JobIDRaw,State"]
    )
    for job, state in [*(accounting or []), *(controller or [])]:
        if job in left and state and job not in states:
            states[job] = word(state)
    return states


def _slurm_rows(cmd: list[str]) -> list[tuple[str, str]] | None:
    """``id|state`` rows of a SLURM command, None where it could not answer."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            rows.append((job, state))
    return rows


@dataclass
class EndedAllocations:
    """
    What the allocations that ended early left kept (`ended_allocation_files`): read
    only, so that a dry run can say it and a real run then does it
    (`restore_after_ended_allocations`).

    Attributes
    ----------
    put_back : list of (Path, Path)
        (per-image file, its kept name) for each file missing now that comes back.
    ended : list of str
        ``"<jobid> <STATE>"`` of each allocation whose files come back.
    drop : list of Path
        Kept folders no longer needed (SLURM said their allocation ended).
    """

    put_back: list[tuple[Path, Path]] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    drop: list[Path] = field(default_factory=list)


def ended_allocation_files(
    folders: Iterable[str | Path],
    states: Callable[[Iterable[str]], dict[str, str]] = slurm_job_states,
) -> EndedAllocations:
    """
    The per-image files that allocations finished before they ended early and that
    are missing now, and the kept folders no longer needed; changes nothing.

    Parameters
    ----------
    folders : iterable of str or Path
        The per-image folders of the run (one per configuration, and the noise
        ceiling's).
    states : callable
        Job ids -> SLURM state (default `slurm_job_states`); a job missing from the
        answer (SLURM did not say, or could not be asked) counts as not completed:
        its files come back, and its folder is kept (it may still be running).

    Returns
    -------
    EndedAllocations

    Notes
    -----
    A folder of an allocation still queued or running is left as it is; one of an
    allocation that ``COMPLETED`` is dropped without putting anything back.
    """
    out = EndedAllocations()
    kept_dirs = [
        d for f in folders for d in Path(f).glob(f"{KEPT_PREFIX}*") if d.is_dir()
    ]
    if not kept_dirs:
        return out
    known = states({d.name[len(KEPT_PREFIX) :] for d in kept_dirs})
    ended, seen = set(), set()
    for d in kept_dirs:
        job = d.name[len(KEPT_PREFIX) :]
        state = known.get(job, "UNKNOWN")
        if state in LIVE_STATES:  # queued, running, requeued: left as it is
            continue
        if state != "COMPLETED":
            for kept in sorted(d.glob("img*.pt")):
                target = d.parent / kept.name
                if target not in seen and not target.exists():
                    seen.add(target)
                    out.put_back.append((target, kept))
                    ended.add(f"{job} {state}")
        if state != "UNKNOWN":  # SLURM said it ended: its copies are no longer needed
            out.drop.append(d)
    out.ended = sorted(ended)
    return out


def restore_after_ended_allocations(
    folders: Iterable[str | Path],
    states: Callable[[Iterable[str]], dict[str, str]] = slurm_job_states,
) -> tuple[list[Path], list[str]]:
    """
    At the start of a real run: put back the per-image files that allocations finished
    before they ended early (`ended_allocation_files`), and drop the kept folders no
    longer needed. A file that cannot be put back (a folder the user may not write)
    is left out: the run computes it.

    Returns
    -------
    restored : list of Path
        The per-image files put back.
    ended : list of str
        ``"<jobid> <STATE>"`` of each allocation whose files were put back.
    """
    found = ended_allocation_files(folders, states)
    restored = []
    for target, kept in found.put_back:
        try:
            second_name(kept, target, os.environ.get(KEEP_ENV, "link"))
        except OSError:
            continue
        restored.append(target)
    for d in found.drop:
        shutil.rmtree(d, ignore_errors=True)
    return restored, found.ended if restored else []
