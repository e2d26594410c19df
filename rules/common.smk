# Configuration: schema validation, the scenario of the run, and the input functions.
# Any bad value stops the run here, before any job, with one line naming the key, the
# value and what is allowed.

import os
import sys

from snakemake.exceptions import WorkflowError

try:
    from multigeom_workflow.compute.gpus import visible_gpu_ids
    from multigeom_workflow.compute.request import RunSettings
    from multigeom_workflow.compute.workers import clean_after_killed_runs
    from multigeom_workflow.scenario import ConfigError, validated_scenario
    from multigeom_workflow.settings.files import resolve_settings_file
    from multigeom_workflow.planning.plan import pending_images
    from multigeom_workflow.planning.shards import SHARD_GROUP, num_shards, shard_groups
    from multigeom_workflow.planning.slurm import (
        plan_for_run,
        restore_ended_allocations,
        status_query_problem,
        submission_problem,
    )
except ImportError as err:
    raise WorkflowError(
        f"the workflow's packages are not installed ({err}): run `pip install -e . "
        "./plugins/snakemake-executor-plugin-modal` in the repository (see README.md)"
    ) from None

def check_installed_package():
    """
    A warning line when the `multigeom_workflow` package Python imports is not this
    workflow's own (``src/`` beside the Snakefile): another checkout installed in the
    environment would run its code with this workflow's rules.
    """
    import multigeom_workflow

    here = os.path.realpath(os.path.join(workflow.basedir, "src"))
    imported = os.path.realpath(os.path.dirname(multigeom_workflow.__file__))
    if not workflow.remote_exec and os.path.dirname(imported) != here:
        print(
            f"warning: the multigeom_workflow package imported is {imported}, not this "
            f"workflow's ({here}/multigeom_workflow): run `pip install -e .` in "
            f"{workflow.basedir} to use this checkout",
            file=sys.stderr,
        )


check_installed_package()

try:  # the schema (config/schemas/config.schema.yaml), then the file-system checks
    SCENARIO = validated_scenario(config, workflow.basedir, workflow.remote_exec)
except ConfigError as err:
    # One line on stderr and exit status 1, before any job: Snakemake would wrap a
    # raised error in a traceback of the rule files.
    sys.exit(f"config error: {err}")
# Problems that stop a real run (at its start, `check_before_first_job`, where the
# executor is known: a Modal container's image brings its own weights); a dry run
# shows its plan with them as warnings.
if workflow.output_settings.dryrun:
    for _problem in SCENARIO.blockers:
        print(f"warning: {_problem}", file=sys.stderr)
if SCENARIO.gpu_fallback:
    print(SCENARIO.gpu_fallback, file=sys.stderr)
for _note in SCENARIO.notes:
    print(_note, file=sys.stderr)
if SCENARIO.stage5_skipped:
    print(SCENARIO.stage5_skipped, file=sys.stderr)
# Per-image files that SLURM allocations finished before they ended early, put back
# before Snakemake plans what is left (docs/slurm.md).
_restored = None if workflow.remote_exec else restore_ended_allocations(SCENARIO)
if _restored:
    print(_restored, file=sys.stderr)


def export_run_settings():
    """
    What every per-image job of this run shares, resolved once here and handed to them
    in the environment (they inherit it; `RunSettings.to_env`): the run (the process
    its warm workers and CPU shares belong to), device, GPU ids, CPU shares, settings
    files, seed, engine. In a SLURM allocation (a shard, profiles/slurm) every
    per-image job is a Snakemake process of its own: they keep the allocation's first
    Snakemake as their run, so that one warm worker serves the whole shard, with slot
    locks of the allocation's own (SLURM numbers every allocation's GPUs from 0, and
    allocations may share a node).
    """
    slurm_job = os.environ.get("SLURM_JOB_ID", "")
    if slurm_job and os.environ.get("MULTIGEOM_SLURM_JOB_ID") == slurm_job:
        return  # a later Snakemake process of the same allocation
    os.environ.update(
        RunSettings(
            run_id=str(os.getpid()),
            device=SCENARIO.device,
            gpu_ids=visible_gpu_ids() if SCENARIO.uses_gpu else [],
            # in an allocation: one share, one warm worker (compute/gpus.py)
            cpu_slots=1 if slurm_job else int(workflow.resource_settings.cores or 1),
            warm=SCENARIO.warm_workers,
            settings_files={
                key: str(resolve_settings_file(str(config[key]), key, workflow.basedir))
                for key in ("estimator", "diffusion")
            },
            seed=int(config["seed"]),
            engine=SCENARIO.engine,
            precision=SCENARIO.precision,
        ).to_env(),
        MULTIGEOM_SLURM_JOB_ID=slurm_job,
        # a shard submitted by this workflow (not a local run inside an allocation):
        # its finished files are kept if it ends early (compute/kept.py)
        MULTIGEOM_SLURM_SHARD=slurm_job if workflow.remote_exec else "",
    )
    if slurm_job:
        from multigeom_workflow.compute.gpus import allocation_lock_dir

        os.environ.update(MULTIGEOM_GPU_LOCK_DIR=str(allocation_lock_dir(slurm_job)))


