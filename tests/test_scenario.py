"""The scenario: settings files, test-image ordering, checks made before any job."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY_CONFIG
from PIL import Image
from snakemake.utils import validate

from multigeom_workflow.inputs.images import (
    DEMO_TEST_PHOTOS,
    list_folder_images,
    list_tinyimagenet_val,
)
from multigeom_workflow.scenario import ConfigError, load_scenario
from multigeom_workflow.settings.files import resolve_settings_file

SCHEMA = str(REPO / "config" / "schemas" / "config.schema.yaml")


def config(**changes) -> dict:
    """The default config with the reduced demo's values and `changes`, validated."""
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg.update(yaml.safe_load(TINY_CONFIG.read_text()))
    cfg.update(changes)
    validate(cfg, SCHEMA)
    return cfg


@pytest.mark.parametrize("name", ["estimator", "diffusion", "inception", "onoff"])
def test_packaged_names_resolve_as_upstream(name, tmp_path, monkeypatch):
    from multigeom.config import config_path

    monkeypatch.chdir(tmp_path)
    assert resolve_settings_file(name, "estimator", REPO) == config_path(name).resolve()


def test_settings_paths_are_found_in_the_workflow_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = resolve_settings_file("config/estimator_demo.yaml", "estimator", REPO)
    assert found == REPO / "config" / "estimator_demo.yaml"
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "estimator_demo.yaml").write_text("{}")
    # The working directory comes first.
    found = resolve_settings_file("config/estimator_demo.yaml", "estimator", REPO)
    assert found == (tmp_path / "config" / "estimator_demo.yaml").resolve()


def make_tinyimagenet(root: Path) -> list[Path]:
    """A TinyImageNet-like val split with images in two sub-folders, unsorted names."""
    files = []
    for sub, names in (
        ("images", ["val_10.JPEG", "val_2.JPEG", "val_1.JPEG"]),
        ("extra", ["a.JPEG"]),
    ):
        for name in names:
            path = root / "tiny-imagenet-200" / "val" / sub / name
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), color=(len(files) * 40, 0, 0)).save(path)
            files.append(path)
    (root / "tiny-imagenet-200" / "val" / "val_annotations.txt").write_text("")
    return files


def test_tinyimagenet_order_is_upstreams(tmp_path):
    from multigeom.datasets import TinyImageNetDataset

    make_tinyimagenet(tmp_path)
    upstream = TinyImageNetDataset("val", tmp_path / "tiny-imagenet-200").image_paths
    assert list_tinyimagenet_val(tmp_path) == upstream
    assert list_tinyimagenet_val(tmp_path / "tiny-imagenet-200") == upstream
    assert [p.name for p in upstream] == [
        "a.JPEG",
        "val_1.JPEG",
        "val_10.JPEG",
        "val_2.JPEG",
    ]


def test_folder_source_sorts_image_files(tmp_path):
    for name in ("b.PNG", "a.jpg", "notes.txt", "c.pgm"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "d.png").mkdir()
    assert [p.name for p in list_folder_images(tmp_path)] == ["a.jpg", "b.PNG", "c.pgm"]


