"""
Every way a SLURM allocation ends, on the real cluster of ``.ci/slurm-cluster.sh``
(SLURM 22.05, slurmdbd accounting, preemption by partition priority), through the
maintained ``snakemake-executor-plugin-slurm`` and the workflow's layer over its
status query (`multigeom_workflow.on_slurm.status`).

Each test runs one shard of the reduced demo's 4 first estimates (the stand-in
estimator: `STANDIN_S` seconds an image), ends the allocation once 2 images are done,
and checks that the run ends or goes on without a hang, that each image is computed
at most once at a time and only once where it was finished before the event, and that
every image finished before the event is kept with its bytes. The plugin's status
checks are at most `STATUS_CAP_S` apart here (its growing interval is only a
latency: `status_checks_capped`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_slurm import (  # noqa: F401  (slurm_cluster: the fixture)
    ACCOUNT,
    PARTITION,
    REPO,
    STATUS_CAP_S,
    BackgroundRun,
    compute_records,
    jobs_since,
    last_job_id,
    run,
    sacct_rows,
    slurm_cluster,
    slurm_command,
    user_profile,
    workdir_with_assets,
)

pytestmark = pytest.mark.usefixtures("slurm_cluster")

#: Seconds per image of the stand-in estimator.
STANDIN_S = 4
#: The most seconds a run may take here (no hang).
RUN_LIMIT_S = 300


def compute_spans(path: Path) -> dict[str, list[tuple[float, float | None]]]:
    """Per-image file -> the (start, end) of each computation of it (end None: cut)."""
    import json

    starts: dict[tuple[int, str], float] = {}
    spans: dict[str, list] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        e = json.loads(line)
        if e["what"] != "compute":
            continue
        key = (e["pid"], e["out"])
        if e.get("end") is None:
            starts[key] = e["start"]
        else:
            starts.pop(key, None)
            spans.setdefault(e["out"], []).append((e["start"], e["end"]))
    for (_, out), start in starts.items():
        spans.setdefault(out, []).append((start, None))
    return spans


class Shard(BackgroundRun):
    """One shard of 4 images running through the profile (`seconds` an image),
    ended by a test."""

    def __init__(
        self, tmp_path, tiny_run, profile=None, site=(), *extra, seconds=STANDIN_S
    ):
        self.work = workdir_with_assets(tiny_run, tmp_path / "work")
        self.profile = profile or user_profile(tmp_path / "profile")
        cmd = slurm_command(self.work, self.profile, "--jobs", "1")
        cmd += ["--until", "estimate_image", "--config", "n_images=1"]
        self.cmd = [*cmd, "noise_ceiling_images=0", *extra]
        super().__init__(tmp_path, self.cmd, seconds, site=site)
        self.finished: dict[str, bytes] = {}

    def wait_for_two_images(self, n: int = 2) -> str:
        """Wait until `n` images are done; returns the running allocation's job id."""
        done = f"{n} images done"
        self.wait_for(done, lambda: len(compute_records(self.records)) >= n)
        for f in compute_records(self.records):
            # each image as it was finished (a requeued run's Snakemake removes the
            # outputs before it takes them back: read them once, when they are new)
            if f not in self.finished:
                self.finished[f] = Path(f).read_bytes()
        jobs = jobs_since(self.first, self.work)
        assert jobs and jobs[-1]["State"] == "RUNNING", jobs
        return jobs[-1]["JobIDRaw"]

    def output(self, limit: float = RUN_LIMIT_S) -> str:
        return super().output(limit)

    def files(self) -> list[str]:
        return sorted(str(f) for f in self.work.glob("runs/per_image/*/*/img*.pt"))

    def check_kept_and_once(self, cut_by) -> dict:
        """
        Every image there; those done before the event kept with their bytes and
        computed once; no image computed twice at the same time: a computation cut
        by the event (no end recorded) had stopped by `cut_by` (when SLURM ended its
        allocation, or started it again: a time, or the times of its runs, the first
        after the computation's start counting), before the image's next
        computation.
        """
        files = self.files()
        assert len(files) == 4, files
        spans = compute_spans(self.records)
        for f, content in self.finished.items():
            assert Path(f).read_bytes() == content, f
            assert len(spans[f]) == 1, (f, spans[f])  # kept: not computed again
        bounds = sorted(cut_by) if isinstance(cut_by, list) else [cut_by]
        for f, runs in spans.items():
            ordered = sorted(runs)
            for (begin, end), (start, _) in zip(ordered, ordered[1:], strict=False):
                if end is None:  # stopped when its allocation's run ended
                    end = min([b for b in bounds if b > begin] or [bounds[-1]])
                assert end <= start, (f, runs, cut_by)
        done = [f for f, runs in spans.items() if any(e for _, e in runs)]
        assert sorted(done) == files
        return spans


