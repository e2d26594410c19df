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


# The figure's references (rules/science.smk): the Monte-Carlo noise ceiling (a second
# estimate of the first `noise_ceiling_images` images of every configuration, other
# seeds) and, for the demo's synthetic areas, the ground truth and the fit reports.
CEILING_IMAGES = int(config["noise_ceiling_images"])
if CEILING_IMAGES > SCENARIO.n_images:
    sys.exit(
        f"config error: config key 'noise_ceiling_images' = {CEILING_IMAGES}: at most "
        f"n_images ({SCENARIO.n_images}); the ceiling compares images of the run"
    )
DEMO_CONFIGS = [c for c in SCENARIO.configurations if c.is_demo]


def get_fit_report(c):
    """The fit report of a demo configuration's encoder, beside its checkpoint."""
    return f"{RUNS}/encoders/{c.encoder}/{c.area}/fit_report.json"


def get_ceiling_files(kind):
    """The run's first estimates (`first`) or the second ones (`second`) compared."""
    folder = "per_image" if kind == "first" else "per_image_ceiling"
    return [
        f"{RUNS}/{folder}/{c.encoder}/{c.area}/img{i:04d}.pt"
        for c in SCENARIO.configurations
        for i in range(CEILING_IMAGES)
    ]


def get_truth_files():
    """The ground-truth files of the demo areas of the run, first n_images images."""
    areas = dict.fromkeys(c.area for c in DEMO_CONFIGS)
    return [
        f"{RUNS}/ground_truth/{a}/img{i:04d}.pt"
        for a in areas
        for i in range(SCENARIO.n_images)
    ]


def get_science_outputs():
    """The reference targets of the run (added to rule all's)."""
    out = []
    if CEILING_IMAGES:
        out.append(f"{RUNS}/metrics/noise_ceiling.json")
    if DEMO_CONFIGS:
        out += [
            f"{RUNS}/diffusion/{c.encoder}/{c.area}/conditioning.json"
            for c in DEMO_CONFIGS
        ]
        out += [f"{RESULTS}/ground_truth.png", f"{RESULTS}/ground_truth.pdf"]
    return out