def test_demo_scenario(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_scenario(config(), REPO)
    assert [(c.encoder, c.area) for c in s.configurations] == [
        ("onoff", "complex"),
        ("smallcnn", "complex"),
        ("onoff", "simple"),
        ("smallcnn", "simple"),
    ]
    assert all(c.is_demo for c in s.configurations)
    assert len(s.test_image_files) == len(DEMO_TEST_PHOTOS) >= 16
    assert s.per_image_files()[:3] == [
        "runs/per_image/onoff/complex/img0000.pt",
        "runs/per_image/onoff/complex/img0001.pt",
        "runs/per_image/smallcnn/complex/img0000.pt",
    ]
    # The workflow's seed and top_k override the settings file's.
    assert (s.estimator["seed"], s.estimator["top_k"]) == (42, 5)
    assert s.estimator["fisher_baseline"]["top_k"] == 5
    assert not s.uses_gpu


def test_tinyimagenet_scenario_counts_the_test_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_tinyimagenet(tmp_path / "data")
    source = {"source": "tinyimagenet", "path": str(tmp_path / "data")}
    s = load_scenario(config(test_images=source, n_images=4), REPO)
    assert [Path(f).name for f in s.test_image_files][:2] == ["a.JPEG", "val_1.JPEG"]
    with pytest.raises(
        ConfigError, match=r"'n_images' = 5: .* has 4 images; allowed: 1 to 4"
    ):
        load_scenario(config(test_images=source, n_images=5), REPO)


def test_own_checkpoints_of_a_paper_area(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "enc.pt").write_bytes(b"x")
    (tmp_path / "diff.pt").write_bytes(b"x")
    entry = {
        "encoder": "inception",
        "area": "V1",
        "encoder_ckpt": "enc.pt",
        "diffusion_ckpt": "diff.pt",
    }
    s = load_scenario(config(configs=[entry]), REPO)
    c = s.configuration("inception", "V1")
    assert (c.encoder_ckpt, c.diffusion_ckpt, c.is_demo) == ("enc.pt", "diff.pt", False)
    entry["diffusion_ckpt"] = "missing.pt"
    with pytest.raises(
        ConfigError, match=r"configs\[0\].diffusion_ckpt' = 'missing.pt'"
    ):
        load_scenario(config(configs=[entry]), REPO)


def test_schema_allows_any_label_the_rules_match_and_upstreams_architectures():
    import re

    import multigeom.encoders.backbones  # noqa: F401  (registers upstream's backbones)
    from multigeom.encoders.reference import REFERENCE_ENCODERS
    from multigeom.encoders.registry import BACKBONES

    from multigeom_workflow.settings.layout import WILDCARD_CONSTRAINTS
    from multigeom_workflow.settings.names import (
        ARCHITECTURES,
        AREAS,
        ENCODERS,
        default_architecture,
    )

    schema = yaml.safe_load(Path(SCHEMA).read_text())
    entry = schema["$defs"]["configuration"]["properties"]
    for key in ("encoder", "area"):
        assert entry[key]["pattern"] == f"^{WILDCARD_CONSTRAINTS[key]}$"
    for name in (*ENCODERS, *AREAS, "IT", "mouse_V1", "my_cnn2"):
        assert re.fullmatch(entry["encoder"]["pattern"], name)
    for name in ("V1/x", "a b", "", "V1.2"):
        assert not re.fullmatch(entry["encoder"]["pattern"], name)
    # what upstream builds: its reference encoders and registered backbones
    assert sorted(ARCHITECTURES) == sorted({*REFERENCE_ENCODERS, *BACKBONES})
    assert entry["architecture"]["enum"] == list(ARCHITECTURES)
    assert all(default_architecture(e) in ARCHITECTURES for e in ENCODERS)


def test_backbone_weights_in_torch_home_let_a_run_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("enc.pt", "diff.pt"):
        (tmp_path / name).write_bytes(b"x")
    entry = {
        "encoder": "resnet50",
        "area": "V4",
        "encoder_ckpt": "enc.pt",
        "diffusion_ckpt": "diff.pt",
    }
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    (blocker,) = load_scenario(config(configs=[entry]), REPO).blockers
    assert (
        f"{tmp_path}/torch/hub/checkpoints/resnet50-11ad3fa6.pth are missing" in blocker
    )
    (tmp_path / "torch/hub/checkpoints").mkdir(parents=True)
    (tmp_path / "torch/hub/checkpoints/resnet50-11ad3fa6.pth").write_bytes(b"w")
    assert load_scenario(config(configs=[entry]), REPO).blockers == ()


def test_hub_checkpoints_need_no_file_but_own_paths_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hub = {"source": "hub"}
    s = load_scenario(
        config(configs=[{"encoder": "onoff", "area": "V1"}], checkpoints=hub), REPO
    )
    assert (
        s.configuration("onoff", "V1").encoder_ckpt
        == "runs/encoders/onoff/V1/best_model.pt"
    )
    own = {"encoder": "onoff", "area": "V1", "encoder_ckpt": "mine.pt"}
    with pytest.raises(
        ConfigError, match=r"encoder_ckpt' = 'mine.pt': no such checkpoint"
    ):
        load_scenario(config(configs=[own], checkpoints=hub), REPO)
    with pytest.raises(ConfigError, match="or set checkpoints.source: hub"):
        load_scenario(config(configs=[{"encoder": "onoff", "area": "V1"}]), REPO)


def test_remote_job_scenario_needs_only_its_own_files(tmp_path, monkeypatch):
    """A job Snakemake runs in a Modal container holds only its shard's files: the
    checkpoints of other configurations are not checked there, TinyImageNet images
    take their known names (the order of a complete folder), a folder is refused."""
    from multigeom_workflow.inputs.images import tinyimagenet_val_files

    monkeypatch.chdir(tmp_path)
    make_tinyimagenet(tmp_path / "data")
    paper = [{"encoder": "onoff", "area": "V1"}, {"encoder": "onoff", "area": "V4"}]
    partial = {"source": "tinyimagenet", "path": str(tmp_path / "nothing-here")}
    cfg = config(configs=paper, test_images=partial, n_images=4)
    with pytest.raises(ConfigError):  # locally: missing checkpoints and folder
        load_scenario(cfg, REPO)
    s = load_scenario(cfg, REPO, remote=True)
    assert s.test_image_files == tuple(tinyimagenet_val_files(partial["path"]))
    assert len(s.configurations) == 2
    folder = {"source": "folder", "path": str(tmp_path / "data")}
    with pytest.raises(ConfigError, match="not supported with a remote executor"):
        load_scenario(config(test_images=folder), REPO, remote=True)
