# Fetching the paper's inputs: the published checkpoints from the Hugging Face Hub and
# the TinyImageNet test images. Defined only when the configuration asks for them
# (checkpoints.source: hub, test_images.download: true).

from multigeom_workflow.settings.names import (
    PAPER_AREAS,
    PAPER_ENCODERS,
    TINYIMAGENET_DIR,
)

HUB = config["checkpoints"]
TEST_IMAGES = config["test_images"]


if HUB["source"] == "hub":

    rule fetch_encoder:
        output:
            LAYOUT.encoder_ckpt_pattern,
        log:
            "logs/fetch_encoder/{encoder}/{area}.log",
        wildcard_constraints:
            encoder="|".join(PAPER_ENCODERS),
            area="|".join(PAPER_AREAS),
        # It tries again itself (a transfer that stalls or breaks, a damaged cache:
        # inputs/hub.py) and ends with one line; a retry here would only hold the run.
        retries: 0
        localrule: True
        conda:
            CONDA_ENV
        params:
            kind="encoders",
            repo_id=HUB["repo_id"],
            revision=HUB["revision"],
        script:
            "../scripts/fetch_checkpoint.py"

    rule fetch_diffusion:
        output:
            LAYOUT.diffusion_ckpt_pattern,
        log:
            "logs/fetch_diffusion/{encoder}/{area}.log",
        wildcard_constraints:
            encoder="|".join(PAPER_ENCODERS),
            area="|".join(PAPER_AREAS),
        # It tries again itself (a transfer that stalls or breaks, a damaged cache:
        # inputs/hub.py) and ends with one line; a retry here would only hold the run.
        retries: 0
        localrule: True
        conda:
            CONDA_ENV
        params:
            kind="diffusion",
            repo_id=HUB["repo_id"],
            revision=HUB["revision"],
        script:
            "../scripts/fetch_checkpoint.py"


if SCENARIO.test_source == "tinyimagenet" and TEST_IMAGES["download"]:

    rule download_tinyimagenet:
        output:
            f"{TEST_IMAGES['path']}/{TINYIMAGENET_DIR}.zip",
        log:
            "logs/download_tinyimagenet.log",
        # It tries again itself (a transfer that stalls or breaks, a damaged cache:
        # inputs/hub.py) and ends with one line; a retry here would only hold the run.
        retries: 0
        localrule: True
        conda:
            CONDA_ENV
        params:
            urls=TEST_IMAGES["urls"],
            expected_bytes=TEST_IMAGES["archive_bytes"],
        script:
            "../scripts/download_tinyimagenet.py"

    rule extract_test_image:
        input:
            archive=rules.download_tinyimagenet.output[0],
        output:
            f"{TEST_IMAGES['path']}/{TINYIMAGENET_DIR}/val/images/{{name}}.JPEG",
        log:
            "logs/extract_test_image/{name}.log",
        wildcard_constraints:
            name=r"val_\d+",
        localrule: True
        conda:
            CONDA_ENV
        script:
            "../scripts/extract_test_image.py"
