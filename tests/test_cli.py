"""
`multigeom-workflow progress` and `clear`: counts, the chosen files only, locks; its
help, a command per line.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest
from conftest import REPO, TINY_CONFIG, modal_cli


def cli(workdir, *args):
    cmd = [sys.executable, "-m", "multigeom_workflow.cli", *args]
    cmd += ["--configfile", str(TINY_CONFIG), "--workflow-dir", str(REPO)]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)


def snapshot(workdir):
    """Every file under the working directory (but Snakemake's own) and its digest."""
    return {
        p.relative_to(workdir): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in workdir.rglob("*")
        if p.is_file() and ".snakemake" not in p.parts
    }


def test_progress_counts_per_configuration(tiny_copy):
    (tiny_copy / "runs/per_image/smallcnn/simple/img0000.pt").unlink()
    result = cli(tiny_copy, "progress")
    assert result.returncode == 3  # not complete
    assert result.stdout.splitlines() == [
        "onoff/complex                 2 / 2",
        "smallcnn/complex              2 / 2",
        "onoff/simple                  2 / 2",
        "smallcnn/simple               1 / 2",
        "noise ceiling                 4 / 4",
        "all                          11 / 12",
    ]
    more = cli(tiny_copy, "progress", "--config", "n_images=5")
    assert more.stdout.splitlines()[-1] == "all                          11 / 24"


def test_clear_deletes_exactly_the_chosen_files(tiny_copy):
    before = snapshot(tiny_copy)
    listed = cli(
        tiny_copy, "clear", "--configs", "onoff/simple", "--n-images", "1", "--list"
    )
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == [
        "runs/per_image/onoff/simple/img0000.pt",
        "runs/per_image_ceiling/onoff/simple/img0000.pt",  # its second estimate
    ]
    assert snapshot(tiny_copy) == before  # listing deletes nothing

    result = cli(
        tiny_copy,
        "clear",
        "--configs",
        "onoff/simple",
        "smallcnn/complex",
        "--n-images",
        "1",
    )
    assert result.returncode == 0, result.stderr
    gone = {
        p
        for p in before
        if str(p)
        in (
            "runs/per_image/onoff/simple/img0000.pt",
            "runs/per_image/smallcnn/complex/img0000.pt",
            "runs/per_image_ceiling/onoff/simple/img0000.pt",
            "runs/per_image_ceiling/smallcnn/complex/img0000.pt",
        )
    }
    assert len(gone) == 4
    after = snapshot(tiny_copy)
    assert set(before) - set(after) == gone
    assert all(after[p] == before[p] for p in after)  # the rest untouched


def test_clear_refuses_while_snakemake_holds_the_lock(tiny_copy):
    locks = tiny_copy / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.input.lock").write_text("runs/demo/train_crops.pt\n")
    before = snapshot(tiny_copy)
    result = cli(tiny_copy, "clear")
    assert result.returncode == 1
    assert "a Snakemake run holds the lock" in result.stderr
    assert snapshot(tiny_copy) == before


def test_unknown_configuration_is_named(tiny_copy):
    result = cli(tiny_copy, "clear", "--configs", "onoff/V9")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "config error: --configs 'onoff/V9': not a configuration of this run; allowed: "
        "onoff/complex, smallcnn/complex, onoff/simple, smallcnn/simple"
    )


def test_progress_and_clear_on_the_modal_volume(tiny_copy, tmp_path, modal_server):
    """On the local Modal server: a volume whose files a user put there with Modal's
    own command line, read and cleared through the installed client."""
    import shutil

    mirror = tmp_path / "upload"  # what goes to --modal-volume-prefix myrun
    for f in ["onoff/complex/img0000.pt", "onoff/complex/img0001.pt"]:
        dest = mirror / "runs" / "per_image" / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_copy / "runs" / "per_image" / f, dest)
    # the plugin's record of the job that made img0000 (reused by a rerun)
    marker = mirror / ".snakemake/modal/done/runs/per_image/onoff/complex"
    marker.mkdir(parents=True)
    (marker / "img0000.pt@0123abcd").write_text("0123abcd")
    modal_cli("volume", "create", "vol")
    modal_cli("volume", "put", "vol", str(mirror), "/myrun")
    committed = modal_server.state.volume("vol").folder / "myrun"
    opts = ["--modal-volume", "vol", "--modal-volume-prefix", "myrun"]

    def run(*args):
        cmd = [sys.executable, "-m", "multigeom_workflow.cli", *args, *opts]
        cmd += ["--configfile", str(TINY_CONFIG), "--workflow-dir", str(REPO)]
        return subprocess.run(cmd, cwd=tiny_copy, capture_output=True, text=True)

    result = run("progress")
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "on Modal volume 'vol', folder 'myrun':"
    assert lines[2] == "onoff/complex                 2 / 2"
    assert lines[-1] == "all                           2 / 8"

    listed = run("clear", "--configs", "onoff/complex", "--n-images", "1", "--list")
    assert "vol:myrun/runs/per_image/onoff/complex/img0000.pt" in listed.stdout
    assert (committed / "runs/per_image/onoff/complex/img0000.pt").exists()

    cleared = run("clear", "--configs", "onoff/complex", "--n-images", "1")
    assert cleared.returncode == 0, cleared.stderr
    assert not (committed / "runs/per_image/onoff/complex/img0000.pt").exists()
    assert (committed / "runs/per_image/onoff/complex/img0001.pt").exists()
    # never reused again: the job's marker is gone too
    done = committed / ".snakemake/modal/done/runs/per_image/onoff/complex"
    assert not (done / "img0000.pt@0123abcd").exists()
    assert "deleted 1 per-image file(s) on Modal volume 'vol'" in cleared.stderr


def test_help_lists_each_command_on_its_own_line(capsys):
    """
    `multigeom-workflow --help` shows the module's list of commands as written, one
    per line (not run into a paragraph), and lists every command the parser has.
    """
    from multigeom_workflow import cli as module

    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = re.findall(r"^    multigeom-workflow ([a-z-]+) {2,}\S", text, re.M)
    choices = re.search(r"\{([a-z,-]+)\}", text).group(1).split(",")
    assert listed == choices, text
