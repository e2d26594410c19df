"""
Every attribute of Snakemake's objects that the plugin reads, in one table
(`SNAKEMAKE_READS`), checked when the executor starts (`check_reads`): a Snakemake
that lacks one stops the run before anything is built, in one line naming the
attribute and the Snakemake version, instead of a default that would hide the change
(a run without its preflight, a group taken for one job, a job without its sources).

The plugin reads these attributes directly, without ``getattr(..., default)``. Some
are declared by ``snakemake-interface-executor-plugins`` (a job's ``resources``,
``input``, ``output``, ``log``, ``threads``, ``is_local``, ``is_group``,
``get_target_spec``; a single job's ``rule`` and ``benchmark``; a group's ``jobs``),
the others are Snakemake's own (``workflow.dag``, ``workflow.config``,
``workflow.executor_settings``, a job's ``wildcards_dict`` and ``params``). The
accepted version range is the tested one (`TESTED`).
"""

from __future__ import annotations

from importlib import metadata

from snakemake_interface_common.exceptions import WorkflowError

__all__ = ["SNAKEMAKE_READS", "TESTED", "check_reads", "snakemake_version"]

#: The Snakemake versions the plugin is tested with (pyproject.toml's test extra).
TESTED = "9.19 to 9.27"

#: Attribute (rooted at ``workflow``: the run's workflow; ``job``: a single job,
#: Snakemake's ``Job``; ``group``: a group job, ``GroupJob``; ``rule``: a job's rule,
#: ``Rule``) -> what the plugin reads it for.
SNAKEMAKE_READS: dict[str, str] = {
    "workflow.executor_settings": "the plugin's settings",
    "workflow.dag": "the planned jobs and the workflow's sources",
    "workflow.dag.needrun_jobs": "the planned jobs: preflight, GPU fallback lists",
    "workflow.dag.get_sources": "the workflow's sources, staged for every job",
    "workflow.config": "the files the config names, staged for every job",
    "workflow.storage_settings": "the default storage provider, refused",
    "workflow.storage_settings.default_storage_provider": "a storage provider, refused",
    "workflow.storage_settings.assume_common_workdir": "whether Snakemake put "
    "--directory in the job's command",
    "workflow.overwrite_workdir": "--directory, left out of the job's command",
    "job.resources": "CPUs, memory, GPUs, runtime and budget of the container",
    "job.threads": "the container's CPUs and Snakemake's --cores there",
    "job.input": "the files staged for the job, and its reuse key",
    "job.output": "the files synced, brought home and reused",
    "job.log": "the logs brought home",
    "job.benchmark": "the benchmark file brought home",
    "job.rule": "the job's rule",
    "rule.name": "the rule's name, in the reuse key and the preflight's lines",
    "job.wildcards_dict": "the job's wildcards, in its reuse key",
    "job.params": "the job's params, in its reuse key",
    "job.is_local": "local rules, left out of the planned jobs",
    "job.is_group": "whether a job is a group",
    "job.get_target_spec": "the job's --target-jobs in the container",
    "group.jobs": "a group job's jobs: one container for all",
    "group.is_group": "whether a job is a group",
    "group.resources": "the group's memory and runtime",
    "group.input": "the files staged for the group",
    "group.output": "the group's outputs Snakemake checks",
    "group.log": "the logs brought home after a failure",
    "group.get_target_spec": "the group's --target-jobs in the container",
}


def snakemake_version() -> str:
    """The installed Snakemake's version ("unknown" where its metadata is missing)."""
    try:
        return metadata.version("snakemake")
    except metadata.PackageNotFoundError:
        return "unknown"


def _snakemake_classes() -> dict:
    """Snakemake's classes of a job, a group job and a rule (imported when the
    executor starts, inside Snakemake's own process)."""
    from snakemake.jobs import GroupJob, Job
    from snakemake.rules import Rule

    return {"job": Job, "group": GroupJob, "rule": Rule}


def check_reads(workflow, classes: dict | None = None, version: str | None = None):
    """
    Check that Snakemake has every attribute of `SNAKEMAKE_READS`: on the run's
    `workflow` object, and on Snakemake's classes of a job, a group job and a rule
    (a property or a slot of the class: no job need exist yet).

    Parameters
    ----------
    workflow : snakemake workflow
    classes : dict, optional
        ``{"job": ..., "group": ..., "rule": ...}``; default: Snakemake's own.
    version : str, optional
        Named in the message; default: the installed Snakemake's.

    Raises
    ------
    WorkflowError
        One line naming the first attribute missing, what it is read for, and the
        Snakemake version.
    """
    roots = {"workflow": workflow, **(classes or _snakemake_classes())}
    for path, purpose in SNAKEMAKE_READS.items():
        root, *parts = path.split(".")
        obj = roots[root]
        for i, part in enumerate(parts):
            if not hasattr(obj, part):
                missing = ".".join([root, *parts[: i + 1]])
                raise WorkflowError(
                    f"Modal: this Snakemake ({version or snakemake_version()}) has no "
                    f"`{missing}`, which the plugin reads ({purpose}); it is tested "
                    f"with Snakemake {TESTED}: run it with one of those"
                )
            obj = getattr(obj, part)