def test_scancel_of_a_running_shard_ends_it_and_the_next_run_keeps_its_images(
    tiny_run, tmp_path
):
    """
    ``scancel`` (sacct: ``CANCELLED by 0``): the login node's Snakemake sees the end
    at the next status check, with one line, and (no retry: ``--retries 0``) the next
    run puts the 2 finished images back before it plans and computes the 2 others.
    The shipped profile with its SET values given on the command line
    (``--set-resources`` replaces the profile's whole list): the allocations still
    ask for a GPU and the shard's memory, and run each image as a plain process of
    the allocation (the rule's ``mpi=""``: no srun step).
    """
    profile = REPO / "profiles" / "slurm"
    given = [f"estimate_image:slurm_partition={PARTITION}"]
    given += [f"estimate_image:slurm_account={ACCOUNT}"]
    given += ["estimate_image:cpus_per_gpu=1"]
    extra = ["--retries", "0", "--set-resources", *given]
    shard = Shard(tmp_path, tiny_run, profile, (), *extra)
    job = shard.wait_for_two_images()
    subprocess.run(["scancel", job], check=True)
    output = shard.output()
    assert shard.proc.returncode != 0, output[-5000:]
    line = next(x for x in output.splitlines() if f"allocation {job} ended" in x)
    assert "CANCELLED by 0" in line and "cancelled (scancel) by uid 0" in line
    # Snakemake's own error block, not its logging's tracebacks (Snakemake 9.19 to
    # 9.23: KeyError 'name' in _format_group_error, snakemake #4248)
    assert "Logging error" not in output and "KeyError" not in output, output[-5000:]
    again = subprocess.run(shard.cmd, env=shard.env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-5000:]
    # put back before Snakemake planned: only the 2 others were computed (below)
    assert "restored 2 per-image file(s)" in again.stderr
    assert f"({job} CANCELLED)" in again.stderr
    jobs = jobs_since(shard.first, shard.work)
    assert [j["State"] for j in jobs] == ["CANCELLED by 0", "COMPLETED"], jobs
    shard.check_kept_and_once(cut_by=slurm_time(job, "End"))
    for j in jobs:  # what a shard needs, whatever the command line replaced
        tres = dict(item.split("=", 1) for item in j["ReqTRES"].split(","))
        assert tres["gres/gpu"] == "1" and tres["mem"] == "16000M", tres
    steps = subprocess.run(
        [
            "sacct",
            "-n",
            "-P",
            "-j",
            ",".join(j["JobIDRaw"] for j in jobs),
            "-o",
            "JobID",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sorted(steps) == sorted(
        x for j in jobs for x in (j["JobIDRaw"], f"{j['JobIDRaw']}.batch")
    ), steps  # no srun step: one warm worker per allocation


def slurm_time(job: str, field: str) -> float:
    """A job's ``Start`` or ``End`` as sacct reports it (whole seconds), in
    ``time.time()`` seconds."""
    from datetime import datetime

    text = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job, "-o", field],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return datetime.fromisoformat(text).timestamp()


def requeued_start_now(job: str) -> None:
    """A requeued job waits for its begin time (about 2 minutes in SLURM 22.05):
    start it at once."""
    deadline = time.time() + 60
    while time.time() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T|%r"], capture_output=True, text=True
        ).stdout.strip()
        if state.startswith("PENDING"):
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
            return
        time.sleep(0.5)
    pytest.fail(f"job {job} was not requeued: {state}")


def slurm_starts(job: str) -> list[float]:
    """The start of each run of a job SLURM requeued (``sacct --duplicates``)."""
    from datetime import datetime

    out = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-j", job, "-o", "Start"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [datetime.fromisoformat(x).timestamp() for x in out if x != "Unknown"]


def test_a_requeued_shard_keeps_what_it_finished(tiny_run, tmp_path):
    """
    SLURM runs the same job id again, twice: ``scontrol requeue`` once 1 image is
    done, then a node set down (whose jobs SLURM requeues: ``JobRequeue=1``, its
    default) once 2 are: each run takes back the images the earlier ones finished
    (0 of 2 were kept before) and computes only the rest; the login node waits for
    it instead of failing it (sacct shows ``NODE_FAIL`` while the controller holds it
    again) and submits nothing else.
    """
    shard = Shard(tmp_path, tiny_run)
    job = shard.wait_for_two_images(1)
    subprocess.run(["scontrol", "requeue", job], check=True)
    requeued_start_now(job)
    again = shard.wait_for_two_images(2)
    # the same job id run again, no second job (seen once in 6 runs on 2026-12-06:
    # a job 185 beside the requeued 184): the jobs and the run's output if not
    assert again == job, (job, jobs_since(shard.first, shard.work), shard.stop())
    subprocess.run(
        ["scontrol", "update", "nodename=localhost", "state=down", "reason=test"],
        check=True,
    )
    time.sleep(2)
    subprocess.run(["scontrol", "update", "nodename=localhost", "state=resume"])
    requeued_start_now(job)
    output = shard.output()
    assert shard.proc.returncode == 0, output[-5000:]
    jobs = jobs_since(shard.first, shard.work)
    assert [(j["JobIDRaw"], j["State"]) for j in jobs] == [(job, "COMPLETED")], jobs
    starts = slurm_starts(job)
    assert len(starts) == 3, starts  # its first run and two requeued ones
    # each run's processes ended before SLURM started it again
    shard.check_kept_and_once(cut_by=starts)
    # the images it finished came back from its own folder in its last run
    logs = "".join(
        f.read_text() for f in shard.work.glob("logs/estimate_image/*/*/*.log")
    )
    assert logs.count(f".kept-slurm-{job}/img") == 2, logs


