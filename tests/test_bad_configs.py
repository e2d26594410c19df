"""
Configurations checked at parse time against what will use them (seed range, visible
GPUs, writable folders, comparable configurations), schema messages that say what is
allowed, the CLI reading the configuration exactly as Snakemake does, the tinyimagenet
folder given as itself, and a full disk named while writing a per-image file.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG, planned_jobs, run_snakemake
from fakes import tinyimagenet_zip
from PIL import Image

from multigeom_workflow.atomic import write_error_line
from multigeom_workflow.scenario import ConfigError, validated_scenario
from multigeom_workflow.settings.load import load_config


def tiny(**changes) -> dict:
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config.update(changes)
    return config


def snakemake_with(tmp_path, config, *args, env=None):
    configfile = tmp_path / "c.yaml"
    configfile.write_text(yaml.safe_dump(config))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return run_snakemake(work, *args, configfile=configfile, env=env), work


BAD = [
    # (changes, environment, words the one line must hold)
    (
        {"seed": 10**20, "noise_ceiling_images": 0},
        {},
        ["'seed' = 100000000000000000000", "seed + i", "0 to 18446744073709551614"],
    ),
    (
        {"seed": -1, "noise_ceiling_images": 0},
        {},
        ["'seed' = -1", "0 to 18446744073709551614"],
    ),
    (  # the noise ceiling's second estimates are seeded seed + 10**6 + i
        {"seed": 2**64 - 10**6, "noise_ceiling_images": 1},
        {},
        [
            "'seed' = 18446744073708551616",
            "seed + 1000000 + i",
            "0 to 18446744073708551615",
        ],
    ),
    (
        {"device": "cuda:99"},
        {"CUDA_VISIBLE_DEVICES": "0"},
        ["'device' = 'cuda:99'", "shows 1 GPU(s)", "allowed: cuda:0, cuda"],
    ),
    ({"shards": 0}, {}, ["'shards' = 0", "allowed: auto or an integer >= 1"]),
    (
        {"noise_ceiling_images": 3, "n_images": 2},
        {},
        ["'noise_ceiling_images' = 3", "allowed: 0 to n_images (2)"],
    ),
    (
        {"colour": "red"},
        {},
        ["'colour' was unexpected", "allowed keys: configs, n_images, runs_dir"],
    ),
    (
        {"modal": {"gpu": "A100", "budget": 3}},
        {},
        ["'budget' was unexpected", "allowed keys: gpu, max_cost_usd"],
    ),
    (
        {"modal": {"gpu": "H100:0"}},
        {},
        ["'modal.gpu' = 'H100:0'", "not allowed; allowed: Modal GPU", "count of 1"],
    ),
    (  # Modal's "exact type" mark: no price for it, refused before the dry run's
        {"modal": {"gpu": "T4!"}},
        {},
        ["'modal.gpu' = 'T4!'", "not allowed; allowed: Modal GPU"],
    ),
    (
        {"device": "gpu"},
        {},
        ["'device' = 'gpu'", "not allowed; allowed: Device of", "cuda:N"],
    ),
    (
        {"results_dir": "taken/results"},
        {},
        ["'results_dir' = 'taken/results'", "'taken' is not a folder"],
    ),
]


@pytest.mark.parametrize("changes, env, words", BAD, ids=[str(c) for c, _, _ in BAD])
def test_bad_value_is_one_line_before_any_job(tmp_path, changes, env, words):
    work = tmp_path / "work"
    work.mkdir()
    (work / "taken").write_text("a file where a folder is expected")
    result, _ = snakemake_with(tmp_path, tiny(**changes), "-n", env=env)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("config error: ")
    for word in words:
        assert word in lines[0]


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
    value = folder.split("/")[0]
    with pytest.raises(
        ConfigError, match=f"'{key}' = '{value}': '{folder}' is not writable"
    ):
        validated_scenario(tiny(), REPO)


@pytest.mark.parametrize(
    "configs",
    [
        {"encoder": "onoff", "area": "complex"},  # a single mapping
        [
            {"encoder": "onoff", "area": "complex"},
            {"encoder": "smallcnn", "area": "simple"},
        ],
    ],
    ids=["one configuration", "no comparable pair"],
)
def test_incomparable_run_computes_per_image_files_only(tmp_path, configs):
    result, _ = snakemake_with(tmp_path, tiny(configs=configs), "-n")
    assert result.returncode == 0, result.stderr
    jobs = planned_jobs(result)
    assert jobs["estimate_image"] == 2 * (1 if isinstance(configs, dict) else 2)
    assert "align_configs" not in jobs and "plot_fig4de" not in jobs
    notes = [line for line in result.stderr.splitlines() if "are left out" in line]
    assert len(notes) == 1 and "Stage 5 and the figure" in notes[0]


# ---- the command line reads the configuration as Snakemake does -------------------

PROBE = """
import json
configfile: "config/config.yaml"
print("CONFIG=" + json.dumps(config, sort_keys=True))
rule all:
    output: []
