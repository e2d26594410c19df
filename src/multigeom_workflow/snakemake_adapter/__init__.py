"""
The one package that touches Snakemake's internals.

It sits in the package's lowest layer (it imports nothing of the workflow), so that
every part may call it: `multigeom_workflow.on_snakemake` (what the workflow does to
the running Snakemake), `multigeom_workflow.settings.load` (a config read as
Snakemake reads it).

Everything the workflow reads of or writes to the running Snakemake that is not in
its documented API (the Snakefile's ``workflow`` object beyond ``basedir``, its DAG,
scheduler, logger, resource classes and file class) goes through a function here, and
each attribute or private name used is listed in `INTERNALS` with its use;
tests/test_snakemake_hooks.py checks each against the installed Snakemake, and CI runs
that file with the oldest and the newest Snakemake the package accepts. The other
modules call these functions with the ``workflow`` object and never read it
themselves (a scan in tests/test_snakemake_hooks.py fails when one does).

Three kinds of use:

- reading the run: `facts`, `conda_env`, `configfile_values`, `given_resources`,
  `executor_from_command_line`,
  `inspection_only`, `read_config_file`, `read_config_values`,
  `slurm_status_command`, `submit_dir`, `resources_in_force`,
  `planned_jobs`, `when_plan_built`;
- acting on it: `share_group_name` (shard groups), `limit_local_gpus`,
  `read_recorded_params_as` (older runs' params records read in canonical form),
  `share_resources` (the ceiling's rule takes the per-image rule's set-resources),
  `show_snakemake` (a dry run's view of the files a real run would change),
  `warn` (a line through Snakemake's logger), `replace_in_slurm_plugin` (the
  SLURM plugin's parts under the workflow's layers, each checked first);
- speed patches, each saving seconds at 40,000 jobs and none changing what Snakemake
  computes, all behind one switch (`SPEED_ENV`; `speed_patches_on`):
  `fewer_collections`, `settle_rules`, `record_signature`, `idle_logger_plugin_off`.

Modules: `reading` (the run), `acting` (on the run), `speed` (the speed patches),
`internals` (each patched internal checked before use; a changed one switched off
with one line, `switched_off_lines`, or the run stopped before any job,
`InternalChanged`). Every name is imported from here.
"""

from __future__ import annotations

from .acting import (
    SLURM_PLUGIN_PARTS,
    limit_local_gpus,
    read_recorded_params_as,
    replace_in_slurm_plugin,
    share_group_name,
    share_resources,
    show_snakemake,
    warn,
)
from .internals import TESTED, InternalChanged, switched_off_lines
from .reading import (
    INSPECTING_COMMANDS,
    Facts,
    GivenResources,
    conda_env,
    configfile_values,
    executor_from_command_line,
    facts,
    given_resources,
    inspection_only,
    planned_jobs,
    read_config_file,
    read_config_values,
    resources_in_force,
    slurm_status_command,
    submit_dir,
    when_plan_built,
)
from .speed import (
    GC_THRESHOLDS,
    JOB_NAMES,
    SPEED_ENV,
    _cli_evaluator_arguments,  # noqa: F401 (tests/test_snakemake_hooks.py)
    _settle_constant_resources,  # noqa: F401
    _settle_resource_evaluation,  # noqa: F401
    fewer_collections,
    idle_logger_plugin_off,
    record_signature,
    settle_rules,
    speed_patches_on,
)

__all__ = [
    "GC_THRESHOLDS",
    "INSPECTING_COMMANDS",
    "INTERNALS",
    "JOB_NAMES",
    "SLURM_PLUGIN_PARTS",
    "SPEED_ENV",
    "TESTED",
    "Facts",
    "GivenResources",
    "InternalChanged",
    "conda_env",
    "configfile_values",
    "executor_from_command_line",
    "facts",
    "fewer_collections",
    "given_resources",
    "idle_logger_plugin_off",
    "inspection_only",
    "limit_local_gpus",
    "planned_jobs",
    "read_config_file",
    "read_config_values",
    "read_recorded_params_as",
    "record_signature",
    "replace_in_slurm_plugin",
    "resources_in_force",
    "settle_rules",
    "share_group_name",
    "share_resources",
    "show_snakemake",
    "slurm_status_command",
    "speed_patches_on",
    "submit_dir",
    "switched_off_lines",
    "warn",
    "when_plan_built",
]

