"""
Snakemake executor plugin for Modal (https://modal.com): every job Snakemake hands it
(a group job as one) runs in one Modal container, with its files staged through a Modal
Volume.

Use: ``snakemake --executor modal --jobs 10 --modal-gpu A100 --modal-volume myrun``.
A job may carry its own GPU and budget as resources (``modal_gpu``,
``modal_max_cost_usd``), which a workflow can set from its config so that a dry run
sees them too; see README.md, "Which setting wins".
Credentials come from Modal's own configuration (``modal token new``, or the
``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` environment variables); the plugin never
passes them to jobs, logs or the volume.
"""

import asyncio
import hashlib
import json
import math
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.real import RealExecutor
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.settings import (
    CommonSettings,
    ExecutorSettingsBase,
)
from snakemake_interface_executor_plugins.utils import encode_target_jobs_cli_args

from . import preflight
from .calls import (
    MOUNT,
    STARTUP_S,
    Admission,
    ContainerCall,
    Ledger,
    Outcome,
    Pauses,
    RunApp,
    heartbeat_interval_s,
)
from .container import JOB_LOG, TARGETS
from .image import container_image
from .prices import GpuRequest, parse_gpu
from .staging import VolumeStager, default_prefix, relative_to_workdir

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

_DIRECTORY_ARG = re.compile(r"--directory (?:'[^']*'|\"[^\"]*\"|\S+)")
#: Modal's longest function timeout, seconds (24 h).
MAX_TIMEOUT_S = 86400
#: Environment variables never passed to a job, whatever ``--envvars`` says.
SECRET_ENVVARS = ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
#: Lines of a failed job's log printed with its error.
LOG_TAIL_LINES = 30


def _words(value) -> list[str]:
    """A list setting from the command line (a list) or a profile (a list or words)."""
    return value.split() if isinstance(value, str) else [str(v) for v in value]


def _lines(value) -> list[str]:
    """A list of commands: each is one string (words are not split)."""
    return [value] if isinstance(value, str) else [str(v) for v in value]


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    """Settings of the Modal executor, given as ``--modal-<name>`` or in a profile.

    (Annotations use ``typing`` names: Snakemake reads them at run time.)
    """

    gpu: Optional[str] = field(
        default=None,
        metadata={
            "help": "--modal-gpu: the GPU type (and count, e.g. 'H100:2') for jobs "
            "that request a 'gpu' resource without a 'modal_gpu' or 'gpu_model' "
            "resource (those win), e.g. 'A100', 'A100-80GB', 'H100', 'L4', or a "
            "fallback list that Modal tries in order, e.g. 'A100-80GB,H100'. Jobs "
            "requesting no GPU get none.",
        },
    )
    volume: str = field(
        default="snakemake",
        metadata={
            "help": "--modal-volume: name of the Modal Volume that holds the staged "
            "sources, inputs and outputs (created if missing).",
        },
    )
    volume_prefix: Optional[str] = field(
        default=None,
        metadata={
            "help": "--modal-volume-prefix: folder of the volume that mirrors the "
            "working directory (default: the working directory's name and a hash of "
            "its absolute path, so that two checkouts never share files).",
        },
    )
    timeout: int = field(
        default=3600,
        metadata={
            "help": "--modal-timeout: seconds after which a container is stopped, for "
            "jobs without a 'runtime' resource (minutes) (Modal allows up to 86400).",
        },
    )
    max_cost_usd: Optional[float] = field(
        default=None,
        metadata={
            "help": "--modal-max-cost-usd: the most USD the run's GPUs may cost, at "
            "every moment: a job starts only if its worst case (price x (timeout + "
            "start-up)) fits beside what is spent and what the running calls may "
            "still cost (it waits while they run), and every call is cancelled when "
            "the spending reaches it. A job's 'modal_max_cost_usd' resource is a "
            "budget for that job as well; where both are set, the lower wins.",
        },
    )
    startup_seconds: int = field(
        default=STARTUP_S,
        metadata={
            "help": "--modal-startup-seconds: the most seconds a container may take "
            "to start (declared as Modal's startup_timeout: a container that takes "
            "longer fails, and its job with it), and what the budget keeps aside "
            "beyond each call's timeout (with the status check that sees its end). "
            "Raise it where a large image starts slowly.",
        },
    )
    pip: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "--modal-pip: pip requirements of the jobs, installed in the "
            "container image; a name without a version is pinned to the version "
            "installed locally (Snakemake is always included).",
            "nargs": "+",
            "parse_func": _words,
            "unparse_func": _words,
        },
    )
    local_packages: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "--modal-local-packages: importable names of local Python packages "
            "to copy into the container image (e.g. the workflow's own package).",
            "nargs": "+",
            "parse_func": _words,
            "unparse_func": _words,
        },
    )
    image_commands: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "--modal-image-commands: shell commands run when the container "
            "image is built, after the pip installs (e.g. to cache model weights).",
            "nargs": "+",
            "parse_func": _lines,
            "unparse_func": _lines,
        },
    )
    gpu_prices: Optional[List[str]] = field(
        default=None,
        metadata={
            "help": "--modal-gpu-prices: prices of GPU types, USD per GPU-second as "
            "Modal's price page shows them, as TYPE=USD (e.g. "
            "'RTX-PRO-6000=0.000842'): for a type the plugin's table lacks (it "
            "refuses a GPU without a price, which no budget could guard) or whose "
            "price changed; they win over the table.",
            "nargs": "+",
            "parse_func": _words,
            "unparse_func": _words,
        },
    )
    sync_seconds: int = field(
        default=30,
        metadata={
            "help": "--modal-sync-seconds: while a job runs, its finished outputs are "
            "committed to the volume every this many seconds.",
        },
    )

    def __post_init__(self):
        # Snakemake makes these settings for --executor modal, in a dry run too: a
        # workflow's dry run can say what a real run would refuse (preflight)
        preflight._record(self)


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=True,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=False,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
    can_transfer_local_files=True,
)


