"""
A one-machine stand-in for SLURM's commands, so that the real
``snakemake-executor-plugin-slurm`` (2.x) drives the workflow in the tests.

``bin/`` holds ``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``srun``, ``sinfo``,
``scontrol``, ``sacctmgr`` and ``sshare``; each runs this file with its own name. A
submitted batch job runs here, detached, as SLURM's ``slurmstepd`` would run it: its
script (``--wrap`` or the script on stdin) in ``-D``, output to ``--output`` (``%j``
replaced), the submitter's environment (``--export=ALL``) plus ``SLURM_JOB_ID`` and
friends. Its state moves PENDING -> RUNNING -> COMPLETED / FAILED / CANCELLED /
TIMEOUT and is what ``squeue`` and ``sacct`` report, in the formats the plugin asks for
(read from its ``job_status_query.py``, ``submit_string.py``, ``accounts.py``,
``partitions.py``, ``job_cancellation.py`` and the jobstep plugin's ``srun`` call).

Faults are SLURM's: an option sbatch does not know, an unknown partition or account,
an ``srun`` outside an allocation and ``scancel`` of an unknown job fail with SLURM's
message and exit status 1; ``sacct`` reports a cancelled job as ``CANCELLED by <uid>``;
a job past its time limit (``-t``, minutes) ends as TIMEOUT; ``scancel`` sends SIGTERM
to the job and SIGKILL after ``FAKE_SLURM_KILL_WAIT`` seconds (SLURM's KillWait); at
the end of an ``srun`` step its remaining processes are killed (SLURM's cgroup).

The cluster: ``$FAKE_SLURM_DIR`` (jobs/<id>.json, one record per job; submissions.jsonl,
one line per sbatch call), partitions ``gpu`` (default) and ``cpu``, accounts
``$FAKE_SLURM_ACCOUNTS`` (default ``lab``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

PARTITIONS = ["gpu*", "cpu"]
STATE_DIR = Path(os.environ.get("FAKE_SLURM_DIR", "/tmp/fake-slurm"))
KILL_WAIT = float(os.environ.get("FAKE_SLURM_KILL_WAIT", "2"))
#: sbatch options that take a value (as a separate word or after "=").
SBATCH_VALUE = {
    "--job-name",
    "-J",
    "--output",
    "-o",
    "--error",
    "-e",
    "--comment",
    "-A",
    "--account",
    "-p",
    "--partition",
    "-t",
    "--time",
    "--mem",
    "--mem-per-cpu",
    "--ntasks",
    "-n",
    "--cpus-per-task",
    "-c",
    "--cpus-per-gpu",
    "--gpus",
    "-G",
    "--gres",
    "-D",
    "--chdir",
    "--export",
    "-C",
    "--constraint",
    "--qos",
    "--nodes",
    "-N",
    "--clusters",
    "-M",
    "--exclude",
    "-x",
    "--ntasks-per-gpu",
    "--reservation",
    "--wrap",
    "--array",
    "--ntasks-per-node",
}
SBATCH_FLAGS = {"--parsable", "--requeue", "--no-requeue"}


def fail(command: str, message: str) -> None:
    """SLURM's way: one line on stderr, exit status 1."""
    print(f"{command}: error: {message}", file=sys.stderr)
    sys.exit(1)


