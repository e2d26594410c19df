"""
What a cluster site does to a run on SLURM, and what the workflow does: accounting
that stops answering (`multigeom_workflow.on_slurm.status`), a shard's submission
too long for the command line, and a submission accepted while sbatch reported a
failure (`multigeom_workflow.on_slurm.submit`).

The layers' logic with scripted SLURM answers, driving the installed plugin's own
``check_active_jobs`` where it decides what is kept (fast, no process); then each
case on the real cluster of ``.ci/slurm-cluster.sh`` (SLURM 22.05): slurmdbd stopped
while a shard runs, an sbatch whose reply is lost (a PATH shim that runs the real
sbatch and then fails as a timed-out reply does), and a shard of 600 simulated
images on a cluster whose submit line is limited (a PATH shim refusing what SLURM
23.02's ``max_submit_line_size`` refuses: SLURM 22.05 has no such setting).
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from subprocess import PIPE, CalledProcessError, check_output
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO
from test_slurm import (  # noqa: F401  (slurm_cluster: the fixture)
    CLUSTER_SCRIPT,
    STANDIN,
    BackgroundRun,
    compute_records,
    jobs_since,
    last_job_id,
    slurm_cluster,
    slurm_command,
    status_checks_capped,
    user_profile,
    workdir_with_assets,
)

from multigeom_workflow.compute.standin import (
    simulated_scenario,
)
from multigeom_workflow.on_slurm import status
from multigeom_workflow.on_slurm.status import OUTAGE_LINE_S, StatusLayer, _tracking
from multigeom_workflow.on_slurm.submit import Submissions, as_script

# ---------------------------------------------------------------------------------
# A status query that cannot answer (fast: scripted answers)


class Logger:
    def __init__(self):
        self.lines, self.debugs = [], []

    def warning(self, line):
        self.lines.append(line)

    def info(self, line):
        pass

    def debug(self, line):
        self.debugs.append(line)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def job_info(job_id: str, files=()):
    """A ``SubmittedJobInfo`` as the plugin checks it: its id, its job's outputs."""
    return SimpleNamespace(
        external_jobid=job_id,
        job=SimpleNamespace(output=list(files)),
        aux={"slurm_logfile": None},
    )


class PluginExecutor:
    """
    What the plugin's ``Executor.check_active_jobs`` (snakemake-executor-plugin-slurm
    2.8.0) reads of its executor, as the real one sets it, and what it reports.
    """

    def __init__(self):
        self.logger = Logger()
        self.workflow = SimpleNamespace(
            executor_settings=SimpleNamespace(
                status_attempts=5,
                init_seconds_before_status_checks=40,
                keep_successful_logs=True,
                requeue=False,
            )
        )
        self.run_uuid = "run-1"
        self.status_rate_limiter = asyncio.Semaphore(1)  # an async context manager
        self._status_query_failures = self._status_query_calls = 0
        self._status_query_total_seconds = self._status_query_max_seconds = 0.0
        self._status_query_min_seconds = None
        self._status_query_cycle_rows = []
        self._preemption_warning = False
        self._failed_nodes = set()
        self.next_seconds_between_status_checks = 40
        self.succeeded, self.failed = [], []

    def get_status_command(self):
        return "sacct"

    def report_job_success(self, job):
        self.succeeded.append(job.external_jobid)

    def report_job_error(self, job, msg=None, aux_logs=None):
        self.failed.append(job.external_jobid)


@pytest.fixture
def plugin(monkeypatch):
    """The plugin's module, its SLURM probes answered without a process (MinJobAge
    300 s, sacct there)."""
    import snakemake_executor_plugin_slurm as plugin

    monkeypatch.setattr(plugin, "get_min_job_age", lambda: 300)
    monkeypatch.setattr(plugin, "is_query_tool_available", lambda tool: True)
    monkeypatch.setattr(
        plugin.Executor,
        "check_active_jobs",
        getattr(plugin.Executor.check_active_jobs, "__wrapped__", None)
        or plugin.Executor.check_active_jobs,
    )
    # restored after the test: each test lays its own query
    monkeypatch.setattr(plugin, "query_job_status", plugin.query_job_status)
    return plugin