class Executor(RemoteExecutor):
    """Runs each job in a Modal container; see the module docstring."""

    def __post_init__(self):
        import modal

        self.settings: ExecutorSettings = self.workflow.executor_settings
        # Snakemake's status thread runs from the start (RemoteExecutor.__init__),
        # while the image is built: the state it reads comes first
        self.ledger = Ledger(
            self.settings.max_cost_usd, startup_s=float(self.settings.startup_seconds)
        )
        # external job id -> its running call; external id -> a job waiting for
        # budget; calls of failed jobs whose cancel has not reached Modal (they may
        # bill); failed job -> its spec, until handle_job_error brings its files
        # once the run's app has ended under it (Modal ended a call without a cancel
        # from this run): the line that said so; every call then fails, no job starts
        self._app_ended: str | None = None
        # when this process did not run (no heartbeat of Modal's client left it)
        self.pauses = Pauses(heartbeat_interval_s())
        self._calls: dict[str, ContainerCall] = {}
        self._waiting: dict[str, object] = {}
        self._orphans: list[ContainerCall] = []
        self._failed: dict = {}
        self._calls_lock = threading.Lock()
        # a job's admission and its registration as running happen under this lock,
        # whether submitted (Snakemake's thread) or started after waiting (status
        # thread): two jobs never pass the guard against the same budget left
        self._admit_lock = threading.RLock()
        self._waited = 0
        # budget checks: one at a time (the status loop's, and those made while
        # files download: `check_budget`), and when the last one was made
        self._budget_lock = threading.Lock()
        self._budget_checked: float | None = None
        self._budget_gap_s = 0.0
        self.workdir = Path.cwd()
        # everything the run would refuse, said at once before the image is built
        problems = preflight.settings_problems(self.settings, self.workflow)
        self.default_gpu = None
        if self.settings.gpu is not None and not problems:
            self.default_gpu = parse_gpu(self.settings.gpu)
        if not problems:
            problems = preflight.job_problems(self, self.planned_jobs(), self.workdir)
        if problems:
            raise WorkflowError(
                "Modal: the run would be refused, nothing was built or submitted:\n"
                + "\n".join(f"  {p}" for p in problems)
            )
        prefix = self.settings.volume_prefix or default_prefix(self.workdir)
        self.volume = modal.Volume.from_name(
            self.settings.volume, create_if_missing=True
        )
        self.stager = VolumeStager(self.volume, prefix, self.workdir)
        self.image = container_image(
            self.settings.pip or [],
            self.settings.local_packages or [],
            self.settings.image_commands or [],
        )
        self._sources: list[str] | None = None
        env = self.job_env()
        self.logger.info(
            f"Modal: building the container image (or finding it built) before any "
            f"job; volume folder {self.settings.volume}:/{self.stager.prefix}"
        )
        self.app = RunApp(
            f"snakemake-{self.stager.prefix}"[:64],
            self.image,
            self.volume,
            min(self.settings.timeout, MAX_TIMEOUT_S),
            self.default_gpu,
            secrets=[modal.Secret.from_dict(env)] if env else [],
            fallback_gpus=self.planned_fallback_gpus(),
            startup_timeout_s=int(self.settings.startup_seconds),
        )

    def planned_fallback_gpus(self) -> list[GpuRequest]:
        """
        The GPU fallback lists that the planned jobs' resources request (``modal_gpu``
        such as ``A100-80GB,H100``): Modal 1.6 takes a list only where a function is
        declared, so the app declares one function for each before it starts.
        """
        found = []
        for job in self.planned_jobs():
            try:
                gpu = self.gpu_request(job)
            except WorkflowError:  # that job's error, reported when it is submitted
                continue
            if gpu is not None and gpu.fallbacks and gpu not in found:
                found.append(gpu)
        return found

    def planned_jobs(self) -> list:
        """The jobs of the DAG that will run in containers (not local rules)."""
        dag = getattr(self.workflow, "dag", None)
        if dag is None:
            return []
        return [j for j in dag.needrun_jobs() if not getattr(j, "is_local", False)]

    # -- submission -------------------------------------------------------------

    def run_job(self, job):
        # Whatever goes wrong here is this job's error (so --retries applies), never
        # the scheduler's (which would cancel every running container).
        try:
            self.submit(job)
        except Exception as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            kind = "" if isinstance(e, WorkflowError) else f"{type(e).__name__}: "
            msg = f"Modal: job {self.get_jobname(job)} not submitted: {kind}{text}"
            if job.is_group():  # Snakemake prints no message for a group's error
                self.logger.error(msg)
            self.report_job_error(SubmittedJobInfo(job), msg=msg)

    def submit(self, job) -> None:
        """
        Spawn the job's container if the budget guard admits it now
        (:meth:`admission`); else hold it until a running call ends (reported
        submitted as ``waiting-<n>``: :meth:`check_active_jobs` starts it), or
        refuse it (see :meth:`run_job`).
        """
        name = self.get_jobname(job)
        if self._app_ended is not None:
            msg = f"Modal: job {name} not submitted: {self.ended_with_app()}"
            if job.is_group():  # Snakemake prints no message for a group's error
                self.logger.error(msg)
            self.report_job_error(SubmittedJobInfo(job), msg=msg)
            return
        with self._admit_lock:  # admitted and registered as one step
            admission = self.admission(job)
            if admission.verdict == "refuse":
                msg = f"Modal: job {name}: {admission.message}"
                if job.is_group():  # Snakemake prints no message for a group's error
                    self.logger.error(msg)
                self.report_job_error(SubmittedJobInfo(job), msg=msg)
                return
            if admission.verdict == "wait":
                with self._calls_lock:
                    self._waited += 1
                    external_id = f"waiting-{self._waited}"
                    self._waiting[external_id] = job
                self.logger.info(f"Modal: job {name} waits: {admission.message}")
                self.report_job_submission(
                    SubmittedJobInfo(job, external_jobid=external_id, aux={})
                )
                return
            call, spec = self.start(job, admission)
            with self._calls_lock:
                self._calls[call.call_id] = call
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=call.call_id, aux={"spec": spec})
        )

    def admission(self, job) -> Admission:
        """
        What the budget guard says of this job now (`Ledger.admit`): its timeout is
        its ``runtime`` (fixed), else ``--modal-timeout`` (which may be cut to what
        is left of the budget); the running calls' worst cases are held aside.
        """
        gpu = self.gpu_request(job)
        runtime_s = _runtime_seconds(job)
        timeout_s = min(runtime_s or self.settings.timeout, MAX_TIMEOUT_S)
        running = self.running_calls()
        return self.ledger.admit(
            gpu,
            timeout_s,
            self.budget(job),
            sum(c.reserved_usd(self.ledger.startup_s) for c in running),
            len(running),
            may_cut=runtime_s is None,
        )

    def running_calls(self) -> list[ContainerCall]:
        """The calls that may bill: running, and those whose cancel has not
        reached Modal yet."""
        with self._calls_lock:
            return [*self._calls.values(), *self._orphans]

    def start(self, job, admission: Admission) -> tuple[ContainerCall, dict]:
        """Stage the job's files and spawn its container with the admitted
        timeout; returns the call and the job's spec."""
        if admission.message:  # its timeout was cut to the budget left
            self.logger.warning(
                f"Modal: job {self.get_jobname(job)}: {admission.message}"
            )
        gpu = self.gpu_request(job)
        spec = self.job_spec(job)
        self.stager.upload(spec["stage"])
        handle = self.app.spawn(
            spec, gpu, _cpus(job), _memory_mb(job), admission.timeout_s
        )
        call = ContainerCall(handle, gpu, admission.timeout_s, warn=self.logger.warning)
        call.budget = self.budget(job)
        return call, spec

    def job_spec(self, job) -> dict:
        """The argument of the container's ``run_job`` for this job."""
        if self._sources is None:
            # Snakemake's sources (included files, scripts, config files, git's
            # files) and the files the config names, tracked by git or not: the
            # container parses the workflow as this machine does
            sources = {
                relative_to_workdir(f, self.workdir)
                for f in self.workflow.dag.get_sources()
                if os.path.isfile(f)
            }
            sources |= set(_config_files(self.workflow.config, self.workdir))
            self._sources = sorted(sources)
        rel = lambda files: [relative_to_workdir(f, self.workdir) for f in files]  # noqa: E731
        members = _members(job)
        # a group's intermediate files are outputs too: synced and downloaded
        outputs = [
            [relative_to_workdir(f, self.workdir), str(f)]
            for j in members
            for f in j.output
        ]
        results = rel([*(f for j in members for f in j.log), *_benchmarks(members)])
        targets = [
            " ".join(
                shlex.quote(t) for t in encode_target_jobs_cli_args(j.get_target_spec())
            )
            for j in members
        ]
        return {
            "mount": MOUNT,
            "volume": self.settings.volume,
            "prefix": self.stager.prefix,
            "stage": sorted(set(self._sources) | set(rel(job.input))),
            "command": self.format_job_exec(job),
            "outputs": outputs,
            # what Snakemake checks after the job: a group's outputs not consumed
            # inside it (intermediates may be temp() files deleted in the container)
            "job_outputs": sorted(set(rel(job.output))),
            "results": sorted(set(results)),
            "log": JOB_LOG.format(name=self.get_jobname(job)),
            "sync_every_s": self.settings.sync_seconds,
            "python_packages": [
                "snakemake_executor_plugin_modal",
                *(self.settings.local_packages or []),
            ],
            "members": [
                {"target": t, "outputs": rel(j.output), "key": key}
                for t, j, key in zip(
                    targets, members, self.job_keys(members), strict=True
                )
            ],
        }

    def job_keys(self, members: list) -> list[str]:
        """
        What makes each job's outputs reusable: a SHA-256 of its rule, wildcards,
        parameters and the contents of its inputs (files, or the files inside
        folders; for an input made by another job of the group, that job's key).
        An output on the volume is reused only by a job with the same key.
        """
        made_by = {str(f): j for j in members for f in j.output}
        keys: dict[int, str] = {}

        def key(job) -> str:
            if id(job) not in keys:
                inputs = {}
                for f in job.input:
                    rel = relative_to_workdir(f, self.workdir)
                    producer = made_by.get(str(f))
                    inputs[rel] = (
                        "made by " + key(producer)
                        if producer is not None
                        else self.stager.content_hash(rel)
                    )
                record = {
                    "rule": job.rule.name,
                    "wildcards": dict(job.wildcards_dict),
                    "params": {k: v for k, v in job.params.items()},
                    "inputs": inputs,
                }
                text = json.dumps(record, sort_keys=True, default=repr)
                keys[id(job)] = hashlib.sha256(text.encode()).hexdigest()[:32]
            return keys[id(job)]

        return [key(j) for j in members]

    def get_job_args(self, job, **kwargs):
        """
        Snakemake's job arguments with the container's CPUs as ``--cores``, and the
        ``--target-jobs`` left to the container (it leaves out finished jobs).
        """
        # RemoteExecutor's own addition (files to wait for on a shared file system)
        # does not apply: there is none (implies_no_shared_fs)
        args = RealExecutor.get_job_args(self, job, cores=max(1, math.ceil(_cpus(job))))
        encoded = encode_target_jobs_cli_args(job.get_target_spec())
        from snakemake_interface_executor_plugins.utils import format_cli_arg

        return args.replace(
            format_cli_arg("--target-jobs", encoded), f"--target-jobs {TARGETS}"
        )

    def additional_general_args(self):
        # one failing job of a group (one image of a shard) does not stop the others
        return "--keep-going"

    def format_job_exec(self, job) -> str:
        """
        Snakemake's command for the job, without ``--directory``: the container runs it
        in its own copy of the working directory, and the local path does not exist
        there.
        """
        return _DIRECTORY_ARG.sub("", super().format_job_exec(job))

    def job_env(self) -> dict[str, str]:
        """
        Environment variables declared with ``--envvars``, Modal's token left out;
        they reach the containers as a Modal secret (``modal.Secret.from_dict``), not
        as arguments of the call.
        """
        return {k: v for k, v in self.envvars().items() if k not in SECRET_ENVVARS}

    def gpu_request(self, job) -> GpuRequest | None:
        """
        The container's GPUs. Type: the job's ``modal_gpu`` resource (a Modal GPU
        specification: ``"H100"``, ``"H100:2"``, a fallback list ``"A100-80GB,H100"``),
        else its ``gpu_model`` resource (the name other executors read), else
        ``--modal-gpu``. Count: the largest of the ``gpu`` resource and the
        specification's count. A job with either resource gets a GPU even without a
        ``gpu`` resource. For a group job, the largest request of its jobs (they share
        the container's GPUs).

        Raises
        ------
        WorkflowError
            If a job requests GPUs but no type is known, a specification is malformed,
            or group members request different types.
        """
        counts, specs = [], set()
        for j in _members(job):
            res = j.resources
            count = int(res.get("gpu", 0) or 0)
            spec = res.get("modal_gpu") or res.get("gpu_model")
            if count or spec:
                counts.append(max(count, 1))
                if spec:
                    specs.add(str(spec))
        if not counts:
            return None
        if len(specs) > 1:
            raise WorkflowError(
                f"group job {self.get_jobname(job)}: its jobs request different "
                f"GPUs {sorted(specs)} ('modal_gpu' or 'gpu_model' resources); one "
                "container has one type"
            )
        if specs:
            spec = specs.pop()
            try:
                base = parse_gpu(spec)
            except ValueError as e:
                raise WorkflowError(
                    f"job {self.get_jobname(job)}: resource 'modal_gpu' or "
                    f"'gpu_model': {e}"
                ) from None
        elif self.default_gpu is None:
            raise WorkflowError(
                f"job {self.get_jobname(job)} requests a GPU but has no 'modal_gpu' "
                "or 'gpu_model' resource and no --modal-gpu is set; set --modal-gpu "
                "(e.g. A100)"
            )
        else:
            base = self.default_gpu
        count = max(max(counts), base.count)
        return base if count == base.count else replace(base, count=count)

    def budget(self, job) -> tuple[float, str] | None:
        """
        The budget that applies to a job: the lowest of ``--modal-max-cost-usd`` and
        its jobs' ``modal_max_cost_usd`` resources (USD; a number, or a string such as
        ``"12.5"``: Snakemake rounds a float resource to an integer), with where it
        comes from; None if neither is set.

        Raises
        ------
        WorkflowError
            If a ``modal_max_cost_usd`` resource is not a number >= 0.
        """
        found = []
        if self.settings.max_cost_usd is not None:
            found.append((float(self.settings.max_cost_usd), "--modal-max-cost-usd"))
        for j in _members(job):
            value = j.resources.get("modal_max_cost_usd")
            if value is None or value == "":
                continue
            try:
                usd = float(value)
            except (TypeError, ValueError):
                usd = math.nan
            if not usd >= 0:
                raise WorkflowError(
                    f"job {self.get_jobname(job)}: resource modal_max_cost_usd="
                    f"{value!r}: a budget in USD, a number >= 0 (e.g. '12.5')"
                )
            found.append((usd, "resource modal_max_cost_usd"))
        return min(found, key=lambda b: b[0]) if found else None

    # -- status -----------------------------------------------------------------

    async def check_active_jobs(self, active_jobs):
        if not hasattr(self, "_calls_lock"):
            # Snakemake's status thread starts before __post_init__ (while the image
            # is built, RemoteExecutor.__init__): nothing was submitted yet
            for job_info in active_jobs:
                yield job_info
            return
        # Modal's client calls block: they run in threads, not in Snakemake's event loop
        await asyncio.to_thread(self.cancel_orphans)
        await asyncio.to_thread(self.check_budget)
        for job_info in active_jobs:
            external_id = job_info.external_jobid
            with self._calls_lock:
                waiting = self._waiting.get(external_id)
                call = self._calls.get(external_id)
            if waiting is not None:
                if await self.start_waiting(job_info):
                    yield job_info
                continue
            if call is None:  # cancelled meanwhile
                continue
            if self._app_ended is None:
                async with self.status_rate_limiter:
                    outcome = await asyncio.to_thread(call.poll)
                if outcome is None:
                    yield job_info
                    continue
                if outcome.ended_by_modal:
                    self.app_ended(call, outcome)
                    outcome.message = self.ended_with_app()
            else:  # not taken as running: Modal may never give its output
                outcome = Outcome(False, self.ended_with_app())
                await asyncio.to_thread(call.cancel, 1)  # if it runs on even so
            with self._calls_lock:
                if self._calls.pop(external_id, None) is None:
                    continue  # cancelled meanwhile (Ctrl-C): counted there
                if not outcome.ok and call.ended is None:  # its cancel failed
                    self._orphans.append(call)
            if call.ended is not None:
                self.ledger.add(call.gpu, call.seconds)
            if call.cancelled and self.ledger.exhausted is not None:
                outcome.message = self.ledger.exhausted
            try:
                await asyncio.to_thread(self.fetch_results, job_info, outcome.ok)
            except Exception as e:
                outcome.ok = False
                outcome.message = f"could not download the job's files: {e}"
            if outcome.ok:
                self.report_job_success(job_info)
            else:
                # brought home once Snakemake has removed the failed job's outputs
                self._failed[job_info.job] = job_info.aux["spec"]
                msg = (
                    f"Modal call {call.call_id}: {outcome.message}\n"
                    + self.log_report(job_info, outcome)
                )
                if job_info.job.is_group():  # Snakemake prints no message for it
                    self.logger.error(f"{self.get_jobname(job_info.job)}: {msg}")
                self.report_job_error(job_info, msg=msg)

    def app_ended(self, call: ContainerCall, outcome: Outcome) -> None:
        """
        Say once, in one line, that the run's app has ended under it: Modal ended
        `call` without a cancel from this run (`Outcome.ended_by_modal`), with what
        this process knows of why (`Pauses`: it did not run, so its client sent no
        heartbeat, for longer than the heartbeat interval). From then on every
        running call fails at its next status check (Modal may never give a stopped
        app's calls an output: none is taken as running) and no job is started
        (a spawn into a stopped app fails with an error that does not say why);
        failed shards bring home what their containers committed
        (`handle_job_error`), so the next run computes only the rest.
        """
        if self._app_ended is not None:
            return
        interval = self.pauses.least_s
        paused = self.pauses.longest(since=call.spawned_at)
        if paused:
            why = (
                f"this process did not run for {paused:.0f} s meanwhile (the machine "
                "slept, or the process was stopped), so its Modal client sent no "
                f"heartbeat for longer than its {interval:g} s interval, and Modal "
                "stops an ephemeral app whose client stops heartbeating"
            )
        else:
            why = (
                "the app was stopped (`modal app stop`, Modal's dashboard), or Modal "
                "stopped hearing its client's heartbeats (a lost connection)"
            )
        self._app_ended = (
            f"Modal: the run's app {self.app.app_id} has ended: {outcome.message}; "
            f"{why}. Every call of the run fails now (the outputs their containers "
            "committed are brought home) and no job is started: run Snakemake "
            "again to compute the rest"
        )
        self.logger.error(self._app_ended)

    def ended_with_app(self) -> str:
        """A job's message once the run's app has ended (the line said once)."""
        return f"ended with the run's app {self.app.app_id} (said above)"

    async def start_waiting(self, job_info) -> bool:
        """
        Start a job that waits for budget if the guard admits it now; True while it
        is active (started, or still waiting), False once it was refused or failed
        to start (reported).
        """
        job = job_info.job
        name = self.get_jobname(job)
        try:
            started = await asyncio.to_thread(self._start_if_admitted, job_info)
            if started is None:
                return True
        except Exception as e:
            with self._calls_lock:
                self._waiting.pop(job_info.external_jobid, None)
            text = (str(e).strip().splitlines() or [""])[0]
            kind = "" if isinstance(e, WorkflowError) else f"{type(e).__name__}: "
            msg = f"Modal: job {name} not submitted: {kind}{text}"
            if job.is_group():
                self.logger.error(msg)
            self.report_job_error(job_info, msg=msg)
            return False
        call, spec = started
        self.logger.info(f"Modal: job {name} started ({call.call_id})")
        job_info.aux["spec"] = spec
        return True

    def _start_if_admitted(self, job_info) -> tuple | None:
        """A waiting job's admission and start, as one step (`_admit_lock`): the
        call and its spec, None while it still waits; raises when refused."""
        if self._app_ended is not None:
            raise WorkflowError(self.ended_with_app())
        with self._admit_lock:
            admission = self.admission(job_info.job)
            if admission.verdict == "wait":
                return None
            if admission.verdict == "refuse":
                raise WorkflowError(admission.message)
            call, spec = self.start(job_info.job, admission)
            with self._calls_lock:
                self._waiting.pop(job_info.external_jobid, None)
                self._calls[job_info.external_jobid] = call
            return call, spec

    def check_budget(self) -> None:
        """
        The budget check: stop the run (one line, every call cancelled) when
        `budget_reached` says so; once stopped, cancel again the calls whose cancel
        failed. Made at every status check and, every status interval, while a
        job's files download (`fetch_results`, `handle_job_error`), which hold up
        the status loop or Snakemake's lock for minutes with a shard's thousands of
        files; one check at a time (a second caller meanwhile returns at once).
        """
        if not self._budget_lock.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            if self._budget_checked is not None:
                self._budget_gap_s = now - self._budget_checked
            self._budget_checked = now
            stop = self.budget_reached()
            if stop is not None:
                self.logger.error(f"Modal: {stop}")
            if self.ledger.exhausted is not None:  # each check: a cancel may fail
                self.cancel_all()
        finally:
            self._budget_lock.release()

    def budget_reached(self) -> str | None:
        """
        The line that stops the run when what is spent, the running calls' cost so
        far included, would reach the lowest budget of the running calls before the
        next budget check (`Ledger.spent_line`); None otherwise (or once said).
        The next check is taken to come as late as the last one came after the one
        before it, and no sooner than Snakemake's status interval.
        """
        if self.ledger.exhausted is not None:
            return None
        running = self.running_calls()
        budgets = [b for c in running if (b := getattr(c, "budget", None))]
        if self.settings.max_cost_usd is not None:
            budgets.append((float(self.settings.max_cost_usd), "--modal-max-cost-usd"))
        if not budgets:
            return None
        ahead_s = max(self.next_seconds_between_status_checks or 0, self._budget_gap_s)
        running_usd = sum(c.cost_usd for c in running)
        ahead_usd = sum(c.usd_per_second for c in running) * ahead_s
        return self.ledger.spent_line(running_usd, min(budgets), ahead_usd, ahead_s)

    def cancel_all(self) -> None:
        """Cancel every running call not cancelled yet (the budget is reached; a
        call whose cancel failed is tried again at the next check); waiting jobs
        are refused when they are next checked."""
        for call in self.running_calls():
            if not call.cancelled:
                call.cancel(attempts=1)

    def cancel_orphans(self) -> None:
        """Cancel again the calls whose cancel failed; count them once it works."""
        with self._calls_lock:
            orphans, self._orphans = self._orphans, []
        for call in orphans:
            if call.cancel(attempts=1):
                self.ledger.add(call.gpu, call.seconds)
            else:
                with self._calls_lock:
                    self._orphans.append(call)

    def log_report(self, job_info, outcome) -> str:
        """The tail of a failed job's container log, and where the whole log is."""
        local = self.workdir / job_info.aux["spec"]["log"]
        if local.exists():
            tail = local.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            where = f"whole log: {local}"
        elif outcome.result is not None:
            tail = outcome.result["log_tail"].splitlines()[-LOG_TAIL_LINES:]
            where = "the log did not reach the volume"
        else:
            return (
                "no log reached the volume (the container was lost before its first "
                f"sync); Modal's own logs: `modal app logs {self.app.app_id}`\n"
            )
        return f"last lines of its log ({where}):\n" + "\n".join(tail) + "\n"

    def fetch_results(self, job_info, ok: bool) -> None:
        """
        Download a finished job's files: after success its outputs (all required),
        logs, benchmarks and container log; after a failure its logs only (Snakemake
        deletes a failed job's outputs anyway).
        """
        spec = job_info.aux["spec"]
        ticks = self._download_ticks()
        if ok:
            self.stager.download(spec["job_outputs"], **ticks)
            others = {rel for rel, _ in spec["outputs"]} - set(spec["job_outputs"])
            self.stager.download(
                [*sorted(others), *spec["results"], spec["log"]],
                missing_ok=True,
                **ticks,
            )
        else:
            logs = [relative_to_workdir(f, self.workdir) for f in job_info.job.log]
            self.stager.download([*logs, spec["log"]], missing_ok=True, **ticks)

    def _download_ticks(self) -> dict:
        """`VolumeStager.download`'s ``tick`` and ``tick_s``: the budget check,
        every status interval while files download."""
        interval = self.next_seconds_between_status_checks or 10
        return {"tick": self.check_budget, "tick_s": float(interval)}

    def handle_job_error(self, job):
        """
        After Snakemake has handled a failed job (removed its outputs, as after any
        failure): bring home the outputs its container finished and committed (the
        images of a shard that did not fail: on the volume with the marker of their
        job's key), so that its retry and the next run compute only the rest.
        Snakemake calls this after the job's cleanup (``_handle_error`` in
        ``snakemake/scheduling/job_scheduler.py``: ``postprocess(error=True)``,
        then ``handle_job_error``), under its scheduler's lock, which holds up the
        status loop meanwhile: the budget is checked while the files download
        (`check_budget`, every status interval).
        """
        spec = self._failed.pop(job, None)
        if spec is None:
            return
        try:
            finished = self.stager.finished(spec.get("members", []))
            if finished:
                self.stager.download(finished, **self._download_ticks())
                self.logger.info(
                    f"Modal: job {self.get_jobname(job)} failed; {len(finished)} "
                    "output(s) its container finished are brought home and kept "
                    "(a retry or the next run computes only the rest)"
                )
        except Exception as e:  # the files stay on the volume; a retry reuses them
            self.logger.warning(
                f"Modal: the finished outputs of failed job {self.get_jobname(job)} "
                f"could not be brought home ({type(e).__name__}: {e}); they stay on "
                "the volume, where a retry reuses them"
            )

    def cancel_jobs(self, active_jobs):
        # Every running call, not only `active_jobs`: Snakemake's list leaves out the
        # calls being checked at this moment; and those whose cancel failed before.
        with self._calls_lock:
            calls = [*self._calls.values(), *self._orphans]
            self._calls, self._orphans, self._waiting = {}, [], {}
        for call in calls:
            call.cancel()  # where it fails even so, the app's stop ends it
            self.ledger.add(call.gpu, call.seconds)

    def shutdown(self):
        super().shutdown()
        pauses = getattr(self, "pauses", None)
        if pauses is not None:
            pauses.stop()
        self.cancel_orphans()
        app = getattr(self, "app", None)
        if app is not None:
            app.stop(warn=self.logger.warning)
        for call in self._orphans:  # ended by the app's stop
            self.ledger.add(call.gpu, call.seconds)
        self._orphans = []
        self.logger.info(self.ledger.summary())


