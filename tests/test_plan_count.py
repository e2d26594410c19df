"""
What the dry run says is left is what Snakemake will run: the estimate's count of
per-image computations equals the per-image jobs of Snakemake's own plan (its "Job
stats"), whatever made them planned; a touched or copied finished run plans none; a
per-image file damaged with its date kept is named, set aside and planned.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO, TINY_CONFIG, planned_jobs, run_snakemake

PER_IMAGE_RULES = ("estimate_image", "estimate_image_ceiling")


def header_left(result) -> int:
    """The estimate's "per-image computations left: N"."""
    found = re.findall(r"per-image computations left: (\d+)", result.stderr)
    assert len(found) == 1, result.stderr[-3000:]
    return int(found[0])


def planned_per_image(result) -> int:
    jobs = planned_jobs(result)
    return sum(jobs.get(rule, 0) for rule in PER_IMAGE_RULES)


def dry(workdir, *args, **kwargs):
    result = run_snakemake(workdir, "-n", *args, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    assert header_left(result) == planned_per_image(result), result.stderr[-3000:]
    return result


def test_finished_run_plans_nothing_and_says_so(tiny_copy):
    result = dry(tiny_copy)
    assert header_left(result) == 0
    assert "Nothing to be done" in result.stdout + result.stderr


def test_a_settings_change_is_counted(tiny_copy):
    """top_k is a param of every per-image job: all 8 + 4 are planned again."""
    result = dry(tiny_copy, "--config", "top_k=4")
    assert header_left(result) == 12


@pytest.mark.parametrize("kind", ["first", "ceiling"])
def test_a_missing_file_is_counted(tiny_copy, kind):
    folder = "per_image" if kind == "first" else "per_image_ceiling"
    (tiny_copy / f"runs/{folder}/smallcnn/simple/img0000.pt").unlink()
    result = dry(tiny_copy)
    assert header_left(result) == 1
    if kind == "ceiling":
        assert "0 / 1 second estimates done" not in result.stderr
        assert "3 / 4 second estimates done" in result.stderr


def test_touched_checkpoint_plans_nothing(tiny_copy):
    """A diffusion checkpoint over 1 MB (Snakemake checksums only smaller files)."""
    ckpt = tiny_copy / "runs/diffusion/onoff/complex/final_model.pt"
    assert ckpt.stat().st_size > 1_000_000
    before = ckpt.stat().st_mtime_ns
    os.utime(ckpt)  # touch
    result = dry(tiny_copy)
    assert header_left(result) == 0
    assert ckpt.stat().st_mtime_ns == before
    assert "same content" in result.stderr


def test_copied_checkout_with_new_dates_plans_no_per_image_job(tiny_run, tmp_path):
    """`cp -r` (no -p): every file of the copy has a new date."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(tiny_run), str(copy)], check=True)
    result = dry(copy)
    assert header_left(result) == 0


def test_changed_checkpoint_recomputes_its_configuration(tiny_copy):
    ckpt = tiny_copy / "runs/diffusion/onoff/complex/final_model.pt"
    state = torch.load(ckpt, weights_only=False)
    torch.save(state, ckpt.with_name("tmp.pt"))  # same tensors, other bytes (zip)
    data = bytearray(ckpt.read_bytes())
    data[-100] ^= 1  # inside the zip's directory: other content, same size
    ckpt.write_bytes(bytes(data))
    ckpt.with_name("tmp.pt").unlink()
    result = dry(tiny_copy)
    # its configuration's 2 images and its ceiling image, and nothing else
    assert header_left(result) == 3
    assert "onoff/complex                 0 / 2 images done" in result.stderr


@pytest.mark.parametrize("damage", ["truncated", "other image"])
def test_damaged_file_with_its_date_kept_is_named_and_planned(tiny_copy, damage):
    f = tiny_copy / "runs/per_image/onoff/simple/img0001.pt"
    st = f.stat()
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[: st.st_size // 2])
    else:
        d = torch.load(f, weights_only=False)
        d["img_idx"] = 0
        torch.save(d, f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the date kept
    result = dry(tiny_copy)
    assert header_left(result) == 1
    assert "per-image file runs/per_image/onoff/simple/img0001.pt" in result.stderr
    assert f.with_name(f.name + ".bad").exists() and not f.exists()


def test_incomplete_metadata_is_counted(tiny_copy):
    """
    A file Snakemake marked incomplete (its job was killed with Snakemake, then the
    orphaned job wrote it) is planned again. The marker as Snakemake's file
    persistence writes it (snakemake/persistence/file.py: `_record_path`, a urlsafe
    base64 name under .snakemake/incomplete).
    """
    from base64 import urlsafe_b64encode

    name = "runs/per_image/smallcnn/complex/img0001.pt"
    marker_dir = tiny_copy / ".snakemake" / "incomplete"
    marker_dir.mkdir(parents=True, exist_ok=True)
    (marker_dir / urlsafe_b64encode(name.encode()).decode()).write_text(
        '{"external_jobid": null}'
    )
    result = dry(tiny_copy, "--rerun-incomplete")
    assert header_left(result) == 1


def test_an_update_of_the_workflows_commands_recomputes_nothing(tiny_copy):
    """
    A run finished by an older version of the workflow whose per-image command
    differed (Snakemake records a job's shell command as its `code`:
    snakemake/persistence/__init__.py, `_code`): a plain `snakemake -n`, no
    --profile, plans no per-image job, since the workflow's own profile
    (profiles/default) leaves `code` out of the rerun triggers. Without that profile
    Snakemake would compute every per-image file again.
    """
    import json

    changed = 0
    for record in (tiny_copy / ".snakemake" / "metadata").iterdir():
        data = json.loads(record.read_text())
        if data.get("rule") in PER_IMAGE_RULES:
            data["code"] = "multigeom-workflow-estimate --an-older-command"
            record.write_text(json.dumps(data))
            changed += 1
    assert changed == 12  # tiny.yaml: 4 configurations x 2 images, 4 ceiling images
    result = dry(tiny_copy)
    assert "workflow specific profile" in result.stdout + result.stderr
    assert header_left(result) == 0
    without = dry(tiny_copy, "--workflow-profile", "none")
    assert header_left(without) == 12
    assert "Code has changed since last execution" in without.stdout + without.stderr


def test_progress_counts_what_snakemake_plans(tiny_copy):
    (tiny_copy / "runs/per_image/onoff/simple/img0000.pt").unlink()
    cmd = [sys.executable, "-m", "multigeom_workflow.cli", "progress"]
    cmd += ["--configfile", str(TINY_CONFIG), "--workflow-dir", str(REPO)]
    result = subprocess.run(
        [*cmd, "--config", "top_k=5"], cwd=tiny_copy, capture_output=True, text=True
    )
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    assert "onoff/simple                  1 / 2" in lines
    assert "noise ceiling                 4 / 4" in lines
    assert lines[-1] == "all                          11 / 12"
    changed = subprocess.run(
        [*cmd, "--config", "top_k=4"], cwd=tiny_copy, capture_output=True, text=True
    )
    assert changed.stdout.splitlines()[-1] == "all                           0 / 12"
    shutil.rmtree(tiny_copy / ".snakemake", ignore_errors=True)


def test_another_image_source_is_counted(tiny_copy, tmp_path):
    """The demo's photos, copied into a folder: other input files for every job."""
    import yaml

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        shutil.copy(tiny_copy / f"runs/demo/test_images/img{i:04d}.png", folder)
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["test_images"] = {"source": "folder", "path": str(folder)}
    configfile = tmp_path / "folder.yaml"
    configfile.write_text(yaml.safe_dump(config))
    result = dry(tiny_copy, configfile=configfile)
    # Snakemake's "input" trigger: every per-image job has another image file
    assert header_left(result) == 12