def check(plugin, executor, jobs, layer=None) -> list[str]:
    """One status check of the plugin's own ``check_active_jobs``: the ids of the
    jobs it yields as still running (every other one is dropped by the executor)."""
    method = plugin.Executor.check_active_jobs
    if layer is not None:
        method = _tracking(layer, method)

    async def run():
        return [j.external_jobid async for j in method(executor, jobs)]

    return asyncio.run(run())


def sacct_down(answers=None):
    """The plugin's query as it answers while sacct fails ("Problem talking to the
    database"), then `answers` one per query once it is back."""
    answers = list(answers or [])

    async def query(command, logger):
        if not answers or answers[0] is None:
            if answers:
                answers.pop(0)
            logger.debug(
                "SLURM query command failed: sacct: error: Sending PersistInit msg: "
                "Connection refused\nsacct: error: Problem talking to the database: "
                "Connection refused\n"
            )
            return None, None
        return answers.pop(0), 0.01

    return query


async def no_answer(*args):
    return None


def test_the_plugin_drops_every_job_when_sacct_fails_and_the_layer_keeps_them(plugin):
    """The plugin alone: after 5 failed attempts it yields no job, and the executor
    interface keeps only yielded jobs (plugin issue #207). With the layer, whose
    squeue cannot answer either: every job yielded, none reported."""
    jobs = [job_info("11"), job_info("12")]
    executor = PluginExecutor()
    plugin.query_job_status = sacct_down()
    assert check(plugin, executor, jobs) == []  # forgotten
    layer = StatusLayer(sacct_down(), by_name=no_answer, lookup=no_answer)
    plugin.query_job_status = layer.query
    executor = PluginExecutor()
    assert check(plugin, executor, jobs, layer) == ["11", "12"]
    assert executor.succeeded == executor.failed == []
    assert layer.tracked == {"11": [], "12": []}


def test_the_outage_is_said_in_one_line_at_an_interval_and_its_end_too(plugin):
    clock, logger = Clock(), Logger()
    answers = [{"11": "RUNNING"}, None, None, None, {"11": "COMPLETED"}]
    layer = StatusLayer(
        sacct_down(answers), by_name=no_answer, lookup=no_answer, clock=clock
    )
    plugin.query_job_status = layer.query
    executor = PluginExecutor()
    executor.logger = logger
    jobs = [job_info("11")]
    seen = []
    for step in (0, 40, 40, 30, 40):  # seconds between status checks
        clock.now += step
        seen.append(check(plugin, executor, jobs, layer))
    assert seen == [["11"], ["11"], ["11"], ["11"], []]
    assert executor.succeeded == ["11"]
    said = [x for x in logger.lines if "SLURM's accounting" in x]
    assert said == [
        "SLURM's accounting (sacct) has not answered for 40 s (sacct: error: Problem "
        "talking to the database: Connection refused); 1 allocation(s) still "
        "tracked, each waited for and asked about again at every status check",
        # 70 s after the first line: said again
        "SLURM's accounting (sacct) has not answered for 110 s (sacct: error: "
        "Problem talking to the database: Connection refused); 1 allocation(s) "
        "still tracked, each waited for and asked about again at every status check",
        "SLURM's accounting (sacct) answers again after 150 s: the run goes on, 1 "
        "allocation(s) tracked",
    ]


@pytest.mark.process
def test_while_sacct_fails_the_controller_gives_the_states(plugin):
    asked = []

    async def by_name(name):
        asked.append(name)
        return {"11": "COMPLETED", "12": "RUNNING", "13": "CANCELLED"}

    async def live(ids):
        return {}

    layer = StatusLayer(sacct_down(), live=live, by_name=by_name, lookup=no_answer)
    plugin.query_job_status = layer.query
    executor = PluginExecutor()
    jobs = [job_info("11"), job_info("12"), job_info("13")]
    assert check(plugin, executor, jobs, layer) == ["12"]
    assert asked == ["run-1"]  # the plugin's --name of the run's jobs
    assert executor.succeeded == ["11"] and executor.failed == ["13"]
    line = next(x for x in executor.logger.lines if "has not answered" in x)
    assert line.endswith(
        "3 allocation(s) still tracked, their states read from SLURM's controller "
        "(squeue) meanwhile"
    )