export_run_settings()
RUNS = SCENARIO.runs_dir
RESULTS = config["results_dir"].rstrip("/")
DEMO = config["demo"]
# Per-image jobs compute on the GPU Snakemake gives them when the device is CUDA.
ESTIMATE_GPUS = 1 if SCENARIO.uses_gpu else 0


def register_shard_groups(shards):
    """
    Make every shard's group (``shard-00``, ``shard-01``, ...) count as the one group
    name "shard", so that a profile's `group-components: [shard=N]` makes one
    submission of up to N images of a shard: Snakemake keys --group-components by that
    parent name, as for groups written with wildcards. This writes Snakemake's internal
    `workflow.parent_groupids` (the mapping it fills for such groups; Snakemake 9.19 to
    9.x): tests/test_shards.py and tests/test_slurm.py fail if an upgrade changes it.
    """
    for shard in set(shards.values()):
        workflow.parent_groupids[shard] = SHARD_GROUP


# The per-image computations left, split into balanced shards. Groups matter only
# where Snakemake submits them: remote executors, which require --jobs (and the jobs
# they run remotely). Local runs ignore groups, and a dry run plans faster without them.
SHARDED = workflow.resource_settings.nodes is not None or not workflow.is_main_process
# A run for SLURM (profiles/slurm asks SLURM resources of the per-image jobs): shards
# whose time limits fit the cluster's cap, more of them where needed (docs/slurm.md).
try:
    SLURM_PLAN = plan_for_run(
        SCENARIO, workflow.resource_settings, config["shards"], workflow.remote_exec
    )
except ConfigError as err:
    sys.exit(f"config error: {err}")
if SLURM_PLAN and not workflow.output_settings.dryrun:
    for _line in SLURM_PLAN.over_cap():  # a dry run lists them with its plan
        print(f"warning: {_line}", file=sys.stderr)
SHARDS = (
    SLURM_PLAN.groups()
    if SLURM_PLAN
    else shard_groups(
        pending_images(SCENARIO),
        num_shards(config["shards"], workflow.resource_settings.nodes),
    )
    if SHARDED
    else {}
)
register_shard_groups(SHARDS)

wildcard_constraints:
    encoder="[A-Za-z0-9_]+",
    area="[A-Za-z0-9_]+",
    index=r"\d\d\d\d+",


def get_final_outputs():
    """
    Every per-image file, Stage 5's metrics, the figure, the report's tables and the
    references (noise ceiling, ground truth). The per-image files are targets
    themselves, so that one deleted after the figure was drawn is recomputed.
    Without two comparable configurations (`Scenario.stage5_skipped`), the per-image
    files, their check and the references that need no comparison (noise ceiling,
    ground truth).
    """
    if SCENARIO.stage5_skipped:
        return [
            *SCENARIO.per_image_files(),
            f"{RUNS}/metrics/per_image_checked.tsv",
            *get_science_outputs(),
        ]
    return [
        *SCENARIO.per_image_files(),
        f"{RUNS}/metrics/cross_encoder_metrics.json",
        f"{RESULTS}/fig4de.png",
        f"{RESULTS}/fig4de.pdf",
        # the report's tables (rules/report.smk)
        f"{RESULTS}/report/stage5_metrics.html",
        f"{RESULTS}/report/progress.html",
        f"{RESULTS}/report/settings.html",
        *get_science_outputs(),  # rules/science.smk: noise ceiling, ground truth
    ]


def get_expected_per_image():
    """What every per-image file of the run must hold (`verify.Expected`), as a dict."""
    from dataclasses import asdict

    from multigeom_workflow.results.verify import Expected

    return asdict(Expected.of_scenario(SCENARIO))


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


# The estimator settings of each configuration's per-image jobs: the run's, with the
# configuration's seed (config key monte_carlo_seeds; shared: the run's seed, one dict).
ESTIMATORS = {
    (c.encoder, c.area): SCENARIO.estimator_of(c.encoder, c.area)
    for c in SCENARIO.configurations
}


def get_estimator(wildcards):
    """The estimator settings of a per-image job (its configuration's seed applied)."""
    return ESTIMATORS[(wildcards.encoder, wildcards.area)]


def get_shard(wildcards):
    """
    The group (shard) of a per-image job; a job whose file existed when the run was
    planned (recomputed after a change of settings) goes to the group "shard".
    """
    key = ((wildcards.encoder, wildcards.area), int(wildcards.index))
    return SHARDS.get(key, SHARD_GROUP)


