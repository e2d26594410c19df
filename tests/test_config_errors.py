"""
Bad configuration values stop the run before any job, with one line that names the
key, the value and what is allowed.

The cases call the validator in-process (`validated_scenario`: the schema, then the
checks that need files, GPUs or the settings files), which is what the Snakefile calls
at parse time; two cases run Snakemake itself, for what only it shows: the one line
``config error: ...`` on stderr, exit status 1, and no job run. Messages are tested for
what they name, not for their words.
"""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass, field

import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG, run_snakemake, said_lines
from fakes import tinyimagenet_zip

from multigeom_workflow.scenario import ConfigError, validated_scenario
from multigeom_workflow.settings.load import load_config


def tiny(**changes) -> dict:
    """The reduced demo's configuration with `changes`."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config.update(changes)
    return config


def assert_names(message: str, key: str, value, allowed: list[str]):
    """
    `message` is one line that names the config key `key`, the value (as Python
    writes it; None: the key has no value to name) and, after them, every word of
    `allowed` (the values, range or remedy it allows).
    """
    assert "\n" not in message, message
    quoted = f"'{key}'"
    assert quoted in message, message
    rest = message[message.index(quoted) + len(quoted) :]
    if value is not None:
        assert repr(value) in rest, message
        rest = rest[rest.index(repr(value)) + len(repr(value)) :]
    for word in allowed:
        assert word in rest, f"{word!r} not named after the value in: {message}"


@dataclass
class Case:
    """A bad configuration: its changes and what the line must name."""

    changes: dict
    key: str
    value: object
    allowed: list[str]
    env: dict = field(default_factory=dict)


CASES = {
    # --- the schema: types, bounds, names, unknown keys -----------------------------
    "n_images zero": Case({"n_images": 0}, "n_images", 0, ["allowed", ">= 1"]),
    "top_k not a number": Case(
        {"top_k": "many"}, "top_k", "many", ["allowed", "integer", ">= 1"]
    ),
    "shards zero": Case({"shards": 0}, "shards", 0, ["allowed", "auto", ">= 1"]),
    "engine unknown": Case(
        {"engine": "turbo"}, "engine", "turbo", ["allowed", "upstream", "fast"]
    ),
    "precision unknown": Case(
        {"precision": "bf16"}, "precision", "bf16", ["allowed", "fp32", "tf32"]
    ),
    "workers unknown": Case(
        {"workers": "lukewarm"}, "workers", "lukewarm", ["allowed", "warm", "cold"]
    ),
    "monte_carlo_seeds unknown": Case(
        {"monte_carlo_seeds": "sometimes"},
        "monte_carlo_seeds",
        "sometimes",
        ["allowed", "shared", "per_configuration"],
    ),
    "device unknown": Case(
        {"device": "gpu"}, "device", "gpu", ["allowed", "auto", "cpu", "cuda:N"]
    ),
    "configs empty": Case({"configs": []}, "configs", None, ["allowed", "1 or more"]),
    # an encoder label of one's own needs its architecture (issue 49)
    "encoder of ones own without architecture": Case(
        {"configs": [{"encoder": "vgg", "area": "V1"}]},
        "configs[0].architecture",
        None,
        ["allowed", "inception", "resnet50", "onoff", "small_cnn"],
    ),
    "architecture other than the labels": Case(
        {"configs": [{"encoder": "onoff", "area": "V1", "architecture": "resnet50"}]},
        "configs[0].architecture",
        "resnet50",
        ["allowed", "'onoff'", "a label of its own"],
    ),
    "architecture unknown": Case(
        {"configs": [{"encoder": "vgg", "area": "V1", "architecture": "vgg16"}]},
        "configs[0].architecture",
        "vgg16",
        ["allowed", "inception", "small_cnn"],
    ),
    "label not a name": Case(
        {"configs": [{"encoder": "onoff", "area": "V1/V4"}]},
        "configs[0].area",
        "V1/V4",
        ["allowed", "letters, digits, _"],
    ),
    # an area of one's own (a single mapping): its checkpoints are the user's
    "area of ones own without checkpoints (a single mapping)": Case(
        {"configs": {"encoder": "onoff", "area": "IT"}},
        "configs[0].encoder_ckpt",
        "runs/encoders/onoff/IT/best_model.pt",
        ["give the path of the onoff/IT encoder checkpoint", "docs/own-data.md"],
    ),
    "test source unknown": Case(
        {"test_images": {"source": "imagenet"}},
        "test_images.source",
        "imagenet",
        ["allowed", "demo", "tinyimagenet", "folder"],
    ),
    "unknown key": Case(
        {"colour": "red"}, "colour", None, ["allowed keys", "configs", "n_images"]
    ),
    "unknown modal key": Case(
        {"modal": {"gpu": "A100", "budget": 3}},
        "budget",
        None,
        ["allowed keys", "gpu", "max_cost_usd"],
    ),
    "modal GPU count 0": Case(
        {"modal": {"gpu": "H100:0"}},
        "modal.gpu",
        "H100:0",
        ["allowed", "H100", "count of 1 or more"],
    ),
    "modal GPU exact-type mark": Case(
        {"modal": {"gpu": "T4!"}}, "modal.gpu", "T4!", ["allowed", "T4"]
    ),
    # --- counts that other values bound --------------------------------------------
    "n_images above the test set": Case(
        {"n_images": 17}, "n_images", 17, ["16 images", "allowed", "1 to 16"]
    ),
    "top_k above the rows of D": Case(
        {"top_k": 9}, "top_k", 9, ["8 rows", "at most 8"]
    ),
    "noise ceiling above n_images": Case(
        {"noise_ceiling_images": 3, "n_images": 2},
        "noise_ceiling_images",
        3,
        ["allowed", "0 to", "(2)"],
    ),
    # --- configurations and their checkpoints --------------------------------------
    "paper encoder on a demo area": Case(
        {"configs": [{"encoder": "inception", "area": "complex"}]},
        "configs[0].encoder",
        "inception",
        ["allowed", "onoff", "smallcnn"],
    ),
    "configuration twice": Case(
        {"configs": [{"encoder": "onoff", "area": "complex"}] * 2},
        "configs[1]",
        None,
        ["onoff/complex", "allowed once"],
    ),
    "paper checkpoint missing": Case(
        {
            "configs": [
                {"encoder": "inception", "area": "V1"},
                {"encoder": "onoff", "area": "complex"},
            ]
        },
        "configs[0].encoder_ckpt",
        "runs/encoders/inception/V1/best_model.pt",
        ["inception/V1", "checkpoints.source: hub"],
    ),
    # --- test images ----------------------------------------------------------------
    "TinyImageNet folder missing": Case(
        {"test_images": {"source": "tinyimagenet", "path": "/no/such/folder"}},
        "test_images.path",
        "/no/such/folder",
        ["tiny-imagenet-200/val", "test_images.download: true"],
    ),
    "folder source without a path": Case(
        {"test_images": {"source": "folder"}},
        "test_images.path",
        None,
        ["folder", "required", "'folder'"],
    ),
    # --- seeds: every image's seed within torch's range ------------------------------
    "seed above torch's range": Case(
        {"seed": 10**20, "noise_ceiling_images": 0},
        "seed",
        10**20,
        ["seed + i", "allowed", f"0 to {2**64 - 2}"],
    ),
    "seed negative": Case(
        {"seed": -1, "noise_ceiling_images": 0},
        "seed",
        -1,
        ["allowed", f"0 to {2**64 - 2}"],
    ),
    "seed of the noise ceiling": Case(  # its second estimates: seed + 10**6 + i
        {"seed": 2**64 - 10**6, "noise_ceiling_images": 1},
        "seed",
        2**64 - 10**6,
        ["seed + 1000000 + i", "allowed", f"0 to {2**64 - 10**6 - 1}"],
    ),
    # --- the device and the engine ----------------------------------------------------
    "GPU not on this machine": Case(
        {"device": "cuda:99"},
        "device",
        "cuda:99",
        ["1 GPU", "allowed", "cuda:0", "cuda", "auto", "cpu"],
        env={"CUDA_VISIBLE_DEVICES": "0"},
    ),
    "tf32 on the CPU": Case(
        {"precision": "tf32"}, "precision", "tf32", ["CUDA", "allowed", "fp32"]
    ),
    # --- folders and settings files ------------------------------------------------
    "results folder under a file": Case(
        {"results_dir": "taken/results"},
        "results_dir",
        "taken/results",
        ["'taken' is not a folder", "a folder this user can write to"],
    ),
    "estimator file missing": Case(
        {"estimator": "nope.yaml"},
        "estimator",
        "nope.yaml",
        ["packaged names", "'estimator'"],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_value_is_one_line_naming_key_value_and_allowed(
    name, tmp_path, monkeypatch
):
    case = CASES[name]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("a file where a folder is expected")
    for var, value in case.env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(**case.changes), REPO)
    assert_names(str(err.value), case.key, case.value, case.allowed)


@pytest.mark.workflow
@pytest.mark.parametrize(
    ("name", "args"), [("n_images zero", ()), ("GPU not on this machine", ("-n",))]
)
def test_snakemake_says_one_line_and_runs_no_job(tmp_path, name, args):
    """What Snakemake shows: ``config error: <line>``, exit status 1, nothing run."""
    case = CASES[name]
    configfile = tmp_path / "bad.yaml"
    configfile.write_text(yaml.safe_dump(tiny(**case.changes)))
    work = tmp_path / "work"
    work.mkdir()
    result = run_snakemake(work, *args, configfile=configfile, env=case.env)
    assert result.returncode == 1
    lines = said_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("config error: ")
    assert_names(lines[0], case.key, case.value, case.allowed)
    assert sorted(p.name for p in work.iterdir()) in ([], [".snakemake"])


# --- seeds: the bound is torch's own ----------------------------------------------


def test_seed_bound_is_torchs():
    from multigeom_workflow.settings.names import MAX_SEED

    torch.Generator().manual_seed(MAX_SEED)
    with pytest.raises(RuntimeError, match="Overflow"):
        torch.Generator().manual_seed(MAX_SEED + 1)
    plain = {"noise_ceiling_images": 0}
    validated_scenario(tiny(seed=MAX_SEED - 1, **plain), REPO)  # images 0, 1: fit
    with pytest.raises(ConfigError, match="'seed'"):
        validated_scenario(tiny(seed=MAX_SEED, **plain), REPO)
    # one noise-ceiling image: seeded seed + 10**6, the largest seed of the run
    ceiling = {"noise_ceiling_images": 1}
    validated_scenario(tiny(seed=MAX_SEED - 10**6, **ceiling), REPO)
    with pytest.raises(ConfigError, match="noise-ceiling"):
        validated_scenario(tiny(seed=MAX_SEED - 10**6 + 1, **ceiling), REPO)


# --- folders the run writes into ---------------------------------------------------


@pytest.mark.parametrize(
    "folder, key",
    [("results", "results_dir"), ("runs/per_image/onoff/simple", "runs_dir")],
)
def test_read_only_folder_is_named(tmp_path, monkeypatch, folder, key):
    # (as root, chmod does not stop writes: os.access stands in for a read-only mount)
    monkeypatch.chdir(tmp_path)
    (tmp_path / folder).mkdir(parents=True)
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if str(p) == folder else real(p, m)
    )
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(), REPO)
    assert_names(str(err.value), key, folder.split("/")[0], [repr(folder), "writable"])


# --- files the configuration names ----------------------------------------------------


@pytest.mark.parametrize(
    "text, kind", [("- 1\n- 2\n", "list"), ("just words\n", "str")]
)
def test_configfile_that_is_not_a_mapping_is_named(tmp_path, monkeypatch, text, kind):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"--configfile 'bad\.yaml'") as err:
        load_config(["bad.yaml"], [], REPO)
    assert kind in str(err.value) and "mapping" in str(err.value)


def test_unreadable_tinyimagenet_image_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    zipfile.ZipFile(io.BytesIO(tinyimagenet_zip(12))).extractall("data")
    bad = tmp_path / "data/tiny-imagenet-200/val/images/val_1.JPEG"
    bad.write_bytes(bad.read_bytes()[:40])  # cut short
    images = {"source": "tinyimagenet", "path": "data"}
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(n_images=3, test_images=images), REPO)
    assert_names(str(err.value), "test_images.path", None, ["1", str(bad.name)])


def test_folder_holding_val_under_another_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tin" / "val" / "images").mkdir(parents=True)
    images = {"source": "tinyimagenet", "path": "tin"}
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(test_images=images), REPO)
    assert_names(
        str(err.value), "test_images.path", "tin", ["val", "tiny-imagenet-200"]
    )


# --- the estimator's settings file ----------------------------------------------------

ESTIMATOR_EDITS = {
    "batch not dividing the samples": (
        {"n_samples": 6, "batch_size": 4},
        ["n_samples", "6", "batch_size", "4"],
    ),
    "sigma not the diffusion model's": (
        {"observation_noise_sigma": 0.5},
        ["observation_noise_sigma", "0.5", "0.22"],
    ),
    "timesteps beyond the schedule": (
        {"timestep_grid": {"start": 200, "stop": 1200, "step": 500}},
        ["timestep_grid", "[200, 700, 1200]", "[0, 1000)"],
    ),
}


@pytest.mark.parametrize("name", ESTIMATOR_EDITS)
def test_estimator_settings_checked_before_any_job(tmp_path, monkeypatch, name):
    edit, words = ESTIMATOR_EDITS[name]
    monkeypatch.chdir(tmp_path)
    est = yaml.safe_load((REPO / "tests" / "data" / "estimator_tiny.yaml").read_text())
    for key, value in edit.items():
        if isinstance(value, dict):
            est["monte_carlo"][key].update(value)
        else:
            est["monte_carlo"][key] = value
    (tmp_path / "est.yaml").write_text(yaml.safe_dump(est))
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(estimator="est.yaml"), REPO)
    assert_names(str(err.value), "estimator", str(tmp_path / "est.yaml"), words)


def test_estimator_without_j_is_refused(tmp_path):
    """fisher_baseline.enabled: false would write files without J(x), all bad."""
    est = yaml.safe_load((REPO / "tests" / "data" / "estimator_tiny.yaml").read_text())
    est.setdefault("fisher_baseline", {})["enabled"] = False
    est_file = tmp_path / "no_j.yaml"
    est_file.write_text(yaml.safe_dump(est))
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(estimator=str(est_file)), REPO)
    assert_names(
        str(err.value), "estimator", str(est_file), ["fisher_baseline.enabled", "false"]
    )


def test_assert_names_fails_on_a_line_that_does_not_name():
    """The check above can fail: a value, a word, or a second line that is missing."""
    line = "config key 'n_images' = 17: the test set has 16 images; allowed: 1 to 16"
    assert_names(line, "n_images", 17, ["allowed", "1 to 16"])
    for key, value, allowed in [
        ("top_k", 17, []),
        ("n_images", 18, []),
        ("n_images", 17, ["1 to 15"]),
        ("n_images", 17, ["config key"]),  # named before the key only
    ]:
        with pytest.raises(AssertionError):
            assert_names(line, key, value, allowed)
    with pytest.raises(AssertionError):
        assert_names(line + "\nTraceback", "n_images", 17, [])


def test_nested_values_of_the_command_line_are_read_as_yaml():
    """
    ``--config 'modal={gpu: H100, max_cost_usd: 5}'``: Snakemake's own parser
    (snakemake/cli.py, `parse_config`, YAML's BaseLoader) hands every nested value as
    a string; the workflow reads a refused one as YAML (5, not '5'), and a value
    still refused is named as YAML reads it.
    """
    from snakemake.cli import parse_config

    given = parse_config(["modal={gpu: H100, max_cost_usd: 5}"])
    assert given == {"modal": {"gpu": "H100", "max_cost_usd": "5"}}
    scenario = validated_scenario(tiny(**given), REPO)
    assert scenario.modal["max_cost_usd"] == 5 and scenario.modal["gpu"] == "H100"
    negative = parse_config(["modal={gpu: H100, max_cost_usd: -5}"])
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(**negative), REPO)
    assert_names(str(err.value), "modal.max_cost_usd", -5, [">=", "0"])
    text = parse_config(["modal={max_cost_usd: five}"])
    with pytest.raises(ConfigError) as err:
        validated_scenario(tiny(**text), REPO)
    assert_names(str(err.value), "modal.max_cost_usd", "five", ["number"])