def test_a_preempted_shard_on_storage_without_links_keeps_its_images(
    tiny_run, tmp_path
):
    """
    A shard of the preemptible partition ``spot`` (PreemptMode=CANCEL) preempted by
    a job of ``urgent`` (a higher PriorityTier) that needs the whole node: PREEMPTED
    is final (the plugin waited on it forever); the retry waits for the node and
    computes only the 2 images not finished. On a file system that refuses hard
    links between folders: the run says once that it keeps copies, and no image
    fails for it (every image was failed right after it was computed).
    """
    profile = user_profile(tmp_path / "profile", slurm_partition="spot")
    shard = Shard(tmp_path, tiny_run, profile, [NO_LINKS_BETWEEN_FOLDERS])
    job = shard.wait_for_two_images()
    urgent = subprocess.run(
        ["sbatch", "--parsable", "-A", ACCOUNT, "-p", "urgent", "--gpus=2"]
        + ["-D", str(tmp_path), "-o", "/dev/null"],
        input="#!/bin/sh\nsleep 3\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    output = shard.output()
    assert shard.proc.returncode == 0, output[-5000:]
    assert f"SLURM allocation {job} ended PREEMPTED" in output
    states = {j["JobIDRaw"]: j["State"] for j in sacct_rows("-j", f"{job},{urgent}")}
    assert states[job] == "PREEMPTED" and states[urgent] == "COMPLETED", states
    said = [x for x in output.splitlines() if "keep a copy of each finished" in x]
    assert len(said) == 1 and "PermissionError" in said[0], said
    shard.check_kept_and_once(cut_by=slurm_time(job, "End"))
    kept = list(shard.work.glob("runs/per_image/*/*/.kept-slurm-*/img*.pt"))
    assert kept and all(k.stat().st_nlink == 1 for k in kept)  # copies, not links


#: os.link as a file system that refuses a hard link into another folder has it
#: (BeeGFS up to v7: EPERM), for every Python process of a run (`status_checks_capped`).
NO_LINKS_BETWEEN_FOLDERS = """
import errno, os
_link = os.link
def _refused(src, dst, *args, **kwargs):
    if os.path.dirname(os.path.abspath(src)) != os.path.dirname(os.path.abspath(dst)):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    return _link(src, dst, *args, **kwargs)
os.link = _refused
"""


def test_a_killed_login_snakemake_leaves_no_image_computed_twice_at_once(
    tiny_run, tmp_path
):
    """
    The login node's Snakemake killed (SIGKILL: no cancel) while its shard runs on:
    the next run (after ``--unlock``) cancels that allocation before submitting,
    says so, takes back what it finished and computes only the rest.
    """
    # 15 s an image: the orphan's last 2 outlast the --unlock and the next run's
    # start on a loaded machine (at 4 s it had ended before, nothing to cancel)
    shard = Shard(tmp_path, tiny_run, seconds=15)
    job = shard.wait_for_two_images(1)
    os.kill(shard.proc.pid, signal.SIGKILL)
    shard.proc.communicate(timeout=30)
    deadline = time.time() + 60  # the orphaned shard computes on: a second image
    while len(compute_records(shard.records)) < 2 and time.time() < deadline:
        time.sleep(0.5)
    state = jobs_since(shard.first, shard.work)[0]["State"]
    assert state == "RUNNING", state
    unlock = run([*shard.cmd, "--unlock"])
    assert unlock.returncode == 0, unlock.stderr[-3000:]
    again = subprocess.run(shard.cmd, env=shard.env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-5000:]
    line = next(x for x in again.stderr.splitlines() if x.startswith("cancelled 1"))
    assert f"({job} RUNNING)" in line, line
    kept = list(shard.work.glob(f"runs/per_image/*/*/.kept-slurm-{job}/img*.pt"))
    assert f"the {len(kept)} image(s) they finished are kept" in line, line
    assert len(kept) >= 2  # the one before the kill, one at least after it
    jobs = jobs_since(shard.first, shard.work)
    assert jobs[0]["State"].startswith("CANCELLED"), jobs
    # a new shard for what the orphan had not finished (none where it had finished
    # every image by the time it was cancelled), started once it had ended
    assert len(jobs) == 2 or (len(jobs) == 1 and len(kept) == 4), (jobs, kept)
    if len(jobs) == 2:
        assert slurm_time(job, "End") <= slurm_time(jobs[1]["JobIDRaw"], "Start")
    shard.check_kept_and_once(cut_by=slurm_time(job, "End"))
