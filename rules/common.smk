# Configuration: schema validation, the scenario of the run, and the input functions.
# Any bad value stops the run here, before any job, with one line naming the key, the
# value and what is allowed. What the workflow does to Snakemake itself (the run's
# settings handed to the jobs, shard groups, resources, the dry run's estimate, the
# checks before the first job) is the package multigeom_workflow.on_snakemake.

from snakemake.exceptions import WorkflowError

try:
    from multigeom_workflow import on_snakemake as hooks
    from multigeom_workflow.results.verify import CHECKED_LIST_COLUMNS
    from multigeom_workflow.settings.files import timestep_grid
    from multigeom_workflow.settings.identity import canonical
    from multigeom_workflow.settings.layout import WILDCARD_CONSTRAINTS
    from multigeom_workflow.settings.seeds import (
        ceiling_estimator,
        configuration_diffusion,
    )
except ImportError as err:
    raise WorkflowError(
        f"the workflow's packages are not installed ({err}): run `pip install -e . "
        "./plugins/snakemake-executor-plugin-modal` in the repository (see README.md)"
    ) from None

# The conda environment that each job activates with `--sdm conda` (the rules' `conda`
# directive): the one `conda env create -f environment.yml` makes, by its name there.
# Snakemake runs in it too, since the Snakefile imports this package
# (README.md, "On a fresh machine"). Without --sdm conda (and outside --lint) it is
# None: Snakemake would otherwise export the named environment for each job's record
# (conda needed on every machine) and rerun finished jobs when it changes.
CONDA_ENV = hooks.conda_env(workflow, "multigeom-workflow")

# the schema (config/schemas/config.schema.yaml), the file-system checks, and the rest
RUN = hooks.start(workflow, config)
SCENARIO = RUN.scenario
LAYOUT = SCENARIO.layout  # every path of the run (multigeom_workflow.settings.layout)
RUNS = SCENARIO.runs_dir
DEMO = config["demo"]
# The figure's references (rules/science.smk): the Monte-Carlo noise ceiling (a second
# estimate of the first `noise_ceiling_images` images of every configuration, other
# seeds) and, for the demo's synthetic areas, the ground truth and the fit reports.
CEILING_IMAGES = SCENARIO.ceiling_images  # config key noise_ceiling_images
# The eigenvectors as pictures (rules/figures.smk): the first `eigenvector_images` test
# images (at most n_images, so that a smaller n_images needs no second change), the top
# EIGENVECTORS_DRAWN eigenvectors of each matrix (at most top_k).
EIGENVECTOR_IMAGES = min(int(config["eigenvector_images"]), SCENARIO.n_images)
EIGENVECTORS_DRAWN = min(3, SCENARIO.top_k)
DEMO_CONFIGS = [c for c in SCENARIO.configurations if c.is_demo]
# The settings as rules record them (params): in canonical form (keys sorted, numbers
# normalized, the estimator's defaults filled in and its device left out:
# multigeom_workflow.settings.identity), so that a rerun follows what changes a
# result, never the text or order of a settings file. Every mapping a rule takes as
# a param goes through `canonical`.
ESTIMATOR_PARAMS = canonical(SCENARIO.estimator)
DIFFUSION_PARAMS = canonical(SCENARIO.diffusion)


def demo_diffusion_params(encoder, area):
    """
    The diffusion settings (canonical) a demo configuration's model is trained with:
    its train.seed from config key demo.diffusion_seeds
    (multigeom_workflow.settings.seeds.configuration_diffusion).
    """
    return canonical(
        configuration_diffusion(
            SCENARIO.diffusion_of(encoder, area), encoder, area, DEMO["diffusion_seeds"]
        )
    )


wildcard_constraints:
    **WILDCARD_CONSTRAINTS,


