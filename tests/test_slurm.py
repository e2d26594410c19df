"""
The workflow on a real SLURM cluster: the single-node cluster of
``.ci/slurm-cluster.sh`` (Debian's slurm-wlm 22.05 with slurmdbd accounting, started
by the `slurm_cluster` fixture when it is not running), driven by the maintained
``snakemake-executor-plugin-slurm`` through ``profiles/slurm`` as a user edits it; the
reduced demo's per-image jobs with ``device: cpu``, 2 shards.

No fake SLURM command: a login node without job accounting is this cluster seen
through a slurm.conf that has none (``SLURM_CONF``: the real sacct answers "Slurm
accounting storage is disabled"), a time limit reached is the running shard's limit
lowered with ``scontrol update``. Not tested here: preemption, a node failing,
several nodes on a shared file system, real GPUs (this node's GPUs are fake gres
devices, the per-image jobs compute with ``device: cpu``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CONFIGURATIONS, REPO, TINY_CONFIG, WITHOUT_MODAL, python_path

from multigeom_workflow.compute.gpus import lock_dir
from multigeom_workflow.compute.hook import HOOK_ENV
from multigeom_workflow.compute.kept import (
    drop_kept,
    keep_finished,
    restore_after_ended_allocations,
    take_kept,
)
from multigeom_workflow.compute.standin import RECORD_ENV, STANDIN_ENV
from multigeom_workflow.planning.slurm import (
    DEFAULT_CAP_MIN,
    ShardPlan,
    plan_shards,
    shard_minutes,
    shard_plan,
    slurm_time_minutes,
)

#: The stand-in estimator in place of the real one (compute/hook.py)
STANDIN = {HOOK_ENV: "multigeom_workflow.compute.standin"}
CLUSTER_SCRIPT = REPO / ".ci" / "slurm-cluster.sh"
TENSORS = ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues", "J_eigenvectors")
#: The cluster's account and partitions (.ci/slurm-cluster.sh).
ACCOUNT, PARTITION = "local", "gpu"
SACCT_FIELDS = (
    "JobIDRaw,JobName,State,Partition,Account,Timelimit,ReqTRES,WorkDir,Comment"
)


@pytest.fixture(scope="session")
def slurm_cluster():
    """
    The single-node cluster of .ci/slurm-cluster.sh, started (installed first) when
    it is not running; skipped only where it cannot be: not root, or no apt-get.
    """
    status = subprocess.run([CLUSTER_SCRIPT, "status"], capture_output=True, text=True)
    if status.returncode != 0:
        if os.geteuid() != 0:
            pytest.skip("a real SLURM cluster needs root: .ci/slurm-cluster.sh start")
        if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
            pytest.skip("no apt-get to install SLURM (.ci/slurm-cluster.sh)")
        start = subprocess.run(
            [CLUSTER_SCRIPT, "start"], capture_output=True, text=True, timeout=600
        )
        assert start.returncode == 0, start.stderr[-3000:]
    return last_job_id()


def sacct_rows(*args: str) -> list[dict]:
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "-S", "2000-01-01", "-o", SACCT_FIELDS, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    keys = SACCT_FIELDS.split(",")
    return [
        dict(zip(keys, line.split("|", len(keys) - 1), strict=True))
        for line in out.splitlines()
        if line
    ]


def last_job_id() -> int:
    return max([int(r["JobIDRaw"]) for r in sacct_rows()], default=0)


def jobs_since(first: int, work: Path) -> list[dict]:
    """The cluster's jobs submitted after job `first` from folder `work`, in order."""
    return [
        r
        for r in sacct_rows()
        if int(r["JobIDRaw"]) > first and Path(r["WorkDir"]) == work
    ]


#: The most seconds between two of the plugin's status checks in the tests that end
#: a shard: the plugin adds 10 s after each check in which no job succeeded (up to
#: 180 s, also after a failure), a latency of the login node's Snakemake only; capped
#: here so that the suite waits minutes less for it (`status_checks_capped`).
STATUS_CAP_S = 5
_CAP_STATUS_CHECKS = f"""
import sys
if "snakemake" in " ".join(sys.orig_argv):
    from snakemake_interface_executor_plugins.executors import remote as _remote

    _checks = _remote.RemoteExecutor.next_seconds_between_status_checks

    def _capped(self, value):
        _checks.fset(self, None if value is None else min(value, {STATUS_CAP_S}))

    _remote.RemoteExecutor.next_seconds_between_status_checks = _checks.setter(_capped)
"""