def _runtime_seconds(job) -> float | None:
    """The job's ``runtime`` resource (minutes) in seconds, or None if unset."""
    runtime = job.resources.get("runtime")
    if runtime is None or (isinstance(runtime, float) and math.isnan(runtime)):
        return None
    return float(runtime) * 60


def _config_files(config, workdir: Path) -> list[str]:
    """Files below the working directory named by string values of the config."""
    found = []
    if isinstance(config, dict):
        for value in config.values():
            found += _config_files(value, workdir)
    elif isinstance(config, (list, tuple)):
        for value in config:
            found += _config_files(value, workdir)
    elif isinstance(config, str) and config and len(config) < 4096:
        path = Path(workdir, config)
        try:
            if path.is_file():
                found.append(relative_to_workdir(path, workdir))
        except (OSError, WorkflowError):
            pass
    return found


def _cpus(job) -> float:
    """CPUs of the job's container: the largest ``threads`` of its jobs."""
    return float(max(j.threads for j in _members(job)))


def _memory_mb(job) -> int | None:
    """The job's ``mem_mb`` resource (a group's total), MiB; None if unset."""
    mem = job.resources.get("mem_mb")
    if mem is None or (isinstance(mem, float) and math.isnan(mem)):
        return None
    return int(mem)


def _members(job) -> list:
    """The jobs of a group job, or the job itself."""
    return list(getattr(job, "jobs", None) or [job])


def _benchmarks(jobs) -> list[str]:
    """Benchmark files of jobs."""
    files = []
    for j in jobs:
        bench = getattr(j, "benchmark", None)
        if bench:
            files.append(str(bench))
    return files