@pytest.mark.process
def test_a_job_without_a_state_beyond_the_limit_is_looked_up_never_dropped(
    plugin, tmp_path
):
    """No state in any answer for UNKNOWN_LIMIT_S: the controller's where it knows
    it; where it no longer does, its shard's files decide; where it does not answer,
    waited for."""
    done = [tmp_path / "img0000.pt", tmp_path / "img0001.pt"]
    for f in done:
        f.write_bytes(b"x")
    jobs = [
        job_info("21", done),  # ended unseen with its files
        job_info("22", [*done, tmp_path / "img0002.pt"]),  # ended unseen, one missing
        job_info("23"),  # the controller still runs it
        job_info("24"),  # the controller does not answer for it
    ]
    known = {"21": "", "22": "", "23": "RUNNING", "24": None}

    async def lookup(job):
        return known[job]

    async def by_name(name):
        return {}  # squeue answers: none of them is held any more

    clock = Clock()
    layer = StatusLayer(
        sacct_down([{}, None, None]), by_name=by_name, lookup=lookup, clock=clock
    )
    plugin.query_job_status = layer.query
    executor = PluginExecutor()
    assert check(plugin, executor, jobs, layer) == ["21", "22", "23", "24"]
    clock.now += status.UNKNOWN_LIMIT_S - 1
    assert check(plugin, executor, jobs, layer) == ["21", "22", "23", "24"]
    clock.now += 2
    assert check(plugin, executor, jobs, layer) == ["23", "24"]
    assert executor.succeeded == ["21"] and executor.failed == ["22"]
    lines = executor.logger.lines
    assert any(
        "allocation 21 had no state in SLURM's answers for 301 s and the controller "
        "no longer knows it (scontrol show job): it ended unseen, with all 2 of its "
        "shard's files: taken as completed" in x
        for x in lines
    )
    assert any(
        "22" in x and "1 of its shard's 3 files missing: failed" in x for x in lines
    )
    assert any("allocation 23" in x and "says RUNNING" in x for x in lines)
    assert not any("allocation 24" in x for x in lines)


def test_an_allocation_of_the_run_that_no_shard_tracks_is_cancelled(plugin):
    """Seen queued or running in two answers in a row while no shard tracks it and
    no sbatch gave its id (a lost reply found only after its retry was submitted)."""
    answers = [
        {"31": "RUNNING", "32": "PENDING", "30": "COMPLETED"},
        {"31": "RUNNING", "32": "RUNNING", "30": "COMPLETED", "33": "RUNNING"},
        {"31": "RUNNING", "32": "RUNNING", "33": "RUNNING"},
    ]
    cancelled = []

    async def cancel(job):
        cancelled.append(job)

    layer = StatusLayer(sacct_down(answers), cancel=cancel, lookup=no_answer)
    layer.submitted = lambda: {"31", "33"}  # 33: submitted after the check began
    plugin.query_job_status = layer.query
    executor = PluginExecutor()
    for _ in range(3):
        assert check(plugin, executor, [job_info("31")], layer) == ["31"]
    assert cancelled == ["32"]
    line = next(x for x in executor.logger.lines if "tracked by no shard" in x)
    assert line.startswith("SLURM allocation 32 of this run (RUNNING) is tracked")


def test_install_lays_the_query_the_tracking_and_the_submissions_once(monkeypatch):
    import snakemake_executor_plugin_slurm as plugin

    for name in ("query_job_status", "subprocess"):
        monkeypatch.setattr(plugin, name, getattr(plugin, name))
    monkeypatch.setattr(
        plugin.Executor, "check_active_jobs", plugin.Executor.check_active_jobs
    )
    original = getattr(plugin.query_job_status, "__self__", None)
    original = original.original if original else plugin.query_job_status
    monkeypatch.setattr(plugin, "query_job_status", original)
    layer = status.install()
    assert plugin.query_job_status == layer.query and layer.original is original
    submissions = vars(plugin)["subprocess"]  # the layer in the module's place
    assert isinstance(submissions, Submissions)
    assert layer.submitted == submissions.submitted_ids
    assert status.install() is layer
    wrapped = plugin.Executor.check_active_jobs
    assert inspect.isasyncgenfunction(wrapped.__wrapped__)
    assert "active_jobs" in inspect.signature(wrapped.__wrapped__).parameters


