"""
How a configuration is read: the CLI reads it exactly as Snakemake does (config.yaml,
--configfile, --config), a run without comparable configurations computes the
per-image files only, and TinyImageNet's folder given as itself is read as its parent.
Bad values are tests/test_config_errors.py's.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import pytest
import yaml
from conftest import REPO, TINY_CONFIG, planned_jobs, run_snakemake
from fakes import tinyimagenet_zip

from multigeom_workflow.scenario import validated_scenario
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


@pytest.mark.workflow
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


@pytest.mark.workflow
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


@pytest.mark.workflow
def test_progress_plans_what_snakemake_plans(tmp_path):
    # The example: config/config.yaml (the demo, 8 images) and --configfile
    # more.yaml with n_images: 12: Snakemake plans 4 x 12, and the noise ceiling's
    # 4 x 2 second estimates; so does progress.
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
    assert cli.stdout.splitlines()[-2:] == [
        "noise ceiling                 0 / 8",
        "all                           0 / 56",
    ], cli.stderr


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