def jobs_dir() -> Path:
    folder = STATE_DIR / "jobs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def read_job(job_id: str) -> dict | None:
    path = jobs_dir() / f"{job_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def update_job(job_id: str, **changes) -> dict:
    """Change a job's record under a lock (sbatch, the runner and scancel share it)."""
    with open(STATE_DIR / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        job = read_job(job_id) or {}
        job.update(changes)
        tmp = jobs_dir() / f".{job_id}.tmp"
        tmp.write_text(json.dumps(job))
        tmp.replace(jobs_dir() / f"{job_id}.json")
        return job


def new_job_id() -> str:
    with open(STATE_DIR / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counter = STATE_DIR / "next_id"
        n = int(counter.read_text()) if counter.exists() else 1001
        counter.write_text(str(n + 1))
        return str(n)


def parse_minutes(text: str) -> float:
    """SLURM's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; in minutes."""
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
        return int(days) * 1440 + h * 60 + m + s / 60
    if len(parts) == 1:
        return float(parts[0])
    if len(parts) == 2:
        return parts[0] + parts[1] / 60
    return parts[0] * 60 + parts[1] + parts[2] / 60


def sbatch(argv: list[str]) -> None:
    opts: dict[str, str] = {}
    flags = set()
    script_path = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in SBATCH_FLAGS:
            flags.add(arg)
        elif "=" in arg and arg.split("=", 1)[0] in SBATCH_VALUE:
            key, value = arg.split("=", 1)
            opts[key] = value
        elif arg in SBATCH_VALUE:
            if i + 1 >= len(argv):
                fail("sbatch", f"option '{arg}' requires an argument")
            opts[arg] = argv[i + 1]
            i += 1
        elif arg.startswith("-"):
            print(f"sbatch: unrecognized option '{arg}'", file=sys.stderr)
            print('Try "sbatch --help" for more information', file=sys.stderr)
            sys.exit(1)
        else:
            script_path = arg
            if i + 1 < len(argv):
                fail("sbatch", "script arguments are not supported by this fake")
            break
        i += 1
    get = lambda *keys: next((opts[k] for k in keys if k in opts), None)  # noqa: E731
    wrap = get("--wrap")
    if wrap is not None and script_path is not None:
        fail("sbatch", "script arguments not permitted with --wrap option")
    if wrap is None:
        if script_path is None:
            fail("sbatch", "no batch script given")
        script = (
            sys.stdin.read()
            if script_path == "/dev/stdin"
            else Path(script_path).read_text()
        )
        if not script.startswith("#!"):
            fail(
                "sbatch",
                "This does not look like a batch script.  The first line "
                "must start with #! followed by the path to an interpreter.",
            )
    else:
        script = f"#!/bin/sh\n{wrap}\n"
    partition = get("-p", "--partition") or "gpu"
    if partition not in [p.rstrip("*") for p in PARTITIONS]:
        fail("sbatch", "Batch job submission failed: Invalid partition name specified")
    account = get("-A", "--account")
    accounts = os.environ.get("FAKE_SLURM_ACCOUNTS", "lab").split(",")
    if account is not None and account not in accounts:
        fail(
            "sbatch",
            "Batch job submission failed: Invalid account or "
            "account/partition combination specified",
        )
    limit = get("-t", "--time")
    workdir = get("-D", "--chdir") or os.getcwd()
    job_id = new_job_id()
    output = (get("--output", "-o") or str(Path(workdir, "slurm-%j.out"))).replace(
        "%j", job_id
    )
    record = {
        "id": job_id,
        "name": get("--job-name", "-J") or "wrap",
        "comment": get("--comment"),
        "account": account,
        "partition": partition,
        "time_limit_min": parse_minutes(limit) if limit else None,
        "gpus": get("--gpus", "-G"),
        "mem": get("--mem"),
        "cpus_per_task": get("--cpus-per-task", "-c"),
        "workdir": workdir,
        "output": output,
        "script": script,
        "state": "PENDING",
        "submitted": time.time(),
        "user": os.environ.get("USER", "user"),
    }
    update_job(job_id, **record)
    with open(STATE_DIR / "submissions.jsonl", "a") as f:
        f.write(json.dumps({"argv": argv, **record}) + "\n")
    # slurmctld starts the job; the submitter's environment goes with it (--export=ALL)
    subprocess.Popen(
        [sys.executable, __file__, "_run", job_id],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    cluster = get("--clusters", "-M")
    if "--parsable" in flags:
        print(f"{job_id};{cluster}" if cluster else job_id)
    else:
        print(f"Submitted batch job {job_id}")


def run_batch_job(job_id: str) -> None:
    """What slurmstepd does for a batch job: run it, record how it ended."""
    job = read_job(job_id)
    if job.get("state") == "CANCELLED":
        return
    env = dict(os.environ)
    env.update(
        SLURM_JOB_ID=job_id,
        SLURM_JOBID=job_id,
        SLURM_JOB_NAME=job["name"],
        SLURM_JOB_PARTITION=job["partition"],
        SLURM_SUBMIT_DIR=job["workdir"],
        SLURM_CPUS_PER_TASK=str(job["cpus_per_task"] or 1),
        SLURM_NNODES="1",
        SLURMD_NODENAME="fake-node",
    )
    if job["gpus"]:
        env["SLURM_GPUS"] = job["gpus"].split(":")[-1]
    if job["account"]:
        env["SLURM_JOB_ACCOUNT"] = job["account"]
    script = Path(STATE_DIR, "scripts", f"{job_id}.sh")
    script.parent.mkdir(exist_ok=True)
    script.write_text(job["script"])
    script.chmod(0o700)
    Path(job["output"]).parent.mkdir(parents=True, exist_ok=True)
    with open(job["output"], "ab") as out:
        proc = subprocess.Popen(
            [str(script)],
            cwd=job["workdir"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    job = update_job(job_id, state="RUNNING", pgid=proc.pid, started=time.time())
    if job.get("cancelled"):  # scancel came while the job was starting
        kill_job_processes(proc.pid, job_id)
    limit = job["time_limit_min"]
    timed_out = False
    try:
        rc = proc.wait(timeout=limit * 60 if limit else None)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_job_processes(proc.pid, job_id)
        rc = proc.wait()
    kill_job_processes(proc.pid, job_id, grace=0)  # the job's cgroup ends with it
    final = read_job(job_id)
    if final.get("cancelled"):
        state = "CANCELLED"
    elif timed_out:
        state = "TIMEOUT"
    else:
        state = "COMPLETED" if rc == 0 else "FAILED"
    update_job(job_id, state=state, exit_code=rc, ended=time.time())


def processes_with(marker: str) -> list[int]:
    """Pids of this user's processes whose environment holds `marker` (a cgroup)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_job_processes(pgid: int, job_id: str, grace: float = KILL_WAIT) -> None:
    """SIGTERM to the job's processes, SIGKILL after `grace` seconds (KillWait)."""
    marker = f"SLURM_JOB_ID={job_id}"
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        for pid in processes_with(marker):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGTERM:
            deadline = time.time() + grace
            while time.time() < deadline and processes_with(marker):
                time.sleep(0.1)


def scancel(argv: list[str]) -> None:
    ids = [a for a in argv if not a.startswith("-")]
    if not ids:
        fail("scancel", "No job identification provided")
    bad = False
    for job_id in ids:
        job = read_job(job_id.split("_")[0])
        if job is None:
            print(
                f"scancel: error: Kill job error on job id {job_id}: Invalid job id "
                "specified",
                file=sys.stderr,
            )
            bad = True
            continue
        if job["state"] in ("PENDING", "RUNNING"):
            job = update_job(job_id, cancelled=True)
            if job["state"] == "PENDING":
                update_job(job_id, state="CANCELLED", ended=time.time())
            else:
                kill_job_processes(job["pgid"], job_id)
    sys.exit(1 if bad else 0)


def all_jobs() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(jobs_dir().glob("[0-9]*.json"))]


def option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def squeue(argv: list[str]) -> None:
    fmt = option(argv, "--format", "-o") or "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
    name = option(argv, "--name", "-n")
    states_all = option(argv, "--states", "-t") == "all"
    if "--noheader" not in argv and "-h" not in argv:
        print(fmt.replace("%i", "JOBID").replace("%T", "STATE"))
    for job in all_jobs():
        if name and job["name"] != name:
            continue
        if not states_all and job["state"] not in ("PENDING", "RUNNING"):
            continue
        # jobs leave squeue MinJobAge (300 s) after ending
        if job.get("ended") and time.time() - job["ended"] > 300:
            continue
        print(fmt.replace("%i", job["id"]).replace("%T", job["state"]))


def sacct_state(job: dict) -> str:
    if job["state"] == "CANCELLED":
        return f"CANCELLED by {os.getuid()}"
    return job["state"]


def sacct(argv: list[str]) -> None:
    fields = (option(argv, "--format", "-o") or "JobID,JobName,State").split(",")
    name = option(argv, "--name")
    ids = option(argv, "-j", "--jobs")
    parsable = "--parsable2" in argv or "-P" in argv
    rows = []
    for job in all_jobs():
        if name and job["name"] != name:
            continue
        if ids and job["id"] not in [i.split(".")[0] for i in ids.split(",")]:
            continue
        if "-u" in argv or "-nu" in argv:
            user = option(argv, "-u", "-nu")
            if user and job["user"] != user:
                continue
        row = []
        for field in fields:
            key = field.split("%")[0].lower()
            value = {
                "jobidraw": job["id"],
                "jobid": job["id"],
                "state": sacct_state(job),
                "account": job["account"] or "",
                "reason": "None",
                "nodelist": "fake-node",
                "jobname": job["name"],
                "exitcode": f"{job.get('exit_code') or 0}:0",
            }.get(key)
            if value is None:
                fail("sacct", f'Invalid field requested: "{field}"')
            row.append(value)
        rows.append(row)
    noheader = "--noheader" in argv or "-n" in argv or "-nu" in argv
    if not noheader:
        print(("|" if parsable else " ").join(f.split("%")[0] for f in fields))
    for row in rows:
        print(("|" if parsable else " ").join(row))


def srun(argv: list[str]) -> None:
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:  # a real srun would ask for a new allocation: not on this cluster
        fail("srun", "this fake cluster runs srun only inside an allocation")
    i = 0
    takes_value = {"-n", "--ntasks", "-c", "-N", "--jobid", "-J", "--mem-per-cpu"}
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in takes_value:
            i += 1
        i += 1
    command = argv[i:]
    if not command:
        fail("srun", "no command given")
    step = update_job(job_id, steps=(read_job(job_id).get("steps") or 0) + 1)["steps"]
    marker = f"FAKE_SLURM_STEP={job_id}.{step}"
    env = {**os.environ, "SLURM_STEP_ID": str(step)}
    env["FAKE_SLURM_STEP"] = f"{job_id}.{step}"
    proc = subprocess.Popen(command, env=env)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    rc = proc.wait()
    # the step's cgroup ends with it: whatever it started is killed
    for pid in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sys.exit(rc if rc >= 0 else 128 - rc)


def main() -> None:
    command, argv = Path(sys.argv[1]).name, sys.argv[2:]
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if command == "_run":
        run_batch_job(argv[0])
    elif command == "sbatch":
        sbatch(argv)
    elif command == "scancel":
        scancel(argv)
    elif command == "squeue":
        squeue(argv)
    elif command == "sacct":
        sacct(argv)
    elif command == "srun":
        srun(argv)
    elif command == "sinfo":
        print("PARTITION")
        print("\n".join(PARTITIONS))
    elif command == "scontrol":
        if argv[:2] != ["show", "config"]:
            fail("scontrol", f"invalid command {shlex.join(argv)}")
        print("MaxArraySize            = 1001\nMinJobAge               = 300 sec")
    elif command == "sacctmgr":
        for account in os.environ.get("FAKE_SLURM_ACCOUNTS", "lab").split(","):
            print(f"{account:>256}")
    elif command == "sshare":
        for account in os.environ.get("FAKE_SLURM_ACCOUNTS", "lab").split(","):
            print(account)
    else:
        fail(command, "not a command of this fake")


if __name__ == "__main__":
    main()