@pytest.mark.workflow
def test_the_plugin_is_as_the_layers_read_it():
    """snakemake-executor-plugin-slurm 2.8.0: a failed query is (None, None) and
    then no job is yielded; a job missing from an answer is yielded; submissions
    by ``subprocess.Popen`` with the command last as ``--wrap`` (quotes escaped) or
    as a script on stdin; the script setting's name."""
    import snakemake_executor_plugin_slurm as plugin
    from snakemake_executor_plugin_slurm import job_status_query, submit_string

    query = inspect.getsource(job_status_query.query_job_status)
    assert query.count("return None, None") == 3
    checks = inspect.getsource(
        getattr(
            plugin.Executor.check_active_jobs,
            "__wrapped__",
            plugin.Executor.check_active_jobs,
        )
    )
    assert "if status_of_jobs is not None:" in checks
    assert "if status_lookup_id is None:" in checks
    run_job = inspect.getsource(plugin.Executor.run_job)
    assert "process = subprocess.Popen(\n                    call,\n" in run_job
    assert "exec_job_escaped = exec_job.replace('\"', '\\\\\"')" in run_job
    assert "call += f' --wrap=\"{exec_job_escaped}\"'" in run_job
    assert 'sbatch_script = "\\n".join(["#!/bin/sh", exec_job])' in run_job
    assert 'call += " /dev/stdin"' in run_job
    assert 'slurm_jobid = out.strip().split(";")[0]' in run_job
    command = inspect.getsource(submit_string.get_submit_command)
    assert 'f"--job-name {safe_quote(params.run_uuid)} "' in command
    assert 'f"--comment {safe_quote(params.comment_str)}"' in command
    names = {f.name for f in plugin.ExecutorSettings.__dataclass_fields__.values()}
    assert "pass_command_as_script" in names


def test_the_profile_submits_each_shard_as_a_script():
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "profile.yaml").read_text())
    assert profile["slurm-pass-command-as-script"] is True


# ---------------------------------------------------------------------------------
# Submissions (fast: a scripted sbatch and squeue)

NAME, COMMENT = "3f1c-run", "rule_shard-00_estimate_image"


def plugin_call(command: str, form: str = "wrap") -> str:
    """A submission as the plugin's ``run_job`` writes it (2.8.0)."""
    call = (
        f"sbatch --parsable --job-name {NAME} --output /w/%j.log --export=ALL "
        f"--comment {COMMENT} -A local -p gpu -t 10 --mem 2000 --cpus-per-gpu=1 "
        "-D /w --gpus=1"
    )
    if form == "wrap":
        return call + f' --wrap="{command.replace(chr(34), chr(92) + chr(34))}"'
    return call + " /dev/stdin"


class Sbatch:
    """
    sbatch as a scripted cluster answers each call: ``accept`` (a new job, its id
    written), ``lost`` (a new job, and the reply lost: sbatch's timeout), ``E2BIG``
    (Linux refuses to start it: ``Popen`` raises), or a refusal in sbatch's words;
    the jobs it made listed by `jobs_named` as squeue lists them.
    """

    def __init__(self, answers):
        self.answers, self.calls, self.jobs = list(answers), [], []

    def popen(self, call, **kwargs):
        assert kwargs["shell"] is True and kwargs["text"] is True
        answer = self.answers.pop(0)
        if answer == "E2BIG":
            self.calls.append((call, None))
            raise OSError(errno.E2BIG, "Argument list too long")
        return SbatchProcess(self, call, answer)

    def jobs_named(self, name):
        return list(self.jobs) if name == NAME else []