#: The Snakemake internals used here (Snakemake 9.27, the versions CI
#: tests: `internals.TESTED`), each with its use; tests/test_snakemake_hooks.py
#: checks that each still exists as used.
INTERNALS = {
    "workflow.output_settings.dryrun": "a dry run (facts)",
    "workflow.is_main_process": "not a job's own Snakemake (facts)",
    "workflow.remote_exec": "a job's Snakemake in a remote allocation (facts)",
    "workflow.local_exec": "jobs run on this machine (facts)",
    "workflow.resource_settings.cores": "--cores (facts)",
    "workflow.resource_settings.nodes": "--jobs of a remote executor (facts)",
    "workflow.resource_settings.resources": "--resources (given_resources)",
    "workflow.resource_settings.overwrite_resources": "a profile's set-resources",
    "workflow.resource_settings.default_resources": "a profile's default-resources",
    "Resource.raw": "a set-resources value as written",
    "Resource.value": "a resource's value once evaluated",
    "Resource.is_evaluable": "a resource that reads its job",
    "Resource.cli_evaluator": "set-resources that read nothing of the job, once",
    "Resource.evaluate": "its signature recorded once (settle_rules)",
    "snakemake.resources.Resources": "a rule's resources (share_resources)",
    "workflow.get_rule": "a rule by name",
    "rule.resources": "the ceiling's rule shares estimate_image's set-resources",
    "rule.input": "a rule's input functions (settle_rules)",
    "snakemake.common.overwrite_function_params": "input functions' signatures, once",
    "snakemake.common.get_function_params": "the signature Snakemake reads",
    "snakemake.ioutils.register_in_globals": "names a resource expression may read",
    "workflow.parent_groupids": "shard groups counted as one name (share_group_name)",
    "workflow.scheduler.global_resources": "the gpu limit of a local run",
    "workflow.scheduler.resources": "the same limit, as the scheduler counts it",
    "workflow.executor_settings.status_command": "the SLURM plugin's status query",
    "workflow.workdir_init": "the working directory the SLURM plugin submits from",
    "workflow.dag.needrun_jobs": "the per-image jobs Snakemake will run",
    "job.rule.name, job.wildcards": "a planned job's rule and wildcards",
    "snakemake.logging.logger RUN_INFO record": "the moment the plan is built",
    "snakemake.common.NOTHING_TO_BE_DONE_MSG": "the plan is empty",
    "snakemake.logging.logger.warning": "a line of a layer over an executor plugin",
    "snakemake_executor_plugin_slurm.<SLURM_PLUGIN_PARTS>": (
        "the SLURM plugin's status query, status check and submissions, under the "
        "workflow's layers (replace_in_slurm_plugin)"
    ),
    "snakemake.cli.args_to_api(args): args.executor": (
        "the executor in use, at parse time (executor_from_command_line)"
    ),
    "workflow.logger_manager.queue_listener": "the queue to the logger plugins",
    "workflow.logger_manager.plugin_handlers": "the logger plugins (idle ones)",
    "workflow.logger_manager.logger": "the logger the queue hangs on",
    "snakemake.io._IOFile.exists_local": "a file as a real run leaves it (exists)",
    "snakemake.io._IOFile.mtime_uncached": "a file as a real run leaves it (date)",
    "snakemake.io._IOFile.size_local": "a file as a real run leaves it (size)",
    "snakemake.io._IOFile.file": "the path a rule's file names",
    "snakemake.io._IOFile.is_fifo": "a file put back by a real run (its kind)",
    "snakemake.io._IOFile.checksum": "a file put back by a real run (its content)",
    "snakemake.io._IOFile(file, rule=)": "the file a put-back one is read from",
    "snakemake.cli.args_to_api(args): args.<command>": (
        "a command that only inspects (inspection_only)"
    ),
    "snakemake.common.configfile.load_configfile": "a config file as Snakemake reads",
    "snakemake.persistence.PersistenceBase.params": (
        "older runs' recorded params read in canonical form (read_recorded_params_as)"
    ),
    "snakemake.cli.parse_config": "--config values as Snakemake parses them",
    "workflow.deployment_settings.deployment_method": (
        "whether jobs run in conda environments (conda_env: the rules' directive)"
    ),
    "workflow.config_settings.configfiles, .overwrite_config, "
    ".replace_workflow_config": (
        "what the command line's config files set (configfile_values: the defaults "
        "a --configfile leaves to config/config.yaml)"
    ),
}
