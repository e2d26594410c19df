# Configuration: schema validation, the scenario of the run, and the input functions.
# Any bad value stops the run here, before any job, with one line naming the key, the
# value and what is allowed.

import os
import sys

from snakemake.exceptions import WorkflowError

try:
    from multigeom_workflow.scenario import ConfigError, validated_scenario
    from multigeom_workflow.plan import pending_images
    from multigeom_workflow.shards import SHARD_GROUP, num_shards, shard_groups
except ImportError as err:
    raise WorkflowError(
        f"the workflow's packages are not installed ({err}): run `pip install -e . "
        "./plugins/snakemake-executor-plugin-modal` in the repository (see README.md)"
    ) from None

try:  # the schema (config/schemas/config.schema.yaml), then the file-system checks
    SCENARIO = validated_scenario(config, workflow.basedir, workflow.remote_exec)
except ConfigError as err:
    # One line on stderr and exit status 1, before any job: Snakemake would wrap a
    # raised error in a traceback of the rule files.
    sys.exit(f"config error: {err}")
# Problems that stop a real run (at its start, rules/plan.smk, where the executor is
# known: a Modal container's image brings its own weights); a dry run shows its plan
# with them as warnings.
if workflow.output_settings.dryrun:
    for _problem in SCENARIO.blockers:
        print(f"warning: {_problem}", file=sys.stderr)
if SCENARIO.gpu_fallback:
    print(SCENARIO.gpu_fallback, file=sys.stderr)
# For the per-image jobs this run starts (they inherit the environment): the process
# their warm workers watch (they end with it), and how many share the CPU at once.
os.environ.update(
    MULTIGEOM_SNAKEMAKE_PID=str(os.getpid()),
    MULTIGEOM_CPU_SLOTS=str(workflow.resource_settings.cores or 1),
)
RUNS = SCENARIO.runs_dir
RESULTS = config["results_dir"].rstrip("/")
DEMO = config["demo"]
# Per-image jobs compute on the GPU Snakemake gives them when the device is CUDA.
ESTIMATE_GPUS = 1 if SCENARIO.uses_gpu else 0
# The per-image computations left, split into balanced shards (Snakemake groups
# shard-00, shard-01, ...). Each shard's group is registered under the one name "shard",
# so a profile's `group-components: [shard=N]` makes one submission of up to N images
# of a shard (Snakemake keys --group-components by that name, as for groups written
# with wildcards).
SHARDS = shard_groups(
    pending_images(SCENARIO),
    num_shards(config["shards"], workflow.resource_settings.nodes),
)
for _shard in set(SHARDS.values()):
    workflow.parent_groupids[_shard] = SHARD_GROUP


wildcard_constraints:
    encoder="[A-Za-z0-9_]+",
    area="[A-Za-z0-9_]+",
    index=r"\d\d\d\d+",


def get_final_outputs():
    """
    Every per-image file, Stage 5's metrics and the figure. The per-image files are
    targets themselves, so that one deleted after the figure was drawn is recomputed.
    """
    return [
        *SCENARIO.per_image_files(),
        f"{RUNS}/metrics/cross_encoder_metrics.json",
        f"{RESULTS}/fig4de.png",
        f"{RESULTS}/fig4de.pdf",
        *get_science_outputs(),  # rules/science.smk: noise ceiling, ground truth
    ]


def get_configuration(wildcards):
    """The scenario's configuration named by the job's wildcards."""
    return SCENARIO.configuration(wildcards.encoder, wildcards.area)


def get_estimate_inputs(wildcards):
    """
    The inputs of a per-image job: the test image `index` (in its source's order) and
    the configuration's encoder and diffusion checkpoints. One function for the three,
    because Snakemake inspects every input function of every job (planning 40,000 jobs
    takes minutes).
    """
    c = get_configuration(wildcards)
    return {
        "image": SCENARIO.test_image_files[int(wildcards.index)],
        "encoder": c.encoder_ckpt,
        "diffusion": c.diffusion_ckpt,
    }


def get_shard(wildcards):
    """
    The group (shard) of a per-image job; a job whose file existed when the run was
    planned (recomputed after a change of settings) goes to the group "shard".
    """
    key = ((wildcards.encoder, wildcards.area), int(wildcards.index))
    return SHARDS.get(key, SHARD_GROUP)


def get_per_image_files(wildcards=None):
    """Every per-image file of the run: all configurations, first n_images images."""
    return SCENARIO.per_image_files()