class SbatchProcess:
    def __init__(self, sbatch, call, answer):
        self.sbatch, self.call, self.answer = sbatch, call, answer
        self.returncode = None

    def communicate(self, input=None):
        self.sbatch.calls.append((self.call, input))
        if self.answer in ("accept", "lost"):
            job = str(40 + len(self.sbatch.jobs))
            self.sbatch.jobs.append((job, "PENDING", COMMENT))
            if self.answer == "accept":
                self.returncode = 0
                return f"{job}\n", ""
            self.returncode = 1
            return "", TIMED_OUT + "\n"
        self.returncode = 1
        return "", self.answer + "\n"


def submissions(sbatch: Sbatch):
    said, slept = [], []
    layer = Submissions(
        popen=sbatch.popen,
        jobs_named=sbatch.jobs_named,
        say=said.append,
        sleep=slept.append,
    )
    return layer, said, slept


def submit_like_the_plugin(layer, call, script=None):
    """``run_job``'s submission: the module's ``Popen`` of `call` (``shell=True``,
    pipes), then ``communicate(input=script)``."""
    opened = layer.Popen
    proc = opened(call, shell=True, text=True, stdin=PIPE, stdout=PIPE, stderr=PIPE)
    out, err = proc.communicate(input=script)
    return out, err, proc.returncode


TIMED_OUT = (
    "sbatch: error: Batch job submission failed: Socket timed out on send/recv "
    "operation"
)


def test_a_lost_reply_gives_the_accepted_job_and_no_second_one():
    sbatch = Sbatch(["lost"])  # accepted, and its reply lost
    layer, said, slept = submissions(sbatch)
    call = plugin_call("python -m snakemake --target-jobs 'a' 'b'")
    assert submit_like_the_plugin(layer, call) == ("40\n", "", 0)
    assert len(sbatch.calls) == 1 and slept == []  # found at the first look
    assert said == [
        "sbatch reported a failure (" + TIMED_OUT + ") for the shard of comment "
        f"{COMMENT}, but SLURM had accepted it: allocation 40 is that shard's, "
        "tracked; no second one is submitted"
    ]
    assert layer.submitted_ids() == {"40"}


def test_a_lost_reply_seen_late_is_taken_at_the_retry():
    """The controller lists the job only after the looks that follow the failure:
    the failure stands, and the shard's retry takes the job instead of submitting."""
    sbatch = Sbatch(["lost"])
    layer, said, slept = submissions(sbatch)
    looks = []

    def jobs_named(name):  # the job listed from the fifth look on
        looks.append(name)
        return sbatch.jobs_named(name) if len(looks) > 4 else []

    layer.jobs_named = jobs_named
    call = plugin_call("true")
    assert submit_like_the_plugin(layer, call) == ("", TIMED_OUT + "\n", 1)
    assert slept == [2.0, 4.0] and said == [] and len(looks) == 4
    assert submit_like_the_plugin(layer, call) == ("40\n", "", 0)  # the retry
    assert len(sbatch.calls) == 1 and layer.submitted_ids() == {"40"}
    assert said == [
        "SLURM already queues or runs allocation 40 of this run for the shard of "
        f"comment {COMMENT} (an earlier sbatch reported a failure that SLURM had "
        "accepted): tracked as that shard instead of submitting it again"
    ]


def test_a_retry_is_submitted_while_its_ended_allocation_completes():
    """The shard's first allocation handed to the plugin, ended (its time limit:
    the controller still shows it COMPLETING) and retried: a new submission."""
    sbatch = Sbatch(["accept", "accept"])
    layer, said, _ = submissions(sbatch)
    call = plugin_call("true")
    assert submit_like_the_plugin(layer, call) == ("40\n", "", 0)
    sbatch.jobs[0] = ("40", "COMPLETING", COMMENT)
    assert submit_like_the_plugin(layer, call) == ("41\n", "", 0)
    assert len(sbatch.calls) == 2 and said == []
    assert layer.submitted_ids() == {"40", "41"}


