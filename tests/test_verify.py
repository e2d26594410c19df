"""
A per-image file that is not what it should be (cut short, empty, a key missing or
None, another configuration's or image's, other settings) is named before Stage 5 uses
it, set aside so that the next run recomputes it, never counted as done, and Stage 5
never averages over fewer images than n_images nor loses its previous metrics.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG, run_snakemake
from test_alignment import write_per_image

from multigeom_workflow.results.alignment import align_configs
from multigeom_workflow.results.verify import Expected, check_per_image_file
from multigeom_workflow.scenario import validated_scenario

F = "runs/per_image/{}/{}/img{:04d}.pt"


def edit(path, **changes):
    d = torch.load(path, weights_only=False)
    for key, value in changes.items():
        if value is KeyError:
            del d[key]
        else:
            d[key] = value
    torch.save(d, path)


def damage(workdir, kind):
    """Damage runs/per_image/smallcnn/simple/img0001.pt in one way."""
    f = workdir / F.format("smallcnn", "simple", 1)
    if kind == "half bytes":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif kind == "empty":
        f.write_bytes(b"")
    elif kind == "no J_eigenvectors":
        edit(f, J_eigenvectors=KeyError)
    elif kind == "J_eigenvectors None":
        edit(f, J_eigenvectors=None)
    elif kind == "NaN in G":
        d = torch.load(f, weights_only=False)
        d["G_eigenvectors"][0, 0] = float("nan")
        torch.save(d, f)
    elif kind == "top_k 4":
        d = torch.load(f, weights_only=False)
        edit(
            f,
            G_eigenvalues=d["G_eigenvalues"][:4],
            G_eigenvectors=d["G_eigenvectors"][:4],
        )
    elif kind == "another configuration's":
        shutil.copyfile(workdir / F.format("onoff", "simple", 1), f)
    elif kind == "another image's":
        shutil.copyfile(workdir / F.format("smallcnn", "simple", 0), f)
        edit(f, img_idx=1)  # even with its index rewritten, its image is image 0's
    elif kind == "another seed":
        d = torch.load(f, weights_only=False)
        edit(f, provenance={**d["provenance"], "seed": 7})
    elif kind == "other estimator settings":
        d = torch.load(f, weights_only=False)
        configs = dict(d["provenance"]["configs"])
        text = configs["estimator"]["text"].replace("n_samples: 4", "n_samples: 16")
        assert text != configs["estimator"]["text"]
        configs["estimator"] = {**configs["estimator"], "text": text}
        edit(f, provenance={**d["provenance"], "configs": configs})
    return f


DAMAGE = {
    "half bytes": "does not load",
    "empty": "is empty (0 bytes)",
    "no J_eigenvectors": "has no J_eigenvectors",
    "J_eigenvectors None": "J_eigenvectors is None",
    "NaN in G": "G_eigenvectors holds NaN",
    "top_k 4": "G_eigenvalues has shape (4,), expected (5,)",
    "another configuration's": "belongs to onoff/simple image 1, not smallcnn/simple",
    "another image's": "was made from another image than",
    "another seed": "was made with seed 7, the run's is 42",
    "other estimator settings": "was made with other estimator settings",
}


def tiny_scenario(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    return validated_scenario(yaml.safe_load(TINY_CONFIG.read_text()), REPO)


@pytest.mark.parametrize("kind", DAMAGE)
def test_each_kind_of_bad_file_is_named(tiny_copy, monkeypatch, kind):
    s = tiny_scenario(tiny_copy, monkeypatch)
    expected = Expected.of_scenario(s)
    good = check_per_image_file(
        F.format("smallcnn", "simple", 1),
        encoder="smallcnn",
        area="simple",
        index=1,
        expected=expected,
        image_file=s.test_image_files[1],
    )
    assert good is None
    f = damage(tiny_copy, kind)
    problem = check_per_image_file(
        f,
        encoder="smallcnn",
        area="simple",
        index=1,
        expected=expected,
        image_file=s.test_image_files[1],
    )
    assert problem is not None and DAMAGE[kind] in problem


def test_engine_and_precision_are_not_other_settings(tiny_copy, monkeypatch):
    s = tiny_scenario(tiny_copy, monkeypatch)
    f = tiny_copy / F.format("onoff", "complex", 0)
    d = torch.load(f, weights_only=False)
    configs = dict(d["provenance"]["configs"])
    text = configs["estimator"]["text"] + "\nengine: fast\nprecision: bf16\n"
    configs["estimator"] = {**configs["estimator"], "text": text}
    edit(f, provenance={**d["provenance"], "configs": configs, "engine": "fast"})
    edit(f, engine="fast", precision="bf16")
    problem = check_per_image_file(
        f,
        encoder="onoff",
        area="complex",
        index=0,
        expected=Expected.of_scenario(s),
        image_file=s.test_image_files[0],
    )
    assert problem is None


def cli(workdir, *args):
    cmd = [sys.executable, "-m", "multigeom_workflow.cli", *args]
    cmd += ["--configfile", str(TINY_CONFIG), "--workflow-dir", str(REPO)]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)


def test_progress_counts_good_files_and_verify_lists_bad_ones(tiny_copy):
    damage(tiny_copy, "J_eigenvectors None")
    (tiny_copy / F.format("onoff", "complex", 0)).write_bytes(b"")
    progress = cli(tiny_copy, "progress")
    assert progress.returncode == 3
    assert progress.stdout.splitlines()[0] == "onoff/complex                 1 / 2"
    assert progress.stdout.splitlines()[-2] == "noise ceiling                 4 / 4"
    assert progress.stdout.splitlines()[-1] == "all                          10 / 12"
    assert "2 per-image file(s) are bad" in progress.stderr
    verify = cli(tiny_copy, "verify")
    assert verify.returncode == 1
    assert verify.stdout.splitlines() == [
        f"{F.format('onoff', 'complex', 0)}: is empty (0 bytes)",
        f"{F.format('smallcnn', 'simple', 1)}: J_eigenvectors is None",
    ]
    aside = cli(tiny_copy, "verify", "--set-aside")
    assert aside.returncode == 1
    assert (tiny_copy / (F.format("onoff", "complex", 0) + ".bad")).exists()
    assert not (tiny_copy / F.format("onoff", "complex", 0)).exists()
    again = cli(tiny_copy, "verify")
    assert again.returncode == 0, again.stdout
    assert again.stderr.strip() == (
        "0 bad of 10 per-image file(s) (noise ceiling's included)"
    )


def test_bad_file_stops_before_stage5_keeps_metrics_and_is_recomputed(tiny_copy):
    metrics = tiny_copy / "runs/metrics/cross_encoder_metrics.json"
    before = metrics.read_bytes()
    f = damage(tiny_copy, "J_eigenvectors None")
    first = run_snakemake(tiny_copy)
    assert first.returncode != 0
    assert "verify_per_image_files" in first.stderr
    assert "1 per-image file(s) are bad and were set aside" in first.stderr
    assert str(f.relative_to(tiny_copy)) in first.stderr
    assert metrics.read_bytes() == before  # Stage 5 never started
    assert not f.exists() and f.with_name(f.name + ".bad").exists()
    second = run_snakemake(tiny_copy)
    assert second.returncode == 0, second.stderr[-3000:]
    d = torch.load(f, weights_only=False)
    assert d["J_eigenvectors"].shape == (5, 4096)
    pairs = json.loads(metrics.read_text())["pairs"].values()
    assert {p["n_images"] for p in pairs} == {2}


@pytest.mark.process
def test_stage5_refuses_fewer_images_than_n_images(tmp_path):
    root = tmp_path / "runs"
    files = [
        write_per_image(root, enc, "V1", "reference", i)
        for enc in ("inception", "resnet50")
        for i in range(2)
    ]
    edit(files[-1], J_eigenvectors=None)
    out = tmp_path / "m.json"
    # Upstream leaves the image out of the J pair:
    assert align_configs(files, out, max_k=4)["pairs"]
    out.unlink()
    with pytest.raises(ValueError, match="averages over 1 images, not n_images = 2"):
        align_configs(files, out, max_k=4, n_images=2)
    assert not out.exists()