def get_final_outputs():
    """
    Every per-image file (the noise ceiling's second estimates too), Stage 5's
    metrics, the figure, the report's tables and the references (noise ceiling,
    ground truth). The per-image files are targets themselves, so that one deleted
    after the figure was drawn is recomputed.
    Without two comparable configurations (`Scenario.stage5_skipped`), the per-image
    files, their check and the references that need no comparison.
    """
    checked = [*get_checked_files(), LAYOUT.per_image_checked]
    if SCENARIO.stage5_skipped:
        return [*checked, *get_science_outputs()]
    return [
        *checked,
        LAYOUT.stage5_metrics,
        LAYOUT.result("fig4de.png"),
        LAYOUT.result("fig4de.pdf"),
        # the report's tables (rules/report.smk)
        LAYOUT.result("report/stage5_metrics.html"),
        LAYOUT.result("report/progress.html"),
        LAYOUT.result("report/settings.html"),
        *get_science_outputs(),  # rules/science.smk: noise ceiling, ground truth
    ]


def get_expected_per_image():
    """What every per-image file of the run must hold (`verify.Expected`), as a dict."""
    from dataclasses import asdict

    from multigeom_workflow.results.verify import Expected

    expected = asdict(Expected.of_scenario(SCENARIO))
    if not expected["configurations"]:  # the record of runs without any
        del expected["configurations"]
    return canonical(expected)


def get_estimate_inputs(wildcards):
    """
    The inputs of a per-image job: the test image `index` (in its source's order) and
    the configuration's encoder and diffusion checkpoints. One function for the three,
    because Snakemake inspects every input function of every job.
    """
    c = SCENARIO.configuration(wildcards.encoder, wildcards.area)
    return {
        "image": SCENARIO.test_image_files[int(wildcards.index)],
        "encoder": c.encoder_ckpt,
        "diffusion": c.diffusion_ckpt,
    }


# The settings of each configuration's per-image jobs: its estimator (its own or the
# run's) with its seed (config key monte_carlo_seeds), and its diffusion settings. When
# every configuration takes the run's settings and shared seeds, the rules hold one
# dict for all (no function to call per job).
ESTIMATORS = {
    (c.encoder, c.area): canonical(SCENARIO.estimator_of(c.encoder, c.area))
    for c in SCENARIO.configurations
}
DIFFUSIONS = {
    (c.encoder, c.area): canonical(c.diffusion) for c in SCENARIO.configurations
}
CEILING_ESTIMATORS = {
    (c.encoder, c.area): canonical(ceiling_estimator(c.estimator))
    for c in SCENARIO.configurations
}
ONE_ESTIMATOR = (
    SCENARIO.monte_carlo_seeds == "shared" and not SCENARIO.settings_per_configuration
)


def get_estimator(wildcards):
    """The estimator settings of a per-image job (its configuration's seed applied)."""
    return ESTIMATORS[(wildcards.encoder, wildcards.area)]


def get_diffusion(wildcards):
    """The diffusion settings of a per-image job's configuration."""
    return DIFFUSIONS[(wildcards.encoder, wildcards.area)]


def get_ceiling_estimator(wildcards):
    """The estimator settings of a noise-ceiling job (the ceiling's seed applied)."""
    return CEILING_ESTIMATORS[(wildcards.encoder, wildcards.area)]


def get_shard(wildcards):
    """The group (shard) of a per-image job (`hooks.Run.shard_of`)."""
    return RUN.shard_of(wildcards.encoder, wildcards.area, wildcards.index)


def get_checked_files(wildcards=None):
    """What the check before Stage 5 reads: per-image files and the ceiling's."""
    return [*SCENARIO.per_image_files(), *SCENARIO.ceiling_files()]


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
    return [LAYOUT.truth_file(a, i) for a in areas for i in range(SCENARIO.n_images)]


def get_science_outputs():
    """
    The reference targets of the run (added to rule all's), and the eigenvectors as
    pictures (drawn with one configuration too).
    """
    out = []
    if CEILING_IMAGES:
        out.append(LAYOUT.noise_ceiling)
    if EIGENVECTOR_IMAGES:  # rules/figures.smk: needs no comparison
        out += [LAYOUT.result("eigenvectors.png"), LAYOUT.result("eigenvectors.pdf")]
    if DEMO_CONFIGS:
        out += [LAYOUT.conditioning_report(c.encoder, c.area) for c in DEMO_CONFIGS]
        out += [LAYOUT.result("ground_truth.png"), LAYOUT.result("ground_truth.pdf")]
    return out


onstart:
    hooks.on_start(workflow, RUN)


onsuccess:
    hooks.on_end(workflow, RUN)


onerror:
    hooks.on_end(workflow, RUN)
