"""
The science demo's settings (config/demo_science.yaml, merged into config/config.yaml)
as the workflow reads them: what its dry run plans in an empty folder. Its run itself
takes half an hour or more: `.ci/science-demo`, by hand or on a schedule.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import REPO, planned_jobs, run_snakemake

SCIENCE = REPO / "config" / "demo_science.yaml"


@pytest.mark.workflow
def test_dry_run_plans_the_science_demo(tmp_path):
    """
    6 images of each of the 4 configurations, the first 2 twice (the noise ceiling),
    4 diffusion models, at the science estimator's 256 samples; nothing of the run
    written.
    """
    default = REPO / "config" / "config.yaml"  # the Snakefile's, read from the repo
    result = run_snakemake(
        tmp_path, "-n", "--configfile", str(default), str(SCIENCE), configfile=None
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = planned_jobs(result)
    assert jobs["train_demo_diffusion"] == 4
    assert jobs["fit_demo_encoder"] == 4
    assert jobs["estimate_image"] == 6 * 4
    assert jobs["estimate_image_ceiling"] == 2 * 4
    estimator = yaml.safe_load((REPO / "config/estimator_science.yaml").read_text())
    assert estimator["monte_carlo"]["n_samples"] == 256
    # nothing but Snakemake's own folder (its IO cache, locks: snakemake/dag.py)
    assert [p.name for p in tmp_path.iterdir()] == [".snakemake"]