def get_estimate_resources():
    """
    The resources of a per-image job (rules estimate_image, estimate_image_ceiling),
    in one place: `gpu`, 1 when it computes on this machine's GPU (remote profiles set
    their own count); `runtime`, its time limit in minutes on SLURM (below);
    and for the Modal executor plugin, the GPU and the budget of the config's `modal`
    section (`modal_gpu`, `modal_max_cost_usd`: the plugin reads a job's own values
    before its --modal-gpu and --modal-max-cost-usd), so that the dry run's estimate
    and the run on Modal use one GPU type and one budget (the budget as a string:
    Snakemake rounds a float resource to an integer).
    """
    return {
        "gpu": ESTIMATE_GPUS,
        "runtime": ESTIMATE_RUNTIME_MIN,
        "modal_gpu": SCENARIO.modal["gpu"],
        "modal_max_cost_usd": str(float(SCENARIO.modal["max_cost_usd"])),
    }


def share_estimate_image_resources(target):
    """
    Give `target` (another per-image job's rule, estimate_image_ceiling) the
    resources that a profile or the command line sets for estimate_image
    (`set-resources`), except those set for `target` by name: a profile names the
    per-image rule once.
    """
    from snakemake.resources import Resources

    given = workflow.resource_settings.overwrite_resources
    own = Resources(dict(given.get(target.name, {})))
    shared = Resources(dict(given.get("estimate_image", {})))
    target.resources.update(
        Resources({name: r for name, r in shared.items() if name not in own})
    )


def get_per_image_files(wildcards=None):
    """Every per-image file of the run: all configurations, first n_images images."""
    return SCENARIO.per_image_files()


def prepare_estimate_jobs():
    """
    At the start of a real run (onstart, below), once Snakemake holds the
    working directory: remove what killed runs left (ended runs' sockets and CPU
    shares, temporary folders beside per-image files), and, on this machine's GPUs,
    start no more per-image jobs than there are GPUs (the `gpu` resource, unless
    --resources gpu=N gave it) instead of jobs waiting on each other's slot.
    """
    clean_after_killed_runs(
        folder
        for c in SCENARIO.configurations
        for folder in (
            os.path.dirname(SCENARIO.per_image_file(c.encoder, c.area, 0)),
            os.path.dirname(SCENARIO.ceiling_file(c.encoder, c.area, 0)),
        )
    )
    given = dict(workflow.resource_settings.resources)
    scheduler = getattr(workflow, "scheduler", None)
    if workflow.local_exec and SCENARIO.uses_gpu and "gpu" not in given and scheduler:
        # device cuda:N: every job computes on GPU N
        n_gpus = 1 if ":" in SCENARIO.device else max(len(visible_gpu_ids()), 1)
        workflow.scheduler.global_resources["gpu"] = n_gpus
        workflow.scheduler.resources["gpu"] = n_gpus


# The figure's references (rules/science.smk): the Monte-Carlo noise ceiling (a second
# estimate of the first `noise_ceiling_images` images of every configuration, other
# seeds) and, for the demo's synthetic areas, the ground truth and the fit reports.
CEILING_IMAGES = SCENARIO.ceiling_images  # config key noise_ceiling_images
DEMO_CONFIGS = [c for c in SCENARIO.configurations if c.is_demo]


def get_fit_report(c):
    """The fit report of a demo configuration's encoder, beside its checkpoint."""
    return f"{RUNS}/encoders/{c.encoder}/{c.area}/fit_report.json"