def status_checks_capped(dest: Path, *more: str) -> dict:
    """
    The environment of a run whose Python processes (the login node's Snakemake
    among them; sbatch passes it to the allocations) read a sitecustomize module in
    `dest`: the plugin's status checks at most `STATUS_CAP_S` apart, and the code
    `more` (another file system's behaviour).
    """
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "sitecustomize.py").write_text("\n".join([_CAP_STATUS_CHECKS, *more]))
    return {"PYTHONPATH": python_path(dest)}


def user_profile(dest: Path, **resources: str) -> Path:
    """
    profiles/slurm as a user edits it for this cluster: the values marked SET filled
    in, and what the node has (2 CPUs, its memory) instead of a GPU node's.
    """
    dest.mkdir(parents=True)
    text = (REPO / "profiles" / "slurm" / "profile.yaml").read_text()
    marked = [line for line in text.splitlines() if "# SET" in line]
    assert any("slurm_account=" in line for line in marked)
    assert any("slurm_partition=" in line for line in marked)
    text = text.replace("slurm_account=SET-your-account", f"slurm_account={ACCOUNT}")
    text = text.replace(
        "slurm_partition=SET-your-gpu-partition", f"slurm_partition={PARTITION}"
    )
    changes = {"mem_mb": "2000", "cpus_per_gpu": "1", **resources}
    for name, value in changes.items():
        text, n = re.subn(
            rf"estimate_image:{name}=\S+", f"estimate_image:{name}={value}", text
        )
        if n == 0:
            text = text.replace(
                "set-resources:", f"set-resources:\n  - estimate_image:{name}={value}"
            )
    assert "SET-" not in text
    (dest / "profile.yaml").write_text(text)
    return dest


def workdir_with_assets(tiny_run: Path, dest: Path) -> Path:
    """The reduced demo's assets (models, test images), no per-image file yet."""
    shutil.copytree(tiny_run / "runs", dest / "runs", symlinks=True)
    shutil.rmtree(dest / "runs" / "per_image")
    shutil.rmtree(dest / "runs" / "per_image_ceiling", ignore_errors=True)
    shutil.rmtree(dest / "runs" / "metrics", ignore_errors=True)
    return dest


def slurm_command(work: Path, profile: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(work), "--profile", str(profile)]
    cmd += ["--configfile", str(TINY_CONFIG), "--cores", "1", "--jobs", "2"]
    cmd += ["--slurm-init-seconds-before-status-checks", "1"]
    cmd += ["--seconds-between-status-checks", "2", "--latency-wait", "5"]
    return [*cmd, *extra]


