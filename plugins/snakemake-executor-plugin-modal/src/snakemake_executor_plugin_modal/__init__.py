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

import math
import threading
from dataclasses import dataclass, field
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
from snakemake_interface_executor_plugins.utils import (
    encode_target_jobs_cli_args,
    format_cli_arg,
)

from . import preflight
from .app import Pauses, RunApp, heartbeat_interval_s
from .calls import CANCEL_ATTEMPTS
from .cancellation import Cancellation
from .container import TARGETS
from .earlier import EARLIER_APPS, meet_earlier_apps, run_app_name
from .home_queue import HomeQueue
from .homecoming import Homecoming
from .image import container_image
from .jobspec import JobSpecs, command_piece
from .ledger import Ledger
from .limits import DEADLINE_MARGIN_S, MAX_TIMEOUT_S, STARTUP_S
from .prices import ContainerRequest, GpuRequest, parse_gpu
from .resources import (
    container_request,
    cpus,
    gpu_request,
    job_budget,
    runtime_seconds,
)
from .snakemake_reads import check_reads
from .staging import VolumeStager, default_prefix
from .status import Status
from .submission import Submission

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

#: Environment variables never passed to a job, whatever ``--envvars`` says: Modal's
#: credentials, its token and its OAuth settings (`preflight.OAUTH_SETTINGS`).
SECRET_ENVVARS = (
    "MODAL_TOKEN_ID",
    "MODAL_TOKEN_SECRET",
    *preflight.OAUTH_SETTINGS.values(),
)


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
            "help": "--modal-max-cost-usd: the most USD the run's containers (their "
            "GPUs, CPU cores and memory) may cost, at every moment: a job starts "
            "only if its worst case (price x (timeout + start-up)) fits beside what "
            "is spent and what the running calls may still cost (it waits while "
            "they run), and every call is cancelled when "
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
    deadline_margin_seconds: int = field(
        default=DEADLINE_MARGIN_S,
        metadata={
            "help": "--modal-deadline-margin-seconds: every call has a deadline, "
            "its timeout + --modal-startup-seconds + this margin, in seconds from "
            "its spawn: a call whose output has not come by then is cancelled and "
            "its job failed (and retried where its retries allow). The margin "
            "covers what neither bound counts: the wait to be scheduled (a GPU's "
            "queue) and the output's way back. Raise it where GPUs queue longer.",
        },
    )
    earlier_apps: str = field(
        default="stop",
        metadata={
            "help": "--modal-earlier-apps: what a run does, before any job, with the "
            "apps of earlier runs of the same workflow (the same volume folder: by "
            "default the same working directory) that still run, such as a killed "
            "run's, whose containers Modal stops only once it misses its client's "
            "heartbeats: 'stop' them (the default), or 'count' their containers in "
            "the budget (each as this run's dearest job, for its timeout) and leave "
            "them. One line names them either way.",
            "choices": list(EARLIER_APPS),
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
    keep_on_volume: bool = field(
        default=False,
        metadata={
            "help": "--modal-keep-on-volume: keep a finished job's files on the "
            "volume once they are home (by default they are deleted from it once "
            "downloaded and verified, so that the volume stays under Modal's "
            "50,000 files and directories; a failed job's files always stay).",
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


class Executor(Submission, Status, Cancellation, Homecoming, RemoteExecutor):
    """
    Runs each job in a Modal container; see the module docstring. What the
    executor interface requires is here, each step delegated to the module of its
    concern: submission and admission (`submission`), status checks (`status`),
    cancels and the budget's stop (`cancellation`), bringing files home
    (`homecoming`), the job's spec (`jobspec`) and resources (`resources`); the
    run's app (`app`), the ledger (`ledger`) and the volume (`staging`).
    """

    def __post_init__(self):
        import modal

        # every attribute of Snakemake's objects the plugin reads, or one line
        check_reads(self.workflow)
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
        self._calls: dict = {}
        self._waiting: dict[str, object] = {}
        self._orphans: list = []
        self._failed: dict = {}
        # jobs admitted whose files upload (`submission.Reservation`), held aside
        # in the budget until spawned; finished jobs' downloads, off the status loop
        self._starting: dict = {}
        self.home = HomeQueue()
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
        # an earlier run's app still running (a killed run's): stopped, or held in
        # the budget, before anything of this run is built or spawned
        self.app_name = run_app_name(self.stager.prefix)
        self._earlier = meet_earlier_apps(
            self.app_name,
            self.settings.earlier_apps,
            self.dearest_planned(),
            say=self.logger.warning,
        )
        self.specs = JobSpecs(self.workflow, self.settings, self.stager, self.workdir)
        self.image = container_image(
            self.settings.pip or [],
            self.settings.local_packages or [],
            self.settings.image_commands or [],
        )
        env = self.job_env()
        self.logger.info(
            f"Modal: building the container image (or finding it built) before any "
            f"job; volume folder {self.settings.volume}:/{self.stager.prefix}"
        )
        self.app = RunApp(
            self.app_name,
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

    def dearest_planned(self) -> tuple[ContainerRequest, float]:
        """
        The planned job whose container may cost the most (`container_request`, its
        timeout: its ``runtime``, else ``--modal-timeout``, and the start-up), and
        that bound in seconds: what each container of an earlier run's app is taken
        to be (`earlier.EarlierHold`); a CPU container of 1 core with the default
        timeout where no job is planned.
        """
        startup_s = float(self.settings.startup_seconds)
        found = []
        for job in self.planned_jobs():
            try:
                request = container_request(job, self.gpu_request(job))
            except WorkflowError:  # that job's error, reported when it is submitted
                continue
            runtime_s = runtime_seconds(job) or self.settings.timeout
            bound_s = float(min(runtime_s, MAX_TIMEOUT_S)) + startup_s
            found.append((request.usd_per_second * bound_s, request, bound_s))
        if not found:
            default_s = float(min(self.settings.timeout, MAX_TIMEOUT_S)) + startup_s
            return ContainerRequest(None, 1.0), default_s
        _, request, bound_s = max(found, key=lambda f: f[0])
        return request, bound_s

    def planned_jobs(self) -> list:
        """The jobs of the DAG that will run in containers (not local rules)."""
        return [j for j in self.workflow.dag.needrun_jobs() if not j.is_local]

    # -- what the executor interface asks ---------------------------------------

    def run_job(self, job):
        # Whatever goes wrong here is this job's error (so --retries applies), never
        # the scheduler's (which would cancel every running container).
        try:
            self.submit(job)
        except Exception as e:
            self.not_submitted(SubmittedJobInfo(job), self.submission_error(job, e))

    async def check_active_jobs(self, active_jobs):
        if not hasattr(self, "_calls_lock"):
            # Snakemake's status thread starts before __post_init__ (while the image
            # is built, RemoteExecutor.__init__): nothing was submitted yet
            for job_info in active_jobs:
                yield job_info
            return
        async for job_info in self.poll_active(active_jobs):
            yield job_info

    def handle_job_error(self, job):
        """After Snakemake has handled a failed job: bring home the outputs its
        container finished and committed (`Homecoming.bring_home_failed`), in the
        pool of downloads (`HomeQueue.later`), not under Snakemake's scheduler lock,
        which it holds here; the run's end waits for them."""
        self.home.later(lambda: self.bring_home_failed(job))

    def cancel_jobs(self, active_jobs):
        self._cancelled = True
        self.cancel_every_call()

    def shutdown(self):
        super().shutdown()
        pauses = getattr(self, "pauses", None)
        if pauses is not None:
            pauses.stop()
        # the calls whose cancel failed: a few rounds before the app's stop
        self.cancel_orphans(rounds=CANCEL_ATTEMPTS)
        self.count_earlier(everything=True)
        app = getattr(self, "app", None)
        if app is not None:
            app.stop(warn=self.logger.warning)
        for call in self._orphans:  # ended by the app's stop
            self.ledger.add(call.request, call.seconds)
        self._orphans = []
        home = getattr(self, "home", None)
        if home is not None:  # files still coming home: waited for, the app
            # stopped first (Ctrl-C: those not started are dropped)
            if home.pending():
                self.logger.info(
                    f"Modal: waiting for {home.pending()} download(s) of finished "
                    "jobs' files before the run ends"
                )
            home.close(cancel=getattr(self, "_cancelled", False))
        self.logger.info(self.ledger.summary())

    def get_job_args(self, job, **kwargs):
        """
        Snakemake's job arguments with the container's CPUs as ``--cores``, and the
        ``--target-jobs`` left to the container (it leaves out finished jobs).
        """
        # RemoteExecutor's own addition (files to wait for on a shared file system)
        # does not apply: there is none (implies_no_shared_fs)
        args = RealExecutor.get_job_args(self, job, cores=max(1, math.ceil(cpus(job))))
        encoded = encode_target_jobs_cli_args(job.get_target_spec())
        # Snakemake's own piece, formatted by its own function (`command_piece`)
        targets = format_cli_arg("--target-jobs", encoded)
        return command_piece(args, targets, f"--target-jobs {TARGETS}", "the jobs")

    def additional_general_args(self):
        # one failing job of a group (one image of a shard) does not stop the others
        return "--keep-going"

    def format_job_exec(self, job) -> str:
        """
        Snakemake's command for the job, without ``--directory``: the container runs it
        in its own copy of the working directory, and the local path does not exist
        there. Snakemake adds it to the general arguments, formatted by
        ``format_cli_arg("--directory", workflow.overwrite_workdir)``, where
        ``--directory`` was given and the working directory is not shared
        (``SpawnedJobArgsFactory.general_args``, ``snakemake/spawn_jobs.py``; never
        shared here: ``implies_no_shared_fs``); that same piece is left out
        (`jobspec.command_piece`, which fails in one line where it is not there).
        """
        command = super().format_job_exec(job)
        workdir = self.workflow.overwrite_workdir
        if workdir is None or self.workflow.storage_settings.assume_common_workdir:
            return command
        piece = format_cli_arg("--directory", workdir)
        return command_piece(command, piece, "", "--directory")

    # -- the job, read from its resources ----------------------------------------

    def job_spec(self, job) -> dict:
        """The argument of the container's ``run_job`` for this job (`JobSpecs`)."""
        return self.specs.spec(job, self.format_job_exec(job), self.get_jobname(job))

    def job_env(self) -> dict[str, str]:
        """
        Environment variables declared with ``--envvars``, Modal's credentials
        (`SECRET_ENVVARS`: its token, its OAuth settings) left out;
        they reach the containers as a Modal secret (``modal.Secret.from_dict``), not
        as arguments of the call.
        """
        return {k: v for k, v in self.envvars().items() if k not in SECRET_ENVVARS}

    def gpu_request(self, job) -> GpuRequest | None:
        """The container's GPUs (`resources.gpu_request`)."""
        return gpu_request(job, self.default_gpu, self.get_jobname(job))

    def budget(self, job) -> tuple[float, str] | None:
        """The budget that applies to a job (`resources.job_budget`)."""
        return job_budget(job, self.settings.max_cost_usd, self.get_jobname(job))
