"""
What the dry run says is left is what Snakemake will run: the estimate's count of
per-image computations equals the per-image jobs of Snakemake's own plan (its "Job
stats"), whatever made them planned; a touched or copied finished run plans none; a
per-image file damaged with its date kept is named and planned. A dry run changes no
file (it says what the real run would do), and what it counts is what the real run
then computes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    CONFIGURATIONS,
    REPO,
    TINY_CONFIG,
    planned_jobs,
    python_path,
    run_snakemake,
)

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


def test_finished_run_plans_nothing_and_says_so(finished_dry_run):
    result = finished_dry_run
    assert header_left(result) == 0 == planned_per_image(result)
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
    """A diffusion checkpoint over 1 MB (Snakemake checksums only smaller files): the
    dry run keeps its new date and plans as if the recorded one were back; the real
    run gives it back."""
    ckpt = tiny_copy / "runs/diffusion/onoff/complex/final_model.pt"
    assert ckpt.stat().st_size > 1_000_000
    before = ckpt.stat().st_mtime_ns
    os.utime(ckpt)  # touch
    touched = ckpt.stat().st_mtime_ns
    assert touched > before
    result = dry(tiny_copy)
    assert header_left(result) == 0
    assert ckpt.stat().st_mtime_ns == touched  # a dry run changes nothing
    assert "would keep the recorded date of 1 input file(s)" in result.stderr
    real = run_snakemake(tiny_copy)
    assert real.returncode == 0, real.stderr[-3000:]
    assert planned_per_image(real) == 0
    assert ckpt.stat().st_mtime_ns == before


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
    damaged = f.read_bytes()
    result = dry(tiny_copy)
    assert header_left(result) == 1
    assert "per-image file runs/per_image/onoff/simple/img0001.pt" in result.stderr
    assert "would be set aside as img0001.pt.bad" in result.stderr
    # named, not moved: the dry run changes nothing
    assert f.read_bytes() == damaged and not f.with_name(f.name + ".bad").exists()
    assert f.stat().st_mtime_ns == st.st_mtime_ns


def tree(root: Path) -> dict[str, tuple]:
    """Every file and folder under `root` but Snakemake's own IO cache, lock folder
    and logs (a dry run writes the first two: snakemake/dag.py, `save_iocache`; a
    command such as --summary its log): its name -> (size, modification time in ns,
    bytes) (folders: (0, time, b""))."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith((".snakemake/iocache", ".snakemake/locks", ".snakemake/log")):
            continue
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            out[rel] = (st.st_size, st.st_mtime_ns, path.read_bytes())
        elif rel != ".snakemake":  # its date moves with the cache's folder
            out[rel] = (0, st.st_mtime_ns, b"")
    return out


def test_a_dry_run_changes_nothing_and_counts_what_the_real_run_computes(tiny_copy):
    """
    On a finished demo: a touched checkpoint (its content unchanged), a per-image file
    damaged with its date kept, a deleted noise-ceiling file. The dry run leaves every
    file's bytes, name and date as they were, says what the real run would do, and
    counts what the real run then computes: the damaged image and the ceiling image.
    """
    os.utime(tiny_copy / "runs/diffusion/onoff/complex/final_model.pt")
    f = tiny_copy / "runs/per_image/smallcnn/complex/img0000.pt"
    st = f.stat()
    f.write_bytes(f.read_bytes()[:1000])
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    (tiny_copy / "runs/per_image_ceiling/onoff/simple/img0000.pt").unlink()
    before = tree(tiny_copy)
    result = dry(tiny_copy)
    assert tree(tiny_copy) == before
    assert header_left(result) == 2
    assert "would keep the recorded date of 1 input file(s)" in result.stderr
    assert "would be set aside" in result.stderr
    real = run_snakemake(tiny_copy)
    assert real.returncode == 0, real.stderr[-3000:]
    assert planned_per_image(real) == 2
    assert planned_jobs(real)["estimate_image"] == 1
    assert f.with_name(f.name + ".bad").exists()
    assert (tiny_copy / "runs/per_image_ceiling/onoff/simple/img0000.pt").exists()


def test_files_kept_by_an_ended_allocation_are_counted_as_there(tiny_copy):
    """
    A per-image file that a SLURM allocation finished before it ended early, removed
    by Snakemake with its shard and kept in the allocation's folder: the dry run says
    it would put it back and plans nothing for it, changing nothing; the real run puts
    it back and computes nothing. (No SLURM answers for the job id: its state is
    unknown, so its file comes back and its folder stays: compute/kept.py.)
    """
    f = tiny_copy / "runs/per_image/onoff/simple/img0001.pt"
    kept = f.parent / ".kept-slurm-987654" / f.name
    kept.parent.mkdir()
    f.replace(kept)
    before = tree(tiny_copy)
    result = dry(tiny_copy)
    assert "would put back 1 per-image file(s)" in result.stderr
    assert "987654 UNKNOWN" in result.stderr
    assert header_left(result) == 0
    assert tree(tiny_copy) == before
    real = run_snakemake(tiny_copy)
    assert real.returncode == 0, real.stderr[-3000:]
    assert planned_per_image(real) == 0
    assert f.read_bytes() == kept.read_bytes()