def get_ceiling_files(kind):
    """The run's first estimates (`first`) or the second ones (`second`) compared."""
    path = SCENARIO.per_image_file if kind == "first" else SCENARIO.ceiling_file
    return [
        path(c.encoder, c.area, i)
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


# What is left and what it will take: every dry run prints the estimate before its job
# list; a real run with the Modal executor refuses to start over budget.
from multigeom_workflow.planning.cost import budget_problem, read_timings
from multigeom_workflow.planning.live_view import set_plan
from multigeom_workflow.planning.plan import (
    add_progress,
    ceiling_progress,
    estimate_lines,
    progress,
    run_estimates,
)


def _estimates(done):
    """
    The local and the Modal estimate of the work left (`done`: `progress` with the
    noise ceiling's second estimates), with this run's settings.
    """
    settings = workflow.resource_settings
    resources = {
        name: getattr(value, "value", value)
        for name, value in dict(settings.resources).items()
        if not name.startswith("_")
    }
    return run_estimates(SCENARIO, done, settings.cores, settings.nodes, resources)


# On SLURM, a per-image job's `runtime` (minutes) is its share of its shard's time
# limit (`SlurmPlan.runtimes`: Snakemake sums a group's runtimes into the allocation's
# --time). Elsewhere, and inside an allocation, `runtime` is not used.
_RUNTIMES = SLURM_PLAN.runtimes() if SLURM_PLAN else {}


def get_runtime(wildcards):
    """A per-image job's share of its shard's time limit (minutes), on SLURM."""
    key = ((wildcards.encoder, wildcards.area), int(wildcards.index))
    return _RUNTIMES.get(key, SLURM_PLAN.single_minutes())


ESTIMATE_RUNTIME_MIN = get_runtime if SLURM_PLAN and SLURM_PLAN.shards else None

if not workflow.output_settings.dryrun and not workflow.remote_exec:
    # the per-image files of the run, for the live view (--logger multigeom)
    set_plan(
        {
            f"{c.encoder}/{c.area}": SCENARIO.per_image_files(c)
            for c in SCENARIO.configurations
        }
    )

#: How a profile marks a value its user must set (profiles/slurm): a run refuses it.
PLACEHOLDER_PREFIX = "SET-"


def profile_placeholders():
    """
    One line per resource value that a profile (or --set-resources) left as the
    profile's placeholder (``SET-...``, e.g. ``slurm_account=SET-your-account``): SLURM
    would refuse such an allocation only once submitted, so the run refuses it first.
    """
    lines = []
    for rule, resources in workflow.resource_settings.overwrite_resources.items():
        for name, value in dict(resources).items():
            value = str(getattr(value, "raw", value)).strip("'\"")  # as written
            if value.startswith(PLACEHOLDER_PREFIX):
                lines.append(
                    f"profile entry set-resources {rule}:{name}={value} is the "
                    "profile's placeholder: give your cluster's value in a copy of the "
                    "profile or with --set-resources, or remove the entry "
                    "(docs/slurm.md)"
                )
    return lines


if workflow.output_settings.dryrun:
    for _line in profile_placeholders():
        print(f"warning: {_line}", file=sys.stderr)
    _done, _ceiling = progress(SCENARIO), ceiling_progress(SCENARIO)
    _left = add_progress(_done, _ceiling)
    _lines = estimate_lines(SCENARIO, _done, _ceiling, *_estimates(_left))
    if SLURM_PLAN:
        _lines += SLURM_PLAN.lines()
    print("\n".join(_lines), file=sys.stderr)


def check_before_first_job():
    """
    At the start of a real run, where the executor is known: local runs need
    torchvision's weights (`Scenario.blockers`); on Modal the container image holds
    them, a folder of test images cannot be listed there, and the run must fit the
    budget (`modal.max_cost_usd`) at the config's `modal.gpu` (the GPU the per-image
    jobs ask the plugin for: `get_estimate_resources`); a local run with ``device:
    cuda`` (or ``cuda:N``) asked for on a machine without GPU is refused (``auto``
    falls back to the CPU with a notice). A profile's placeholder
    (`profile_placeholders`) stops any run. Exits with one line.
    """
    for line in profile_placeholders():
        sys.exit(f"config error: {line}")
    plugin = workflow.executor_plugin
    name = getattr(plugin, "name", None)
    if name == "slurm":  # sacct without job accounting: the run would never end
        _status = getattr(workflow.executor_settings, "status_command", None)
        problem = status_query_problem(_status)
        if problem:
            sys.exit(f"config error: {problem}")
        if SLURM_PLAN and SLURM_PLAN.limits:  # sbatch's own words if it refuses
            problem = submission_problem(
                workflow.resource_settings.overwrite_resources.get("estimate_image"),
                max(SLURM_PLAN.limits),
            )
            if problem:
                sys.exit(f"config error: {problem}")
    if name != "modal":
        for problem in SCENARIO.blockers:
            sys.exit(f"config error: {problem}")
    if name == "local" and SCENARIO.gpu_fallback and SCENARIO.device_asked != "auto":
        # cuda or cuda:N asked for explicitly, no GPU here, the jobs would run here
        sys.exit(
            f"config error: config key 'device' = {SCENARIO.device_asked!r}: this "
            "machine shows no GPU and a local run computes here; allowed for a local "
            "run: auto or cpu (with the Modal or SLURM profile the jobs run on their "
            "GPUs)"
        )
    if name == "modal":
        if SCENARIO.test_source == "folder":
            sys.exit(
                "config error: config key 'test_images.source' = 'folder': not "
                "supported on Modal (a container holds only its shard's images, so "
                "the folder's order cannot be read there); use tinyimagenet or demo, "
                "or run locally"
            )
        modal = _estimates(progress(SCENARIO, with_ceiling=True))[1]
        problem = budget_problem(modal, SCENARIO.modal["max_cost_usd"])
        if problem:
            sys.exit(problem)


onstart:
    prepare_estimate_jobs()
    check_before_first_job()
