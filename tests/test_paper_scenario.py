"""
The paper's scenario: `config/paper.yaml` planned without network, and the fetch rules
run end to end against servers on 127.0.0.1 standing in for the Hub and TinyImageNet's
host.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, planned_jobs, run_snakemake
from fakes import FileServer, hub_path, tinyimagenet_zip

PAPER = REPO / "config" / "paper.yaml"


@pytest.mark.workflow
def test_dry_run_plans_the_paper_without_network(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    result = run_snakemake(
        work, "-n", configfile=PAPER, env={"TORCH_HOME": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert planned_jobs(result) == {
        "download_tinyimagenet": 1,
        "fetch_encoder": 4,
        "fetch_diffusion": 4,
        "extract_test_image": 200,
        "estimate_image": 800,
        "verify_per_image_files": 1,
        "estimate_image_ceiling": 8,  # noise_ceiling_images: 2 per configuration
        "align_ceiling": 1,
        "align_configs": 1,
        "plot_fig4de": 1,
        "plot_eigenvectors": 1,  # eigenvector_images: its first 2 images
        "summarize_run": 1,
        "all": 1,
    }
    # Torchvision's weights are not cached here: a warning per missing file.
    warnings = [
        line for line in result.stderr.splitlines() if line.startswith("warning:")
    ]
    assert len(warnings) == 2
    assert "inception_v3_google-0cc3c7bd.pth are missing" in warnings[0]
    assert "resnet50-11ad3fa6.pth are missing" in warnings[1]
    # shared draws, as the paper: the dry run names the control the figure draws
    control = [
        line for line in result.stderr.splitlines() if "shared-draws control" in line
    ]
    assert control == [
        "shared-draws control: Fig. 4D draws, beside each compared pair's G curve, its "
        "curve on the noise ceiling's 2 image(s) with independent draws (one "
        "configuration's first estimate against the other's second), in "
        "noise_ceiling.json too (config key shared_draws_control)"
    ]
    # the paper's file sets every key that changes its run: nothing is the demo's
    assert "--configfile leaves out" not in result.stderr


@pytest.mark.workflow
def test_real_run_without_backbone_weights_stops_before_any_job(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    result = run_snakemake(
        work, configfile=PAPER, env={"TORCH_HOME": str(tmp_path / "t")}
    )
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("config error")]
    assert len(lines) == 1  # one message, at the start of the run (onstart)
    assert lines[0].startswith("config error: config key 'configs[0].encoder'")
    assert "inception_v3_google-0cc3c7bd.pth are missing" in lines[0]
    assert "torchvision.models.inception_v3(weights='IMAGENET1K_V1')" in lines[0]
    assert "Finished job" not in result.stderr  # no job ran
    assert sorted(p.name for p in work.iterdir()) in ([], [".snakemake"])


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def published():
    """What the fake Hub publishes: an ON-OFF encoder and a tiny UNet per area."""
    from multigeom.diffusion.model import build_diffusion_model
    from multigeom.encoders import OnOffEncoder

    from multigeom_workflow.settings.files import to_namespace

    diffusion = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
    files = {}
    for seed, area in enumerate(("V1", "V4")):
        torch.manual_seed(seed)
        encoder = OnOffEncoder(n_neurons=50)
        files[f"encoders/onoff/{area}/best_model.pt"] = saved(
            {
                "model_state_dict": encoder.state_dict(),
                "config": {"architecture": encoder.config},
            }
        )
        unet = build_diffusion_model(to_namespace(diffusion))
        files[f"diffusion/onoff/{area}/final_model.pt"] = saved(
            {"model_state_dict": unet.state_dict(), "epoch": 200}
        )
    return files


@pytest.mark.workflow
def test_fetch_rules_run_the_paper_layout_end_to_end(tmp_path, published):
    zip_bytes = tinyimagenet_zip(12)
    files = {hub_path("lab/multigeom", k): v for k, v in published.items()}
    files["/tiny-imagenet-200.zip"] = zip_bytes
    work = tmp_path / "work"
    work.mkdir()
    with FileServer(files) as server:
        config = {
            "configs": [
                {"encoder": "onoff", "area": "V1"},
                {"encoder": "onoff", "area": "V4"},
            ],
            "n_images": 2,
            "top_k": 5,
            "estimator": "tests/data/estimator_tiny.yaml",
            "diffusion": "tests/data/diffusion_tiny.yaml",
            "checkpoints": {"source": "hub", "repo_id": "lab/multigeom"},
            "test_images": {
                "source": "tinyimagenet",
                "path": "data",
                "download": True,
                "urls": [f"{server.url}/tiny-imagenet-200.zip"],
                "archive_bytes": len(zip_bytes),
            },
        }
        configfile = tmp_path / "paper-like.yaml"
        configfile.write_text(yaml.safe_dump(config))
        env = {"HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf")}
        result = run_snakemake(work, configfile=configfile, env=env)
        assert result.returncode == 0, result.stderr[-3000:]

    for name, data in published.items():
        assert (work / "runs" / name).read_bytes() == data
    # Only the test images the run needs were extracted.
    images = sorted(
        p.name for p in (work / "data/tiny-imagenet-200/val/images").iterdir()
    )
    assert images == ["val_0.JPEG", "val_1.JPEG"]
    first = torch.load(work / "runs/per_image/onoff/V1/img0001.pt", weights_only=False)
    assert first["G_eigenvectors"].shape == (5, 4096)

    # Interoperability: upstream's own Stage 5 on our run folder gives our metrics.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "multigeom.pipeline.alignment",
            "--runs-dir",
            "runs",
            "--out-dir",
            "upstream",
            "--max-k",
            "5",
        ],
        cwd=work,
        check=True,
        capture_output=True,
    )
    ours = json.loads((work / "runs/metrics/cross_encoder_metrics.json").read_text())
    theirs = json.loads((work / "upstream/cross_encoder_metrics.json").read_text())
    # Equal to float64 rounding: the two processes may add in another order (relative
    # differences of ~1e-16 seen on 2026-12-01; the test compared with == before).
    assert close(ours["pairs"], theirs["pairs"]) and close(
        ours["named"], theirs["named"]
    )
    assert "cross_area_onoff__G" in ours["named"]


def close(a, b, rel=1e-12) -> bool:
    """Nested JSON values equal, floats to a relative `rel` (and 1e-15 absolute)."""
    import math

    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(close(a[k], b[k], rel) for k in a)
        )
    if isinstance(a, list):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(close(x, y, rel) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)
    return a == b


def test_close_tells_values_apart():
    assert close({"a": [1.0, 2]}, {"a": [1.0 + 1e-16, 2]})
    assert not close({"a": [1.0, 2]}, {"a": [1.001, 2]})
    assert not close({"a": [1.0]}, {"b": [1.0]})
    assert not close([1.0, 2.0], [1.0])
