"""
A researcher's own data: any area and encoder label, the architecture beside a label
of one's own, settings per configuration (estimator, diffusion, sigma), each checked
before any job and recorded where the jobs read them (issue 49).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from test_scenario import SCHEMA, config

from multigeom_workflow.compute.request import RunSettings
from multigeom_workflow.results.verify import Expected
from multigeom_workflow.scenario import ConfigError, load_scenario
from multigeom_workflow.settings.identity import canonical
from multigeom_workflow.settings.seeds import configuration_estimator


def own_checkpoints(folder, *names) -> dict:
    """Stand-in checkpoints (the scenario checks they exist, not what they hold)."""
    out = {}
    for name in names:
        for kind in ("enc", "diff"):
            path = folder / f"{name}_{kind}.pt"
            path.write_bytes(b"x")
            out[f"{name}_{kind}"] = str(path)
    return out


def mine(ckpts: dict, name: str, area: str, **extra) -> dict:
    return {
        "encoder": name,
        "area": area,
        "encoder_ckpt": ckpts[f"{name}_enc"],
        "diffusion_ckpt": ckpts[f"{name}_diff"],
        **extra,
    }


def test_an_area_and_encoder_of_ones_own_with_settings_of_its_own(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    ckpts = own_checkpoints(tmp_path, "mycnn", "yourcnn")
    demo_est = yaml.safe_load((REPO / "config" / "estimator_demo.yaml").read_text())
    own_est = {
        **demo_est,
        "monte_carlo": {**demo_est["monte_carlo"], "n_samples": 16, "batch_size": 8},
    }
    (tmp_path / "est.yaml").write_text(yaml.safe_dump(own_est))
    entries = [
        mine(ckpts, "mycnn", "IT", architecture="small_cnn", sigma=0.35),
        mine(
            ckpts,
            "yourcnn",
            "IT",
            architecture="small_cnn",
            estimator=str(tmp_path / "est.yaml"),
        ),
    ]
    s = load_scenario(config(configs=entries), REPO)
    a, b = s.configurations
    assert (a.label, a.architecture, a.own) == ("mycnn/IT", "small_cnn", ("sigma",))
    assert (b.own, b.estimator_file) == (("estimator",), tmp_path / "est.yaml")
    # sigma replaces both settings' sigma, for this configuration only
    assert a.sigma == 0.35
    assert a.diffusion["conditioning"]["observation_noise_sigma"] == 0.35
    assert s.estimator["monte_carlo"]["observation_noise_sigma"] == 0.22
    assert b.sigma == 0.22 and b.diffusion == s.diffusion
    # the run's seed and top_k applied to a configuration's own estimator
    assert b.estimator["monte_carlo"]["n_samples"] == 16
    assert (b.estimator["seed"], b.estimator["top_k"]) == (s.seed, s.top_k)
    assert s.estimator_of("yourcnn", "IT") == configuration_estimator(
        b.estimator, "yourcnn", "IT", s.monte_carlo_seeds
    )
    assert s.settings_per_configuration
    # the same area, two encoders: one cross-model pair for the figure
    assert [(x.label, y.label) for x, y in s.comparable_pairs] == [
        ("mycnn/IT", "yourcnn/IT")
    ]


def test_the_run_settings_and_the_check_take_each_configurations_own(
    tmp_path, monkeypatch
):
    from multigeom_workflow.on_snakemake.start import _own_settings
    from multigeom_workflow.settings.names import ESTIMATE_RULE
    from multigeom_workflow.settings.seeds import job_seeds

    monkeypatch.chdir(tmp_path)
    ckpts = own_checkpoints(tmp_path, "mycnn")
    entries = [
        mine(ckpts, "mycnn", "IT", architecture="small_cnn", sigma=0.5),
        {"encoder": "smallcnn", "area": "complex"},
    ]
    s = load_scenario(config(configs=entries), REPO)
    run = RunSettings(
        run_id="1",
        device="cpu",
        estimator=s.estimator,
        diffusion=s.diffusion,
        seeds=job_seeds(s),
        configurations=_own_settings(s),
    )
    # what a job reads is what its rule's params record (rules/common.smk)
    for c in s.configurations:
        got = run.estimator_of(ESTIMATE_RULE, c.encoder, c.area)
        assert canonical(got) == canonical(s.estimator_of(c.encoder, c.area))
        assert run.diffusion_of(c.encoder, c.area) == c.diffusion
        assert run.architecture_of(c.encoder, c.area) == c.architecture
    assert (
        run.estimator_of(ESTIMATE_RULE, "mycnn", "IT")["monte_carlo"][
            "observation_noise_sigma"
        ]
        == 0.5
    )
    assert run.architecture_of("smallcnn", "complex") == "small_cnn"
    # the check before Stage 5 wants each configuration's sigma
    expected = Expected.of_scenario(s)
    assert expected.settings_of("mycnn", "IT")[0] == 0.5
    assert expected.settings_of("smallcnn", "complex")[0] == 0.22


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"encoder": "mycnn", "area": "IT"},
            r"config key 'configs\[0\].architecture' is missing: 'mycnn' is an encoder "
            r"label of your own, .* allowed: inception, resnet50, onoff, small_cnn",
        ),
        (
            {"encoder": "resnet50", "area": "IT", "architecture": "inception"},
            r"'configs\[0\].architecture' = 'inception': the encoder 'resnet50' is "
            r"built as 'resnet50'",
        ),
        (
            {"encoder": "mycnn", "area": "IT", "architecture": "small_cnn"},
            r"'configs\[0\].encoder_ckpt' is not given and its default "
            r"'runs/encoders/mycnn/IT/best_model.pt' does not exist: give the path of "
            r"the mycnn/IT encoder checkpoint \(the workflow makes checkpoints for the "
            r"demo's areas and fetches the paper's only",
        ),
        (
            {
                "encoder": "mycnn",
                "area": "V1",
                "architecture": "small_cnn",
                "encoder_ckpt": "nowhere.pt",
            },
            r"'configs\[0\].encoder_ckpt' = 'nowhere.pt': no such checkpoint file; "
            r"give the path of the mycnn/V1 encoder checkpoint",
        ),
        (
            {"encoder": "mycnn", "area": "complex", "architecture": "small_cnn"},
            r"'configs\[0\].encoder' = 'mycnn': the demo area 'complex' is built for "
            r"the demo encoders only",
        ),
    ],
)
def test_what_is_missing_is_named_for_the_configuration(
    entry, message, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_scenario(config(configs=[entry]), REPO)


def test_a_label_of_ones_own_on_a_paper_area_from_the_hub_needs_its_files(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cfg = config(
        configs=[{"encoder": "mycnn", "area": "V4", "architecture": "small_cnn"}],
        checkpoints={"source": "hub", "repo_id": "x/y", "revision": None},
    )
    with pytest.raises(
        ConfigError,
        match=r"'configs\[0\].encoder_ckpt' is not given .*\(the workflow makes "
        r"checkpoints for the demo's areas and fetches the paper's only",
    ):
        load_scenario(cfg, REPO)


def test_a_configurations_own_settings_are_checked_under_its_own_key(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    ckpts = own_checkpoints(tmp_path, "mycnn")
    est = yaml.safe_load((REPO / "config" / "estimator_demo.yaml").read_text())
    est["monte_carlo"]["observation_noise_sigma"] = 0.3  # its diffusion's is 0.22
    (tmp_path / "est.yaml").write_text(yaml.safe_dump(est))
    entry = mine(
        ckpts,
        "mycnn",
        "IT",
        architecture="small_cnn",
        estimator=str(tmp_path / "est.yaml"),
    )
    with pytest.raises(
        ConfigError,
        match=r"config key 'configs\[0\].estimator' = '.*est.yaml': "
        r"observation_noise_sigma = 0.3 differs from the sigma = 0.22",
    ):
        load_scenario(config(configs=[entry]), REPO)
    # given as the configuration's sigma, both settings take it
    entry = {**entry, "sigma": 0.3}
    assert load_scenario(config(configs=[entry]), REPO).configurations[0].sigma == 0.3
    entry = {**entry, "diffusion": "no_such_settings"}
    with pytest.raises(
        ConfigError, match=r"config key 'configs\[0\].diffusion' = 'no_such_settings'"
    ):
        load_scenario(config(configs=[entry]), REPO)


def test_a_configuration_listed_twice_is_still_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpts = own_checkpoints(tmp_path, "mycnn")
    entry = mine(ckpts, "mycnn", "IT", architecture="small_cnn")
    with pytest.raises(ConfigError, match=r"'configs\[1\]' = mycnn/IT: listed twice"):
        load_scenario(config(configs=[entry, {**entry, "sigma": 0.3}]), REPO)


def test_a_configfile_is_told_which_keys_it_left_to_the_demos_file():
    from multigeom_workflow.settings.load import defaults_taken, defaults_taken_line

    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    schema = yaml.safe_load(Path(SCHEMA).read_text())
    mine = {
        "configs": [{"encoder": "mycnn", "area": "IT", "architecture": "small_cnn"}],
        "n_images": 10,
        "modal": {"gpu": "H100"},
    }
    taken = dict(defaults_taken(demo, mine, schema, skip=("demo",)))
    # the demo's values that differ from the schema's defaults, and only those
    # (modal.max_cost_usd: the demo's 10.0 is the schema's default too)
    assert taken == {
        "monte_carlo_seeds": "per_configuration",
        "estimator": "config/estimator_demo.yaml",
        "diffusion": "config/diffusion_demo.yaml",
    }
    assert "seed" not in taken and "modal.gpu" not in taken and "configs" not in taken
    line = defaults_taken_line(list(taken.items()))
    assert line.startswith(
        "note: config/config.yaml (the demo's settings) gives the keys your "
        "--configfile leaves out: "
    )
    assert "estimator = config/estimator_demo.yaml" in line
    # the paper's file sets every key that changes its run
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    assert defaults_taken(demo, paper, schema, skip=("demo",)) == []
    assert defaults_taken_line([]) is None
    # a file without configurations takes the demo's four
    left = dict(defaults_taken(demo, {"n_images": 1}, schema, skip=("demo",)))
    assert left["configs"] == demo["configs"]
    assert "configs = [4 entries]" in defaults_taken_line(list(left.items()))


def test_a_checkpoint_of_another_architecture_fails_its_job_by_name():
    from multigeom.encoders import NeuralEncoder, OnOffEncoder, SmallCNNBackbone

    from multigeom_workflow.compute.estimate import (
        Models,
        check_architecture,
        encoder_architecture,
    )
    from multigeom_workflow.compute.request import EstimateRequest

    cnn = NeuralEncoder(SmallCNNBackbone(), n_neurons=3)
    assert encoder_architecture(cnn) == "small_cnn"
    assert encoder_architecture(OnOffEncoder(n_neurons=3)) == "onoff"
    assert encoder_architecture(torch.nn.Linear(2, 2)) == ""
    models = Models(cnn, None, None, None, torch.device("cpu"))
    request = EstimateRequest(
        image="x.png",
        index=0,
        out="o.pt",
        estimator={},
        encoder_name="mycnn",
        area="IT",
        encoder_ckpt="/models/mycnn.pt",
        diffusion_ckpt="/models/diff.pt",
        diffusion={},
        architecture="onoff",
    )
    with pytest.raises(
        ValueError,
        match=r"encoder checkpoint '/models/mycnn.pt' of mycnn/IT holds a 'small_cnn' "
        r"encoder, but its configuration's architecture .* is 'onoff'",
    ):
        check_architecture(models, request)
    assert check_architecture(models, replace(request, architecture="small_cnn")) == (
        "small_cnn"
    )
    # a request that names none is not checked
    assert check_architecture(models, replace(request, architecture="")) == "small_cnn"


@pytest.mark.process  # something in upstream's data path asks `uname -p`
def test_the_docs_sigma_calibration_recovers_the_demo_areas_noise(capsys):
    """
    docs/own-data.md's σ block, run as written: upstream's pooled RMS on 30 trials of
    the demo's area (noise 0.22) is 0.22 x sqrt(29/30) on average.
    """
    import re

    doc = (REPO / "docs" / "own-data.md").read_text()
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S)
        if "per_channel_trial_std(" in b
    ]
    namespace: dict = {}
    exec(compile(block, "docs/own-data.md", "exec"), namespace)
    assert namespace["trials"].shape == (30, 64, 50)
    assert namespace["sigma"] == pytest.approx(0.22 * (29 / 30) ** 0.5, abs=0.003)
    assert capsys.readouterr().out == f"sigma = {namespace['sigma']:.3f}\n"