def test_a_refused_submission_stays_refused_after_looking_for_it():
    refused = "sbatch: error: Batch job submission failed: Invalid account"
    sbatch = Sbatch([refused])
    layer, said, slept = submissions(sbatch)
    call = plugin_call("true")
    assert submit_like_the_plugin(layer, call) == ("", refused + "\n", 1)
    assert slept == [2.0, 4.0] and said == [] and layer.submitted_ids() == set()


@pytest.mark.parametrize(
    "refusal",
    [
        "E2BIG",  # Linux: one argument above 128 KiB, "Argument list too long"
        # SLURM 23.02 and later, a submit line above max_submit_line_size
        "sbatch: error: Batch job submission failed: Pathname of a file, directory "
        "or other parameter too long",
    ],
)
def test_a_submission_too_long_is_made_again_as_a_script(refusal):
    command = "python -m snakemake --target-jobs " + " ".join(
        f"'estimate_image:encoder=inception,area=V1,index={i:04d}'" for i in range(3)
    )
    command += ' --set-resources "a:b=1" --config \'x="y z"\' && echo \\"done\\"'
    sbatch = Sbatch([refusal, "accept"])
    layer, said, _ = submissions(sbatch)
    out = submit_like_the_plugin(layer, plugin_call(command))
    assert out == ("40\n", "", 0)
    # what the plugin itself submits with pass_command_as_script
    assert sbatch.calls[-1] == (
        plugin_call(command, "script"),
        "#!/bin/sh\n" + command,
    )
    assert len(said) == 1 and said[0].startswith(
        "a shard's submission is longer than "
        + ("this machine: Argument list too long" if refusal == "E2BIG" else "the")
    )


@pytest.mark.process
def test_the_wrapped_command_is_the_one_the_shell_would_run():
    """`as_script` undoes the plugin's escaping: the script runs what ``sh -c``
    gives sbatch's --wrap (here, both through a real shell)."""
    command = 'printf "%s|" a "b c" \'d"e\' $HOME'
    call, script = as_script(plugin_call(command))
    wrapped = plugin_call(command).split(' --wrap="', 1)[1][:-1]
    via_wrap = subprocess.run(
        ["sh", "-c", f'sh -c "{wrapped}"'], capture_output=True, text=True
    ).stdout
    via_script = subprocess.run(
        ["sh"], input=script, capture_output=True, text=True
    ).stdout
    assert via_wrap == via_script == f'a|b c|d"e|{os.environ["HOME"]}|'
    assert call.endswith(" /dev/stdin")


def test_other_commands_are_the_modules_own():
    sbatch = Sbatch([])
    calls = []
    layer, _, _ = submissions(sbatch)
    layer.popen = lambda *a, **k: calls.append((a, k)) or "proc"
    opened = layer.Popen
    assert opened("sbatch --test-only --wrap=true", shell=True) == "proc"
    assert opened(["sacct", "-X"], stdout=PIPE) == "proc"
    assert layer.CalledProcessError is CalledProcessError
    assert layer.check_output is check_output
    assert len(calls) == 2 and sbatch.calls == []


# ---------------------------------------------------------------------------------
# The real cluster

#: The most seconds a run may take here (no hang).
RUN_LIMIT_S = 240
#: The cluster's daemons' pid files (.ci/slurm-cluster.sh, its $STATE).
STATE = Path(os.environ.get("MULTIGEOM_SLURM_STATE", "/var/lib/multigeom-slurm"))


def shim(folder: Path, name: str, body: str) -> Path:
    """A command `name` in `folder` (put first on PATH) running `body` in bash, the
    real one as ``$REAL``."""
    folder.mkdir(parents=True, exist_ok=True)
    real = shutil.which(name)
    path = folder / name
    path.write_text(f"#!/bin/bash\nREAL={real}\n{body}\n")
    path.chmod(0o755)
    return folder


def shard_of_four(tmp_path, tiny_run, profile=None):
    """One shard of the reduced demo's 4 first estimates."""
    work = workdir_with_assets(tiny_run, tmp_path / "work")
    profile = profile or user_profile(tmp_path / "profile")
    cmd = slurm_command(work, profile, "--jobs", "1", "--until", "estimate_image")
    return work, [*cmd, "--config", "n_images=1", "noise_ceiling_images=0"]


