"""
What the container is handed for one job (`JobSpecs.spec`: the argument of
:func:`~snakemake_executor_plugin_modal.container.run_job`): the files to stage (the
workflow's sources and the job's inputs), Snakemake's command, the outputs to sync
and bring home, and each job's reuse key (`JobSpecs.keys`); and Snakemake's job
command made fit for the container (`command_piece`): its ``--directory`` left out,
its ``--target-jobs`` left to the container.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.utils import encode_target_jobs_cli_args

from . import limits
from .container import JOB_LOG
from .resources import benchmarks, members
from .snakemake_reads import TESTED, snakemake_version
from .staging import VolumeStager, relative_to_workdir

__all__ = ["JobSpecs", "command_piece", "config_files"]


def command_piece(command: str, piece: str, by: str, what: str) -> str:
    """
    Replace one argument of Snakemake's job command, found as Snakemake wrote it.

    Snakemake builds the command as ``join_cli_args`` of its pieces (one space
    between the non-empty ones: ``RealExecutor.format_job_exec`` and
    ``get_job_args`` in ``snakemake_interface_executor_plugins/executors/real.py``,
    ``SpawnedJobArgsFactory.general_args`` in ``snakemake/spawn_jobs.py``), each
    argument formatted by ``format_cli_arg(flag, value)``; the caller formats
    `piece` with that same function and the same value, so it is found whole,
    bounded by spaces, and exactly once. No pattern guesses at quoting.

    Parameters
    ----------
    command : str
        The command, or its job arguments.
    piece : str
        The argument as Snakemake formats it, e.g. ``format_cli_arg("--directory",
        workflow.overwrite_workdir)``.
    by : str
        What stands in its place ("" to leave it out).
    what : str
        What the piece is, for the error.

    Returns
    -------
    str

    Raises
    ------
    WorkflowError
        One line naming the Snakemake version where `piece` is not in `command`
        exactly once: Snakemake changed the command's shape.
    """
    words, bounded = f" {command} ", f" {piece} "
    at, found = words.find(bounded), 0
    while at >= 0:  # overlapping too: two pieces side by side share a space
        found += 1
        at = words.find(bounded, at + 1)
    if found != 1:
        raise WorkflowError(
            f"Modal: Snakemake {snakemake_version()}'s job command holds {what} "
            f"({piece!r}) {found} times, not once as the plugin reads it (tested "
            f"with Snakemake {TESTED}): run it with one of those"
        )
    replaced = words.replace(bounded, f" {by} " if by else " ")
    return replaced[1:-1]


class JobSpecs:
    """
    The specs of a run's jobs.

    Parameters
    ----------
    workflow : snakemake workflow
        For its sources (``dag.get_sources``) and config.
    settings : ExecutorSettings
    stager : VolumeStager
        The run's volume folder (its prefix, the content hashes of staged files).
    workdir : Path
    """

    def __init__(self, workflow, settings, stager: VolumeStager, workdir: Path):
        self.workflow = workflow
        self.settings = settings
        self.stager = stager
        self.workdir = workdir
        self._sources: list[str] | None = None

    def sources(self) -> list[str]:
        """
        Snakemake's sources (included files, scripts, config files, git's files)
        and the files the config names, tracked by git or not: the container parses
        the workflow as this machine does. Read once.
        """
        if self._sources is None:
            found = {
                relative_to_workdir(f, self.workdir)
                for f in self.workflow.dag.get_sources()
                if os.path.isfile(f)
            }
            found |= set(config_files(self.workflow.config, self.workdir))
            self._sources = sorted(found)
        return self._sources

    def spec(self, job, command: str, name: str) -> dict:
        """
        The argument of the container's ``run_job`` for this job.

        Parameters
        ----------
        job : snakemake job
            A job, or a group job.
        command : str
            Snakemake's command for it (``Executor.format_job_exec``).
        name : str
            Its name (``Executor.get_jobname``), which names its log.

        Returns
        -------
        dict
        """
        rel = lambda files: [relative_to_workdir(f, self.workdir) for f in files]  # noqa: E731
        jobs = members(job)
        # a group's intermediate files are outputs too: synced and downloaded
        outputs = [
            [relative_to_workdir(f, self.workdir), str(f)]
            for j in jobs
            for f in j.output
        ]
        results = rel([*(f for j in jobs for f in j.log), *benchmarks(jobs)])
        targets = [
            " ".join(
                shlex.quote(t) for t in encode_target_jobs_cli_args(j.get_target_spec())
            )
            for j in jobs
        ]
        return {
            "mount": limits.MOUNT,
            "volume": self.settings.volume,
            "prefix": self.stager.prefix,
            "stage": sorted(set(self.sources()) | set(rel(job.input))),
            "command": command,
            "outputs": outputs,
            # what Snakemake checks after the job: a group's outputs not consumed
            # inside it (intermediates may be temp() files deleted in the container)
            "job_outputs": sorted(set(rel(job.output))),
            "results": sorted(set(results)),
            "log": JOB_LOG.format(name=name),
            "sync_every_s": self.settings.sync_seconds,
            "python_packages": [
                "snakemake_executor_plugin_modal",
                *(self.settings.local_packages or []),
            ],
            "members": [
                {"target": t, "outputs": rel(j.output), "key": key}
                for t, j, key in zip(targets, jobs, self.keys(jobs), strict=True)
            ],
        }

    def keys(self, jobs: list) -> list[str]:
        """
        What makes each job's outputs reusable: a SHA-256 of its rule, wildcards,
        parameters and the contents of its inputs (files, or the files inside
        folders; for an input made by another job of the group, that job's key).
        An output on the volume is reused only by a job with the same key.
        """
        made_by = {str(f): j for j in jobs for f in j.output}
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

        return [key(j) for j in jobs]


def config_files(config, workdir: Path) -> list[str]:
    """Files below the working directory named by string values of the config."""
    found = []
    if isinstance(config, dict):
        for value in config.values():
            found += config_files(value, workdir)
    elif isinstance(config, (list, tuple)):
        for value in config:
            found += config_files(value, workdir)
    elif isinstance(config, str) and config and len(config) < 4096:
        path = Path(workdir, config)
        try:
            if path.is_file():
                found.append(relative_to_workdir(path, workdir))
        except (OSError, WorkflowError):
            pass
    return found