def test_a_kept_file_newer_than_the_check_is_read_where_it_is_kept(tiny_copy):
    """A kept per-image file newer than the outputs that read it (the check's list):
    Snakemake compares its checksum (1 MB or less), which the dry run reads from the
    kept copy, as the real run reads the file it puts back; both plan the same."""
    f = tiny_copy / "runs/per_image/onoff/simple/img0001.pt"
    assert f.stat().st_size <= 1_000_000
    kept = f.parent / ".kept-slurm-987655" / f.name
    kept.parent.mkdir()
    f.replace(kept)
    os.utime(kept)  # newer than runs/metrics/per_image_checked.tsv
    before = tree(tiny_copy)
    result = dry(tiny_copy)
    assert tree(tiny_copy) == before
    assert header_left(result) == 0
    planned = planned_jobs(result)
    real = run_snakemake(tiny_copy)
    assert real.returncode == 0, real.stderr[-3000:]
    assert planned_jobs(real) == planned


REFUSE_UTIME = """
import os

_utime = os.utime


def utime(path, *args, **kwargs):  # a file of another user: EPERM (utimensat(2))
    if str(path).endswith("final_model.pt"):
        raise PermissionError(1, "Operation not permitted", str(path))
    return _utime(path, *args, **kwargs)


os.utime = utime
"""