@contextmanager
def accounting_stopped():
    """slurmdbd stopped (sacct: "Problem talking to the database: Connection
    refused"), started again by the cluster's script whatever happens."""
    stop = ["start-stop-daemon", "--stop", "--quiet", "--retry", "TERM/20/KILL/5"]
    try:
        subprocess.run([*stop, "--pidfile", str(STATE / "slurmdbd.pid")], check=True)
        said = subprocess.run(
            ["sacct", "-X", "-n", "-S", "now"], capture_output=True, text=True
        )
        assert said.returncode != 0 and "Problem talking to the database" in (
            said.stderr
        ), said
        yield
    finally:
        subprocess.run(
            [CLUSTER_SCRIPT, "start"], capture_output=True, text=True, timeout=300
        )


def states_once_accounting_is_back(first, work, n, seconds=60) -> list[str]:
    """The run's jobs' states once slurmdbd has taken the controller's records."""
    deadline = time.time() + seconds
    while True:
        try:
            states = [j["State"] for j in jobs_since(first, work)]
        except subprocess.CalledProcessError:
            states = []
        if (len(states) == n and "RUNNING" not in states) or time.time() > deadline:
            return states
        time.sleep(1)


def test_accounting_down_during_a_shard_the_run_ends_with_every_image(
    slurm_cluster,  # noqa: F811  (the fixture)
    tiny_run,
    tmp_path,
):
    """
    slurmdbd stopped once the shard's first image is done, for 30 s (as on the
    cluster where the run hung: longer than several status checks, 5 s at most
    here; the shard's last 3 images, 8 s each, end within it; the outage line's
    interval, `OUTAGE_LINE_S`, is the unit test's), then started again: the run ends
    by itself, every image there, computed once, and a line about the outage at
    most every `OUTAGE_LINE_S` (the plugin alone forgot the shard at the first check
    and waited for ever). 30 s and 8 s, not the 90 s and 20 s of before: the same
    behaviour, a minute less of the suite (2026-12-05).
    """
    work, cmd = shard_of_four(tmp_path, tiny_run)
    run = BackgroundRun(tmp_path, cmd, seconds=8)
    run.wait_for("the first image", lambda: len(compute_records(run.records)) >= 1)
    with accounting_stopped():
        stopped = time.time()
        while time.time() < stopped + 30 and run.proc.poll() is None:
            time.sleep(0.5)
        down_s = time.time() - stopped
    output = run.output(RUN_LIMIT_S)
    assert run.proc.returncode == 0, output[-5000:]
    assert down_s > 20, down_s  # the shard's 3 images ran while accounting was down
    files = sorted(work.glob("runs/per_image/*/*/img*.pt"))
    assert len(files) == 4, files
    assert sorted(compute_records(run.records)) == [str(f) for f in files]
    said = [x for x in output.splitlines() if "SLURM's accounting (sacct)" in x]
    outage = [x for x in said if "has not answered for" in x]
    assert 1 <= len(outage) <= 1 + down_s // OUTAGE_LINE_S, said
    assert len(said) - len(outage) <= 1, said  # its end, if the run saw it
    for line in outage:
        assert "1 allocation(s) still tracked" in line, line
        # sacct's own error: "Problem talking to the database: Connection refused",
        # or, while slurmdbd stops, "DBD_GET_JOBS_COND failure: Unspecified error"
        assert "(sacct: error: " in line, line
    assert states_once_accounting_is_back(run.first, work, 1) == ["COMPLETED"]


