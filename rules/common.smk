# Configuration: schema validation, the scenario of the run, and the input functions.
# Any bad value stops the run here, before any job, with one line naming the key, the
# value and what is allowed.

import sys

import jsonschema
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

try:
    from multigeom_workflow.scenario import (
        ConfigError,
        load_scenario,
        schema_error_line,
    )
except ImportError as err:
    raise WorkflowError(
        f"the workflow's package is not installed ({err}): run `pip install -e .` "
        "in the repository (see README.md)"
    ) from None


def _scenario(config):
    """Validate `config` against the schema (filling defaults), then build the scenario."""
    if isinstance(config.get("configs"), dict):  # a single pair is accepted
        config["configs"] = [config["configs"]]
    try:
        validate(config, "../config/schemas/config.schema.yaml")
        return load_scenario(config, workflow.basedir)
    except WorkflowError as err:
        cause = err.__context__  # what Snakemake's validate raised from
        if not isinstance(cause, jsonschema.ValidationError):
            raise
        message = schema_error_line(cause)
    except ConfigError as err:
        message = str(err)
    # One line on stderr and exit status 1, before any job: Snakemake would wrap a
    # raised error in a traceback of the rule files.
    sys.exit(f"config error: {message}")


SCENARIO = _scenario(config)
for _problem in SCENARIO.blockers:  # stop a real run; a dry run shows its plan
    if not workflow.output_settings.dryrun:
        sys.exit(f"config error: {_problem}")
    print(f"warning: {_problem}", file=sys.stderr)
RUNS = SCENARIO.runs_dir
RESULTS = config["results_dir"].rstrip("/")
DEMO = config["demo"]
# Per-image jobs compute on the GPU Snakemake gives them when the device is CUDA.
ESTIMATE_GPUS = 1 if SCENARIO.uses_gpu else 0


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
    ]


def get_configuration(wildcards):
    """The scenario's configuration named by the job's wildcards."""
    return SCENARIO.configuration(wildcards.encoder, wildcards.area)


def get_test_image(wildcards):
    """The file of test image `index` (its source's ordering)."""
    return SCENARIO.test_image_files[int(wildcards.index)]


def get_encoder_ckpt(wildcards):
    """The encoder checkpoint of the job's configuration."""
    return get_configuration(wildcards).encoder_ckpt


def get_diffusion_ckpt(wildcards):
    """The diffusion-model checkpoint of the job's configuration."""
    return get_configuration(wildcards).diffusion_ckpt


def get_per_image_files(wildcards=None):
    """Every per-image file of the run: all configurations, first n_images images."""
    return SCENARIO.per_image_files()