def test_a_date_the_user_may_not_set_is_said_and_the_run_goes_on(tiny_copy, tmp_path):
    """
    A touched checkpoint the user may not change (another user's, on a shared
    folder): ``os.utime`` is refused (a sitecustomize gives it EPERM, as utimensat(2)
    does for a file of another user). The real run says so in one line, plans as if
    the recorded date were back (nothing recomputed) and ends well.
    """
    ckpt = tiny_copy / "runs/diffusion/onoff/complex/final_model.pt"
    os.utime(ckpt)
    touched = ckpt.stat().st_mtime_ns
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REFUSE_UTIME)
    env = {"PYTHONPATH": python_path(site)}
    real = run_snakemake(tiny_copy, env=env)
    assert real.returncode == 0, real.stderr[-3000:]
    lines = [x for x in real.stderr.splitlines() if "could not set the recorded" in x]
    assert len(lines) == 1 and "PermissionError: Operation not permitted" in lines[0]
    assert "have a new date but the same content" not in real.stderr  # not restored
    assert planned_per_image(real) == 0
    assert ckpt.stat().st_mtime_ns == touched
    # the registry keeps the recorded date: every later run plans the same
    again = dry(tiny_copy)
    assert header_left(again) == 0
    assert "would keep the recorded date of 1 input file(s)" in again.stderr
    second = run_snakemake(tiny_copy, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert planned_per_image(second) == 0


def test_a_checkpoint_behind_a_new_symbolic_link_plans_nothing(tiny_copy, tmp_path):
    """A checkpoint replaced by a new symbolic link to the same bytes elsewhere (a
    shared folder of models): Snakemake reads the later of the link's own date and
    its target's (snakemake/io `_IOFile.is_newer`). The dry run changes nothing and
    counts 0; the real run gives both their recorded date and computes nothing."""
    ckpt = tiny_copy / "runs/diffusion/onoff/complex/final_model.pt"
    recorded = ckpt.stat().st_mtime_ns
    shared = tmp_path / "shared" / "final_model.pt"
    shared.parent.mkdir()
    shutil.copyfile(ckpt, shared)  # new date, same bytes
    ckpt.unlink()
    ckpt.symlink_to(shared)
    before = tree(tiny_copy)
    result = dry(tiny_copy)
    assert tree(tiny_copy) == before
    assert header_left(result) == 0
    real = run_snakemake(tiny_copy)
    assert real.returncode == 0, real.stderr[-3000:]
    assert planned_per_image(real) == 0
    assert os.lstat(ckpt).st_mtime_ns == recorded == shared.stat().st_mtime_ns


def test_a_command_that_runs_no_job_changes_nothing(tiny_copy):
    """``--summary`` (and Snakemake's other commands that run no job) leave the tree
    as a dry run does: the damaged file named, not moved."""
    f = tiny_copy / "runs/per_image/onoff/simple/img0001.pt"
    st = f.stat()
    f.write_bytes(f.read_bytes()[:1000])
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.utime(tiny_copy / "runs/diffusion/onoff/complex/final_model.pt")
    before = tree(tiny_copy)
    result = run_snakemake(tiny_copy, "--summary")
    assert result.returncode == 0, result.stderr[-3000:]
    assert tree(tiny_copy) == before
    assert "would be set aside as img0001.pt.bad" in result.stderr


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


def test_diffusion_models_of_their_own_seeds_are_trained_again(tiny_copy, tmp_path):
    """
    demo.diffusion_seeds: per_configuration gives each configuration's diffusion model
    its own train.seed (a param of train_demo_diffusion): the 4 models are trained
    again and every per-image job (8 + 4) recomputed; the default written out
    (shared) changes nothing.
    """
    import yaml

    from multigeom_workflow.settings.seeds import configuration_diffusion

    config = yaml.safe_load(TINY_CONFIG.read_text())
    for mode, models, left in (("shared", 0, 0), ("per_configuration", 4, 12)):
        config["demo"]["diffusion_seeds"] = mode
        configfile = tmp_path / f"{mode}.yaml"
        configfile.write_text(yaml.safe_dump(config))
        result = dry(tiny_copy, configfile=configfile)
        assert planned_jobs(result).get("train_demo_diffusion", 0) == models, mode
        assert header_left(result) == left, mode
    diffusion = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
    seeds = {
        configuration_diffusion(diffusion, e, a, "per_configuration")["train"]["seed"]
        for e, a in CONFIGURATIONS
    }
    assert len(seeds) == 4 and diffusion["train"]["seed"] not in seeds
    # by hand: train.seed + 2**16 * (1 + H), H = SHA-256("seed/encoder/area") % 65535
    import hashlib

    seed = int(diffusion["train"]["seed"])
    h = int(hashlib.sha256(f"{seed}/onoff/complex".encode()).hexdigest(), 16) % 65535
    ours = configuration_diffusion(diffusion, "onoff", "complex", "per_configuration")
    assert ours["train"]["seed"] == seed + 65536 * (1 + h)
    assert {k: v for k, v in ours["train"].items() if k != "seed"} == {
        k: v for k, v in diffusion["train"].items() if k != "seed"
    }


def normalized(output: str) -> list[str]:
    """
    A dry run's output as two runs can be compared: Snakemake's dates and workflow id
    left out, its job blocks (``rule x:`` and their indented lines) sorted, and the
    file lists of its reasons sorted (Snakemake lists jobs and files in an order that
    follows string hashes: "The order of jobs does not reflect the order of
    execution"); every other line, the workflow's included, in its order.
    """
    lines, blocks, block = [], [], None
    for line in output.splitlines():
        if re.fullmatch(r"\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\]", line):
            continue
        if line.startswith(("  Date: ", "  Workflow ID: ")):
            continue
        if re.match(r"(local)?rule \w+:$", line):
            block = [line]
            blocks.append(block)
            if "<jobs>" not in lines:
                lines.append("<jobs>")
            continue
        if block is not None and line.startswith("    "):
            if line.startswith("    reason: "):
                clauses = []
                for clause in line[len("    reason: ") :].split("; "):
                    what, _, files = clause.rpartition(": ")
                    clauses.append(what + ": " + ", ".join(sorted(files.split(", "))))
                line = "    reason: " + "; ".join(clauses)
            block.append(line)
            continue
        block = None
        lines.append(line)
    return lines + sorted("\n".join(b) for b in blocks)


@pytest.mark.parametrize("profile", [None, "slurm"])
def test_the_dry_run_says_the_same_with_the_speed_patches_off(tiny_copy, profile):
    """``MULTIGEOM_SPEED_PATCHES=off`` (snakemake_adapter: Snakemake as it
    comes) changes nothing a dry run says: its plan, its job statistics and the
    workflow's estimate are the same, line for line (job blocks in Snakemake's
    hash-dependent order sorted)."""
    (tiny_copy / "runs/per_image/onoff/simple/img0001.pt").unlink()
    args = [] if profile is None else ["--profile", str(REPO / "profiles" / profile)]
    said = {}
    for switch in ("on", "off"):
        result = run_snakemake(
            tiny_copy, "-n", *args, env={"MULTIGEOM_SPEED_PATCHES": switch}
        )
        assert result.returncode == 0, result.stderr[-3000:]
        said[switch] = normalized(result.stdout + result.stderr)
    assert said["on"] == said["off"]
    assert any("per-image computations left: 1" in line for line in said["on"])