def test_a_submission_whose_reply_is_lost_runs_once(
    slurm_cluster,  # noqa: F811  (the fixture)
    tiny_run,
    tmp_path,
):
    """
    sbatch accepts the shard and then reports "Socket timed out on send/recv
    operation" (a shim: the real sbatch, then the failure, once): the run takes the
    job SLURM runs, says so, and submits no second one (the plugin alone failed the
    shard and its retry ran beside it).
    """
    work, cmd = shard_of_four(tmp_path, tiny_run)
    once = tmp_path / "lost-once"
    folder = shim(
        tmp_path / "bin",
        "sbatch",
        f"""for a in "$@"; do [[ $a == --test-only ]] && exec "$REAL" "$@"; done
if [[ -e {once} ]]; then exec "$REAL" "$@"; fi
touch {once}
"$REAL" "$@" >/dev/null || exit
echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv \
operation" >&2
exit 1""",
    )
    run = BackgroundRun(tmp_path, cmd, seconds=1, path_first=folder)
    output = run.output(RUN_LIMIT_S)
    assert run.proc.returncode == 0, output[-5000:]
    jobs = jobs_since(run.first, work)
    assert [j["State"] for j in jobs] == ["COMPLETED"], jobs
    line = next(x for x in output.splitlines() if "sbatch reported a failure" in x)
    assert f"allocation {jobs[0]['JobIDRaw']} is that shard's" in line
    assert "Socket timed out on send/recv operation" in line
    computed = compute_records(run.records)
    assert len(computed) == len(set(computed)) == 4, computed


#: A submit line limit (bytes) as SLURM 23.02's SchedulerParameters
#: max_submit_line_size sets it (its check of the whole command line, and sbatch's
#: message then: ESLURM_PATHNAME_TOO_LONG, slurm_errno.c).
SUBMIT_LINE_MAX = 16384
#: Images of the long shard: its command about twice the site's limit (Linux's
#: 128 KiB for one argument, the other refusal, is the same path:
#: test_a_submission_too_long_is_made_again_as_a_script[E2BIG]; 2,500 images, above
#: it here too, cost the suite half a minute of Snakemake planning the group).
N_IMAGES = 600


def test_a_shard_of_600_images_submits_on_a_cluster_with_a_short_submit_line(
    slurm_cluster,  # noqa: F811  (the fixture)
    tmp_path,
):
    """
    One shard of 600 simulated images (its command about twice the site's limit)
    through profiles/slurm: one allocation,
    accepted, whose batch script carries every image and whose submit line is short;
    cancelled once accepted (computing the images is not the point; Snakemake's own
    planning of a group this large takes most of the test's time).
    """
    root = tmp_path / "sim"
    config, env = simulated_scenario(root, 1, N_IMAGES)
    profile = user_profile(tmp_path / "profile", shard_max_minutes="100000")
    folder = shim(
        tmp_path / "bin",
        "sbatch",
        f"""line="sbatch $*"
if (( ${{#line}} > {SUBMIT_LINE_MAX} )); then
  echo "sbatch: error: Batch job submission failed: Pathname of a file, directory \
or other parameter too long" >&2
  exit 1
fi
exec "$REAL" "$@\"""",
    )
    work = tmp_path / "work"
    work.mkdir()
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    cmd += ["--directory", str(work), "--profile", str(profile)]
    cmd += ["--configfile", str(config), "--jobs", "1", "--until", "estimate_image"]
    cmd += ["--config", "noise_ceiling_images=0", "--retries", "0"]
    cmd += ["--slurm-init-seconds-before-status-checks", "1"]
    run = BackgroundRun(tmp_path, cmd, seconds=0, path_first=folder, env=env)
    run.wait_for(
        "the shard's allocation",
        lambda: jobs_since(run.first, work),
        seconds=240,
    )
    (job,) = jobs_since(run.first, work)
    script = subprocess.run(
        ["scontrol", "write", "batch_script", job["JobIDRaw"], "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert script.startswith("#!/bin/sh\n")
    assert script.count("'estimate_image:") == N_IMAGES
    assert len(script) > 2 * SUBMIT_LINE_MAX
    line = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job["JobIDRaw"], "-o", "SubmitLine"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # (the shim ran the real sbatch by its path)
    assert line.split()[0].endswith("sbatch") and " /dev/stdin" in line, line[:300]
    assert len(line) < SUBMIT_LINE_MAX, line[:300]
    if run.proc.poll() is None:
        os.killpg(run.proc.pid, signal.SIGINT)  # Snakemake cancels its allocation
    output = run.output(120)
    assert "too long" not in output, output[-3000:]
    assert [j["JobIDRaw"] for j in jobs_since(run.first, work)] == [job["JobIDRaw"]]