"""

BASE = {"n_images": 8, "seed": 42, "test_images": {"source": "demo", "path": None}}
MORE = {"n_images": 12, "test_images": {"path": "x"}, "modal": {"gpu": "H100"}}
EXTRA = {"modal": {"max_cost_usd": 3}, "configs": [{"encoder": "onoff", "area": "V1"}]}
COMBINATIONS = {
    "config.yaml only": (True, [], []),
    "--configfile deep-merged over config.yaml": (True, ["more.yaml"], []),
    "two --configfile, then --config": (
        True,
        ["more.yaml", "extra.yaml"],
        ["n_images=3", "seed=7", "device=cpu"],
    ),
    "--configfile without config.yaml": (False, ["more.yaml"], ["top_k=4"]),
    "--replace-workflow-config": (True, ["more.yaml"], ["--replace-workflow-config"]),
}


@pytest.mark.parametrize("name", COMBINATIONS)
def test_cli_config_is_snakemakes(tmp_path, monkeypatch, name):
    has_base, files, config = COMBINATIONS[name]
    (tmp_path / "Snakefile").write_text(PROBE)
    if has_base:
        (tmp_path / "config").mkdir()
        (tmp_path / "config/config.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "more.yaml").write_text(yaml.safe_dump(MORE))
    (tmp_path / "extra.yaml").write_text(yaml.safe_dump(EXTRA))
    replace = "--replace-workflow-config" in config
    overrides = [c for c in config if c != "--replace-workflow-config"]
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1"]
    if files:
        cmd += ["--configfile", *files]
    if overrides:
        cmd += ["--config", *overrides]
    if replace:
        cmd += ["--replace-workflow-config"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    line = [x for x in result.stdout.splitlines() if x.startswith("CONFIG=")]
    assert line, result.stderr
    snakemakes = json.loads(line[-1].removeprefix("CONFIG="))
    monkeypatch.chdir(tmp_path)
    ours = load_config(files, overrides, REPO, replace)
    assert json.loads(json.dumps(ours, sort_keys=True)) == snakemakes


def test_progress_plans_what_snakemake_plans(tmp_path):
    # The example: config/config.yaml (the demo, 8 images) and --configfile
    # more.yaml with n_images: 12: Snakemake plans 4 x 12; so does progress.
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_text(
        (REPO / "config/config.yaml").read_text()
    )
    (tmp_path / "more.yaml").write_text("n_images: 12\n")
    dry = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n"]
        + ["--cores", "1", "--configfile", "more.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert dry.stderr.count("     0 / 12 images done") == 4
    cli = subprocess.run(
        [sys.executable, "-m", "multigeom_workflow.cli", "progress"]
        + ["--configfile", "more.yaml", "--workflow-dir", str(REPO)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert cli.stdout.splitlines()[-1] == "all                           0 / 48", (
        cli.stderr
    )


@pytest.mark.parametrize(
    "text, kind", [("- 1\n- 2\n", "list"), ("just words\n", "str")]
)
def test_configfile_that_is_not_a_mapping_is_named(tmp_path, monkeypatch, text, kind):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(
        ConfigError,
        match=rf"--configfile 'bad.yaml': holds a {kind}, not a mapping of config keys",
    ):
        load_config(["bad.yaml"], [], REPO)


# ---- test_images.path given as the tiny-imagenet-200 folder itself ----------------


@pytest.mark.parametrize("download", [False, True])
def test_tinyimagenet_folder_itself_is_read_as_its_parent(
    tmp_path, monkeypatch, download
):
    monkeypatch.chdir(tmp_path)
    if not download:
        zipfile.ZipFile(io.BytesIO(tinyimagenet_zip(12))).extractall("data")
    images = {"source": "tinyimagenet", "path": "data/tiny-imagenet-200"}
    config = tiny(n_images=3, test_images={**images, "download": download})
    local = validated_scenario(config, REPO)
    assert config["test_images"]["path"] == "data"  # the rules read this
    assert local.notes == (
        "note: config key 'test_images.path' = 'data/tiny-imagenet-200' is "
        "TinyImageNet's folder itself: read as the folder that holds it, 'data'",
    )
    container = validated_scenario(
        tiny(n_images=3, test_images={**images, "download": download}), REPO, True
    )
    want = [f"data/tiny-imagenet-200/val/images/val_{i}.JPEG" for i in (0, 1, 10)]
    assert list(local.test_image_files[:3]) == want
    assert list(container.test_image_files[:3]) == want


def test_unreadable_tinyimagenet_image_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    zipfile.ZipFile(io.BytesIO(tinyimagenet_zip(12))).extractall("data")
    bad = tmp_path / "data/tiny-imagenet-200/val/images/val_1.JPEG"
    bad.write_bytes(bad.read_bytes()[:40])  # cut short
    images = {"source": "tinyimagenet", "path": "data"}
    with pytest.raises(
        ConfigError, match=r"test image 1 '.*val_1\.JPEG' cannot be read"
    ):
        validated_scenario(tiny(n_images=3, test_images=images), REPO)


def test_folder_holding_val_under_another_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tin" / "val" / "images").mkdir(parents=True)
    images = {"source": "tinyimagenet", "path": "tin"}
    with pytest.raises(ConfigError, match="'tin': holds val/ directly; name that"):
        validated_scenario(tiny(test_images=images), REPO)


# ---- a full disk while writing a per-image file ----------------------------------


def test_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch):
    import multigeom.pipeline.per_image as per_image

    from multigeom_workflow.compute.estimate import Models, estimate_to_file

    s = validated_scenario(tiny(), REPO)
    eig = SimpleNamespace(eigenvalues=torch.ones(5), eigenvectors=torch.eye(5, 4096))
    # Upstream's estimator is stood in for (its result does not matter here); its
    # torch.save writes to /dev/full, which answers every write with ENOSPC as a full
    # disk does: torch says "[enforce fail at inline_container.cc:664] . unexpected
    # pos ...".
    monkeypatch.setattr(per_image, "estimate_image", lambda *a, **k: (eig, eig))
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, "/dev/full"))
    models = Models(None, None, None, None, torch.device("cpu"))
    out = tmp_path / "per_image" / "img0000.pt"
    image = tmp_path / "x.png"
    Image.new("L", (64, 64), 100).save(image)
    with pytest.raises(OSError) as err:
        estimate_to_file(
            models, image, 0, out, s.estimator, encoder_name="onoff", area="complex"
        )
    message = str(err.value)
    assert message.startswith(f"{out}: could not be written, the disk of {out.parent}")
    assert "MB free); free space (or set runs_dir to another disk) and run again" in (
        message
    )
    assert "unexpected pos" in str(err.value.__cause__)
    assert not out.exists() and not list(out.parent.iterdir())


def test_read_only_write_is_named(tmp_path):
    err = PermissionError(13, "Permission denied")
    line = write_error_line(err, tmp_path / "runs/per_image/a/b/img0000.pt")
    assert line.startswith(f"{tmp_path}/runs/per_image/a/b/img0000.pt: could not be")
    assert f"{tmp_path} is read-only for this user (Permission denied)" in line


def test_estimator_without_j_is_refused(tmp_path):
    """fisher_baseline.enabled: false would write files without J(x), all bad."""
    est = yaml.safe_load((REPO / "tests" / "data" / "estimator_tiny.yaml").read_text())
    est.setdefault("fisher_baseline", {})["enabled"] = False
    est_file = tmp_path / "no_j.yaml"
    est_file.write_text(yaml.safe_dump(est))
    with pytest.raises(ConfigError, match="fisher_baseline.enabled = false"):
        validated_scenario(tiny(estimator=str(est_file)), REPO)