def run(cmd: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


class BackgroundRun:
    """
    The workflow through a profile on the real cluster (`cmd`), started in the
    background in its own session, with the stand-in estimator (`seconds` an
    image, each computation recorded in ``records``); `path_first` first on PATH,
    `site` more code for the processes' sitecustomize (`status_checks_capped`),
    `env` over the environment (its PYTHONPATH replaces the capped status checks').
    """

    def __init__(self, tmp_path, cmd, seconds, path_first=None, env=None, site=()):
        self.records = tmp_path / "records.jsonl"
        self.env = {
            **os.environ,
            **STANDIN,
            STANDIN_ENV: str(seconds),
            RECORD_ENV: str(self.records),
            **status_checks_capped(tmp_path / "site", *site),
            **(env or {}),
        }
        first = [str(path_first)] if path_first else []
        self.env["PATH"] = os.pathsep.join(
            [*first, str(Path(sys.executable).parent), self.env["PATH"]]
        )
        self.first = last_job_id()
        self.proc = subprocess.Popen(
            cmd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def stop(self) -> str:
        """Interrupt the run (SIGINT to its session, as Ctrl-C); its output."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.communicate(timeout=60)[0]

    def wait_for(self, what: str, ready, seconds: float = 180) -> None:
        """Wait until `ready()`; fails the test (and stops the run) after `seconds`
        or when the run ended first."""
        deadline = time.time() + seconds
        while not ready():
            if time.time() > deadline or self.proc.poll() is not None:
                pytest.fail(f"{what} not in time: {self.stop()[-4000:]}")
            time.sleep(0.5)

    def output(self, limit: float = 300) -> str:
        """The run's output once it ended; fails the test if it takes more than
        `limit` seconds (a hang)."""
        try:
            return self.proc.communicate(timeout=limit)[0]
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run hung ({limit} s): {self.stop()[-4000:]}")


def assert_equal_to_local(work: Path, tiny_run: Path, files) -> None:
    for f in files:
        rel = Path(f).relative_to(work) if Path(f).is_absolute() else Path(f)
        slurm = torch.load(work / rel, weights_only=False)
        local = torch.load(tiny_run / rel, weights_only=False)
        for key in TENSORS:  # same seed per image: the same numbers as locally
            assert torch.equal(slurm[key], local[key]), (rel, key)


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tiny_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    work = workdir_with_assets(tiny_run, root / "work")
    profile = user_profile(root / "profile")
    first = last_job_id()
    # in a Python without the Modal plugin: a SLURM-only install
    dry = run(slurm_command(work, profile, "-n"), env=WITHOUT_MODAL)
    result = run(slurm_command(work, profile), env=WITHOUT_MODAL)
    submitted = jobs_since(first, work)
    again = run(slurm_command(work, profile), env=WITHOUT_MODAL)
    return work, dry, result, submitted, again, jobs_since(first, work)


def test_slurm_profile_runs_the_demo(slurm_run, tiny_run):
    work, _, result, _, again, after = slurm_run
    assert result.returncode == 0, result.stderr[-5000:]
    assert (work / "results" / "fig4de.png").exists()
    files = [
        Path("runs", folder, enc, area, f"img{i:04d}.pt")
        for enc, area in CONFIGURATIONS
        for folder, n in (("per_image", 2), ("per_image_ceiling", 1))
        for i in range(n)
    ]
    assert_equal_to_local(work, tiny_run, files)
    # a second run: nothing left, nothing submitted
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stderr
    assert len(after) == 2


def test_one_allocation_per_shard_with_one_gpu(slurm_run):
    work, dry, result, submitted, _, _ = slurm_run
    assert result.returncode == 0, result.stderr[-5000:]
    # 12 per-image jobs (8, and the noise ceiling's 4) in --jobs 2 shards of 6
    assert len(submitted) == 2, submitted
    assert {j["State"] for j in submitted} == {"COMPLETED"}
    assert {(j["Account"], j["Partition"]) for j in submitted} == {(ACCOUNT, PARTITION)}
    for job in submitted:
        tres = dict(item.split("=", 1) for item in job["ReqTRES"].split(","))
        assert tres["gres/gpu"] == "1" and tres["mem"] == "2000M", tres
    shards = sorted(re.search(r"shard-\d+", j["Comment"]).group() for j in submitted)
    assert shards == ["shard-00", "shard-01"]
    # each allocation's --time is its shard's limit of the dry run
    limits = re.findall(r"(shard-0\d): .* time limit (\d+) min", dry.stderr)
    asked = {
        re.search(r"shard-\d+", j["Comment"]).group(): j["Timelimit"] for j in submitted
    }
    assert asked == {s: f"{int(m) // 60:02d}:{int(m) % 60:02d}:00" for s, m in limits}
    # one warm worker per allocation served its images (models loaded once per
    # configuration of the shard), not one per image
    starts = sum(
        f.read_text().count("worker started")
        for f in (work / "logs" / "workers").glob("*.log")
    )
    assert starts == 2, starts
    # each allocation's lock folder went with it
    for job in submitted:
        assert not (lock_dir() / f"slurm-{job['JobIDRaw']}").exists()


def test_dry_run_prints_gpu_hours_per_shard(slurm_run):
    _, dry, _, _, _, _ = slurm_run
    assert dry.returncode == 0, dry.stderr[-3000:]
    text = dry.stderr
    assert (
        "on SLURM (--executor slurm): 2 allocation(s), one per shard, each asking 1 "
        f"GPU, 1 CPU core per GPU, 2000 MB, partition {PARTITION}, account {ACCOUNT};"
    ) in text
    shard_lines = re.findall(
        r"shard-0\d: 6 image\(s\) of 2 configuration\(s\), [0-9.e-]+ GPU-hours, "
        r"time limit (\d+) min",
        text,
    )
    assert len(shard_lines) == 2, text
    assert re.search(r"GPU-hours per shard: [0-9.e-]+ \(", text)
    slurm_block = text.split("on SLURM", 1)[1].split("\n\n", 1)[0]
    assert "USD" not in slurm_block


def test_a_cancelled_run_leaves_nothing_that_looks_finished(
    slurm_cluster, tiny_run, tmp_path
):
    work = workdir_with_assets(tiny_run, tmp_path / "work")
    profile = user_profile(tmp_path / "profile")
    first = last_job_id()
    env = {**os.environ}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    proc = subprocess.Popen(
        slurm_command(work, profile),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C reaches Snakemake even when the tests run in the background (where
        # the shell ignores SIGINT for its children)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 180
    while time.time() < deadline:
        jobs = jobs_since(first, work)
        if len(jobs) == 2 and all(j["State"] == "RUNNING" for j in jobs):
            break
        time.sleep(1)
    else:
        proc.kill()
        pytest.fail(f"the 2 shards were not submitted and running in time: {jobs}")
    time.sleep(5)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: Snakemake cancels its SLURM jobs
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output[-3000:]
    deadline = time.time() + 60
    while time.time() < deadline:
        states = [j["State"] for j in jobs_since(first, work)]
        if all(s.startswith("CANCELLED by") for s in states):
            break
        time.sleep(1)
    assert all(s.startswith("CANCELLED by") for s in states), (states, output[-3000:])
    assert not (work / "runs" / "metrics" / "cross_encoder_metrics.json").exists()
    # what is left is planned again (nothing half-done is taken as finished; what
    # the cancelled shards finished is there, or put back by the next run)
    dry = run(slurm_command(work, profile, "-n"))
    done = [
        f.relative_to(work)
        for folder in ("per_image", "per_image_ceiling")
        for f in (work / "runs" / folder).glob("*/*/img*.pt")
    ]
    # no per-image file is partial: each one there is the local run's result
    assert_equal_to_local(work, tiny_run, done)
    # what the shards finished and Snakemake removed, kept: the dry run (which
    # changes nothing) counts them as there, the real run puts them back
    kept = {
        f.parent.parent / f.name
        for folder in ("per_image", "per_image_ceiling")
        for f in (work / "runs" / folder).glob("*/*/.kept-slurm-*/img*.pt")
        if not (f.parent.parent / f.name).exists()
    }
    if kept:
        assert f"would put back {len(kept)} per-image file(s)" in dry.stderr
    # 4 configurations x 2 images, and the noise ceiling's 4 second estimates
    left = 12 - len(done) - len(kept)
    assert f"per-image computations left: {left}" in dry.stderr


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("2:00", 2),  # MaxTime=2: minutes:seconds
        ("30", 30),
        ("1:30:00", 90),
        ("1-00:00:00", 1440),
        ("7-00:00:00", 10080),
        ("2-12", 3600),
        ("infinite", None),
        ("UNLIMITED", None),
    ],
)
def test_slurm_times_read_as_sinfo_prints_them(text, minutes):
    assert slurm_time_minutes(text) == minutes


def test_a_shards_time_limit_has_a_margin_a_loaded_node_survives():
    # 3 x (images x seconds + 15 s per configuration) + 120 s, whole minutes
    assert shard_minutes(80, 1, 15.0) == 63  # 3 x 1,215 s + 120 s = 3,765 s
    assert shard_minutes(80, 2, 30.0) == 124  # 3 x 2,430 s + 120 s = 7,410 s
    assert shard_minutes(1, 1, 0.5) == 3  # 3 x 15.5 s + 120 s = 166.5 s
    # the loaded machine: estimated 15 s, one image took 60 s; 4 images
    assert shard_minutes(4, 1, 15.0) * 60 >= 4 * 60 + 15


def test_the_cap_splits_the_work_into_more_shards():
    pending = [((c, "V1"), i) for c in ("a", "b") for i in range(1000)]
    jobs = [1] * len(pending)
    shards, per_shard, limits = plan_shards(pending, jobs, 2, 60.0, cap=600)
    # 1,000 images of 60 s are 3,000 min with the margin: each within 600 min
    assert max(limits) <= 600 and len(shards) > 2
    assert [x for shard in shards for x in shard] == pending
    assert len(plan_shards(pending, jobs, 2, 60.0, cap=10**6)[0]) == 2
    plan = ShardPlan(shards, per_shard, limits, 60.0, "test", 600, "test", 2)
    runtimes = plan.runtimes()
    for shard, limit in zip(shards, limits, strict=True):
        # the jobs' runtimes add up to the shard's limit (Snakemake sums them)
        assert sum(runtimes[item] for item in shard) == limit
    assert plan.asked_minutes() == limits
    # with the noise ceiling's second estimates (2 jobs): never above the limit, the
    # limit itself where a computation of one job takes the odd minute
    mixed = ShardPlan([pending[:3]], [[2, 1, 2]], [7], 60.0, "test", 600, "cap", 1)
    assert mixed.asked_minutes() == [7] and mixed.runtimes()[pending[1]] == 1
    odd = ShardPlan([pending[:2]], [[2, 2]], [7], 60.0, "test", 600, "cap", 1)
    assert odd.asked_minutes() == [6]
    assert plan.over_cap() == []
    assert any("instead of 2, so that each fits the cap" in x for x in plan.lines())
    one = ShardPlan([[pending[0]]], [[1]], [700], 60.0, "test", 600, "cap", 1)
    assert one.over_cap()[0].startswith("shard-00 asks 700 min, above the cap of 600")


@pytest.mark.process
def test_the_paper_at_10000_images_asks_no_allocation_above_the_cap(
    tmp_path, monkeypatch
):
    """
    config/paper.yaml with n_images=10000 for 10 allocations at once: 40,000 images
    at the default 15 s would be 66.7 h per shard; no shard asks more than the cap
    (24 h by default, the profile's shard_max_minutes). The same plan as
    `snakemake -n --profile slurm --configfile config/paper.yaml --config
    n_images=10000` prints (that dry run plans 80,000 jobs: minutes here).
    """
    import yaml

    from multigeom_workflow.scenario import validated_scenario

    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    config["n_images"] = 10000
    monkeypatch.chdir(tmp_path)  # no per-image file there: all 40,000 are left
    scenario = validated_scenario(config, REPO)
    default = shard_plan(scenario, [], wanted=10, partition="none-such")
    assert default.cap == DEFAULT_CAP_MIN == 1440
    assert len(default.shards) > 10 and max(default.limits) <= 1440
    assert sum(map(sum, default.jobs)) == 4 * 10000 + 4 * 2  # and the ceiling's
    capped = shard_plan(scenario, [], wanted=10, profile_cap=480)
    assert max(capped.limits) <= 480 and len(capped.shards) > len(default.shards)


def test_the_dry_runs_shards_are_those_of_a_new_plan_without_a_second_sinfo(
    tmp_path, monkeypatch
):
    """The dry run's estimate shards Snakemake's plan with the parse's seconds per
    image, cap and partition MaxTime (`ShardPlan.replanned`): the same plan as
    `shard_plan` of those computations, and sinfo read once."""
    import yaml

    from multigeom_workflow.planning import slurm as slurm_module
    from multigeom_workflow.planning.plan import pending_images
    from multigeom_workflow.scenario import validated_scenario

    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    scenario = validated_scenario(config, REPO)
    asked = []
    monkeypatch.setattr(
        slurm_module,
        "partition_max_minutes",
        lambda partition: asked.append(partition) or (30, "gpu"),
    )
    first = shard_plan(scenario, [], wanted=3, partition="gpu")
    assert first.cap == 30 and first.cap_source == "MaxTime of partition gpu"
    planned = [(c, i, 1 + (i < 2)) for c, i in pending_images(scenario)[::3]]
    again = first.replanned(planned)
    assert asked == ["gpu"]
    assert again == shard_plan(scenario, [], wanted=3, partition="gpu", planned=planned)
    in_order = [x for shard in again.shards for x in shard]
    assert in_order == [(c, i) for c, i, _ in planned]
    assert sum(map(sum, again.jobs)) == sum(k for _, _, k in planned)
    assert len(again.shards) > 3 and max(again.limits) <= 30  # the cap still holds


def test_a_refused_submission_is_shown_in_sbatchs_words(
    slurm_cluster, tiny_run, tmp_path
):
    """A request the node cannot meet (3 CPUs per GPU of 2): sbatch's reason."""
    work = workdir_with_assets(tiny_run, tmp_path / "work")
    profile = user_profile(tmp_path / "profile", cpus_per_gpu="3")
    cmd = slurm_command(work, profile, "--until", "estimate_image")
    cmd += ["--config", "n_images=1", "noise_ceiling_images=0"]
    first = last_job_id()
    result = run(cmd, env={**STANDIN, STANDIN_ENV: "1"})
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: SLURM refuses the shards' allocation")
    assert "Requested node configuration is not available" in last
    assert "--cpus-per-gpu=3" in last
    assert jobs_since(first, work) == []


@pytest.mark.workflow
def test_the_noise_ceiling_jobs_ask_what_estimate_image_asks(tmp_path):
    """profiles/slurm names the per-image rule once: the noise ceiling's second
    estimates get the same resources, except those set for them by name."""
    import yaml

    profile = user_profile(tmp_path / "profile")
    settings = yaml.safe_load((profile / "profile.yaml").read_text())
    settings["set-resources"].append("estimate_image_ceiling:mem_mb=1000")
    (profile / "profile.yaml").write_text(yaml.safe_dump(settings))
    work = tmp_path / "work"
    work.mkdir()
    dry = run(slurm_command(work, profile, "-n"))
    assert dry.returncode == 0, dry.stderr[-3000:]

    def resources(rule: str) -> list[dict]:
        jobs = [job.split("rule ")[0] for job in dry.stdout.split(f"rule {rule}:")[1:]]
        lines = [next(x for x in j.splitlines() if "resources:" in x) for j in jobs]
        return [
            dict(
                item.split("=", 1) for item in line.split("resources: ")[1].split(", ")
            )
            for line in lines
        ]

    shared = {"gpu": "1", "slurm_partition": PARTITION, "slurm_account": ACCOUNT}
    shared |= {"cpus_per_gpu": "1", "mpi": ""}
    first, second = resources("estimate_image"), resources("estimate_image_ceiling")
    assert len(first) == 8 and len(second) == 4  # tiny.yaml: 1 ceiling image
    assert all(r.items() >= {**shared, "mem_mb": "2000"}.items() for r in first)
    assert all(r.items() >= {**shared, "mem_mb": "1000"}.items() for r in second)


@pytest.mark.workflow
def test_slurm_is_the_executor_in_use_not_an_entry_of_the_profile(tmp_path):
    """
    A cluster with a default partition and no accounts: the profile without its
    slurm_partition and slurm_account lines is still a run for SLURM (shards, their
    time limits, the dry run's SLURM lines), recognised by ``executor: slurm``; the
    resources a shard needs are the rule's.
    """
    import yaml

    profile = user_profile(tmp_path / "profile")
    settings = yaml.safe_load((profile / "profile.yaml").read_text())
    settings["set-resources"] = [
        r for r in settings["set-resources"] if ":slurm_" not in r
    ]
    (profile / "profile.yaml").write_text(yaml.safe_dump(settings))
    work = tmp_path / "work"
    work.mkdir()
    dry = run(slurm_command(work, profile, "-n"))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert (
        "on SLURM (--executor slurm): 2 allocation(s), one per shard, each asking 1 "
        "GPU, 1 CPU core per GPU, 2000 MB, the default partition, the default "
        "account;"
    ) in dry.stderr
    jobs = dry.stdout.split("rule estimate_image:")[1:]
    assert len(jobs) == 8
    for job in jobs:
        line = next(x for x in job.splitlines() if "resources:" in x)
        assert "runtime=" in line and "gpu=1" in line and "mpi=" in line, line
        assert "slurm_partition" not in line


def test_the_shipped_profiles_placeholders_are_refused(slurm_cluster, tmp_path):
    """
    profiles/slurm as shipped (account and partition still "SET-..."): the dry run
    names each placeholder, a real run stops before any submission with one line.
    """
    work = tmp_path / "work"
    work.mkdir()
    profile = REPO / "profiles" / "slurm"
    dry = run(slurm_command(work, profile, "-n"))
    assert dry.returncode == 0, dry.stderr[-3000:]
    warned = [line for line in dry.stderr.splitlines() if "placeholder" in line]
    assert [line.split(" is the")[0] for line in warned] == [
        "warning: profile entry set-resources "
        "estimate_image:slurm_partition=SET-your-gpu-partition",
        "warning: profile entry set-resources "
        "estimate_image:slurm_account=SET-your-account",
    ]
    first = last_job_id()
    result = run(slurm_command(work, profile))
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "config error: profile entry set-resources estimate_image:slurm_partition="
            "SET-your-gpu-partition is the profile's placeholder"
        )
    )
    assert jobs_since(first, work) == []


def compute_records(path: Path) -> list[str]:
    """The per-image files the stand-in estimator computed (one line per compute)."""
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [e["out"] for e in lines if e["what"] == "compute" and e.get("end")]


def test_a_shard_cut_by_its_time_limit_keeps_its_finished_images(
    slurm_cluster, tiny_run, tmp_path
):
    """
    One shard of 4 images (the stand-in estimator: 25 s each) whose time limit is
    cut to 1 minute once 2 images are done: SLURM ends it (TIMEOUT) and Snakemake
    removes the outputs of the whole failed group (what the issue saw). Snakemake's
    retry (the profile's `retries: 1`) takes the finished images back and computes
    only the others. Without a retry, the next run puts them back before it plans:
    that path is the scancel test's (tests/test_slurm_endings.py).
    """
    work = workdir_with_assets(tiny_run, tmp_path / "work")
    profile = user_profile(tmp_path / "profile")
    records = tmp_path / "records.jsonl"
    # 25 s: SLURM ends a job within 30 s of its limit (1 minute at least), before
    # the 4th image is done; the 2 finished first are there by then
    env = {**STANDIN, STANDIN_ENV: "25", RECORD_ENV: str(records)}
    env.update(status_checks_capped(tmp_path / "site"))
    first = last_job_id()
    cmd = slurm_command(work, profile, "--jobs", "1", "--until", "estimate_image")
    cmd += ["--config", "n_images=1", "noise_ceiling_images=0"]
    cmd += ["--retries", "1"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 300
    while len(compute_records(records)) < 2 and time.time() < deadline:
        time.sleep(1)
    finished = compute_records(records)
    assert len(finished) >= 2, proc.poll()
    shard = jobs_since(first, work)
    assert len(shard) == 1 and shard[0]["State"] == "RUNNING", shard
    subprocess.run(
        ["scontrol", "update", f"JobId={shard[0]['JobIDRaw']}", "TimeLimit=1"],
        check=True,
    )
    output, _ = proc.communicate(timeout=600)
    assert "Removing output files of failed job" in output
    jobs = jobs_since(first, work)
    assert jobs[0]["State"] == "TIMEOUT", jobs
    before_cut = set(compute_records(records))
    assert proc.returncode == 0, output[-5000:]
    assert [j["State"] for j in jobs] == ["TIMEOUT", "COMPLETED"], jobs
    # every image computed once: the finished ones were not computed again
    done = compute_records(records)
    files = sorted(str(f) for f in work.glob("runs/per_image/*/*/img*.pt"))
    assert sorted(done) == files and len(files) == 4, (done, files)
    assert set(finished) <= before_cut <= set(files)


def no_accounting_view(dest: Path) -> dict:
    """
    The cluster as a login node without job accounting sees it: its slurm.conf with
    ``AccountingStorageType=accounting_storage/none`` (``SLURM_CONF``), so that the
    real ``sacct`` answers "Slurm accounting storage is disabled" while sbatch and
    squeue still reach the controller.
    """
    dest.mkdir()
    lines = Path("/etc/slurm/slurm.conf").read_text().splitlines()
    kept = [line for line in lines if not line.startswith("AccountingStorage")]
    (dest / "slurm.conf").write_text(
        "\n".join([*kept, "AccountingStorageType=accounting_storage/none", ""])
    )
    shutil.copy("/etc/slurm/gres.conf", dest / "gres.conf")
    return {"SLURM_CONF": str(dest / "slurm.conf")}


def test_a_cluster_without_accounting_is_named_before_any_submission(
    slurm_cluster, tiny_run, tmp_path
):
    """
    Without job accounting the plugin's default status query (sacct) never sees a
    shard end: the run stops first with one line naming the setting; with it given
    (`--slurm-status-command squeue`) the run goes through.
    """
    env = no_accounting_view(tmp_path / "conf")
    said = run(["sacct", "-X", "-n"], env=env)
    assert said.returncode == 1
    assert "accounting storage is disabled" in said.stdout + said.stderr
    work = workdir_with_assets(tiny_run, tmp_path / "work")
    profile = user_profile(tmp_path / "profile")
    env.update(STANDIN)
    env[STANDIN_ENV] = "1"
    cmd = slurm_command(work, profile, "--until", "estimate_image")
    cmd += ["--config", "n_images=1", "noise_ceiling_images=0"]
    first = last_job_id()
    refused = run(cmd, env=env)
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: ") and "slurm-status-command: squeue" in last
    assert "accounting storage is disabled" in last
    assert jobs_since(first, work) == []
    ran = run([*cmd, "--slurm-status-command", "squeue"], env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert len(list(work.glob("runs/per_image/*/*/img0000.pt"))) == 4


def test_kept_files_come_back_only_from_allocations_that_did_not_complete(tmp_path):
    folder = tmp_path / "runs" / "per_image" / "onoff" / "V1"
    folder.mkdir(parents=True)
    jobs = {"11": "TIMEOUT", "12": "COMPLETED", "13": "RUNNING", "14": None}
    for i, job in enumerate(jobs):
        out = folder / f"img{i:04d}.pt"
        out.write_bytes(bytes([i]) * 10)
        kept = keep_finished(out, job)
        assert kept.samefile(out) and kept.parent.name == f".kept-slurm-{job}"
        out.unlink()  # Snakemake removed the outputs of the failed group
    assert keep_finished(folder / "img0000.pt", None) is None  # not in SLURM

    def states(ids):  # as slurm_job_states answers: job 14 is unknown to SLURM
        assert set(ids) <= set(jobs)
        return {j: s for j, s in jobs.items() if s and j in ids}

    restored, ended = restore_after_ended_allocations([folder], states)
    # TIMEOUT and unknown: put back; COMPLETED: dropped (removed on purpose since)
    assert restored == [folder / "img0000.pt", folder / "img0003.pt"]
    assert ended == ["11 TIMEOUT", "14 UNKNOWN"]
    assert (folder / "img0000.pt").read_bytes() == bytes([0]) * 10
    assert not (folder / "img0001.pt").exists()
    left = sorted(d.name for d in folder.glob(".kept-slurm-*"))
    # still running: left alone; unknown (SLURM did not say, or could not be asked:
    # a query that failed while the allocation runs): put back and kept
    assert left == [".kept-slurm-13", ".kept-slurm-14"]
    again, _ = restore_after_ended_allocations([folder], states)
    assert again == []  # nothing put back twice


def test_a_retry_takes_back_what_another_allocation_finished(tmp_path):
    out = tmp_path / "img0007.pt"
    out.write_bytes(b"finished")
    keep_finished(out, "21")
    out.unlink()
    assert take_kept(out, None) is None  # outside SLURM
    assert take_kept(out, "22") == tmp_path / ".kept-slurm-21" / "img0007.pt"
    assert out.read_bytes() == b"finished"
    assert take_kept(out, "22") is None  # there already
    # cleared on purpose (multigeom-workflow clear): no kept name is left to return
    assert drop_kept(out) == [tmp_path / ".kept-slurm-21" / "img0007.pt"]
    out.unlink()
    assert take_kept(out, "22") is None
