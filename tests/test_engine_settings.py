"""
"Upstream runs in fp32 only" is one check (`settings.checks.engine_precision_problem`):
the configuration's validator and the per-image job refuse the same pair with the same
line.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, TINY_CONFIG

from multigeom_workflow.compute.estimate import estimate_to_file
from multigeom_workflow.scenario import ConfigError, validated_scenario
from multigeom_workflow.settings.checks import engine_precision_problem


@pytest.mark.parametrize(
    ("engine", "precision", "refused"),
    [("upstream", "tf32", True), ("upstream", "fp32", False), ("fast", "tf32", False)],
)
def test_engine_precision_problem_names_key_value_and_allowed(
    engine, precision, refused
):
    problem = engine_precision_problem(engine, precision)
    assert (problem is not None) == refused
    if refused:
        assert "'precision'" in problem and repr(precision) in problem
        assert "upstream" in problem and "allowed: fp32" in problem


def test_the_validator_and_the_job_refuse_alike(tmp_path):
    line = engine_precision_problem("upstream", "tf32")
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config |= {"engine": "upstream", "precision": "tf32"}
    with pytest.raises(ConfigError) as at_parse:
        validated_scenario(config, REPO)
    assert str(at_parse.value) == line
    # A job on a CUDA device (tf32 allowed there) with the upstream engine: refused
    # before any model or image is read.
    models = SimpleNamespace(device="cuda:0")
    with pytest.raises(ValueError) as in_job:
        estimate_to_file(
            models,
            tmp_path / "missing.png",
            0,
            tmp_path / "img0000.pt",
            {},
            encoder_name="onoff",
            area="V1",
            engine="upstream",
            precision="tf32",
        )
    assert str(in_job.value) == line
