"""
A volume that stays small and fast (issue 47): a status round lists the run's folder
on the volume once, whatever the jobs it ends (`staging.Listing`); a finished job's
files leave the volume once home and verified (`VolumeStager.prune`). On the local
Modal server, with the installed modal client: the server records every
``VolumeListFiles`` it serves (modal 1.6.4, ``_Volume.iterdir``, modal/volume.py).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from snakemake_executor_plugin_modal.container import DONE
from snakemake_executor_plugin_modal.staging import (
    MANIFEST,
    VolumeStager,
    default_prefix,
)

from .helpers import run_snakemake, spawned

#: Files already in the run's folder on the volume (an earlier run's): every
#: listing of the folder returns them all.
OLD_ENTRIES = 1_000
KEY = "k" * 64


def listings(server, path: str | None = None) -> list:
    """The recursive ``VolumeListFiles`` the server served (of `path` only, if
    given), as the client sent them (``VolumeListFilesRequest``)."""
    found = []
    for call in server.state.calls_of("VolumeListFiles"):
        req = call.requests[0]
        if req.recursive and (path is None or req.path.strip("/") == path):
            found.append(req)
    return found


def _volume(server, name: str = "tests"):
    """The named volume (created), and its folder on the server's disk."""
    import modal

    volume = modal.Volume.from_name(name, create_if_missing=True)
    volume.hydrate()
    return volume, server.state.volume(name).folder


def _old_entries(folder) -> None:
    """`OLD_ENTRIES` files of an earlier run in `folder` (on the server's disk)."""
    for i in range(OLD_ENTRIES):
        f = folder / "old" / f"d{i % 10}" / f"img{i:05d}.pt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"o")


@pytest.mark.timeout(120)
def test_a_round_lists_once_and_prunes_only_what_came_home_verified(
    modal_server, tmp_path
):
    """Two jobs' downloads in one round read one listing of the folder; pruning
    deletes the files that came home whole and unchanged, with their reuse markers,
    and nothing else: another output's marker, a file changed here since, an
    earlier run's files stay; the manifest forgets what left (sent again when a
    job needs it)."""
    work, src = tmp_path / "work", tmp_path / "src"
    volume, folder = _volume(modal_server)
    _old_entries(folder / "proj")
    made = {"out/a.pt": "a", "out/b.pt": "bb", "logs/a.log": "log"}
    made[f"{DONE}/out/a.pt@{KEY}"] = KEY
    made[f"{DONE}/out/b.pt@{KEY}"] = KEY
    made[f"{DONE}/out/a.pt0@{KEY}"] = KEY  # another output's marker
    for rel, text in made.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    with volume.batch_upload(force=True) as batch:
        for rel in made:
            batch.put_file(str(src / rel), f"/proj/{rel}")
    stager = VolumeStager(volume, "proj", work)
    listing = stager.listing(shared=True)
    before = len(listings(modal_server))
    home = stager.download(["out/a.pt", "logs/a.log"], listing=listing)
    home += stager.download(
        ["out/b.pt", "logs/b.log"], missing_ok=True, listing=listing
    )
    assert home == ["logs/a.log", "out/a.pt", "out/b.pt"]  # each call: sorted
    assert len(listings(modal_server)) - before == 1  # one listing for both jobs
    (work / "out" / "b.pt").write_text("changed here")  # not what came home
    assert stager.prune([*home, "out/never.pt"], listing) == ["logs/a.log", "out/a.pt"]
    assert len(listings(modal_server)) - before == 1  # the markers: the same listing
    root = folder / "proj"
    assert not (root / "out" / "a.pt").exists()
    assert not (root / "logs" / "a.log").exists()
    assert not (root / DONE / "out" / f"a.pt@{KEY}").exists()
    assert (root / DONE / "out" / f"a.pt0@{KEY}").read_text() == KEY
    assert (root / "out" / "b.pt").read_text() == "bb"
    assert (root / DONE / "out" / f"b.pt@{KEY}").read_text() == KEY
    assert len(list((root / "old").rglob("*.pt"))) == OLD_ENTRIES
    # home, whole
    assert (work / "out" / "a.pt").read_text() == "a"
    assert (work / "logs" / "a.log").read_text() == "log"
    # the manifest on the volume forgets them: a new run sends them again
    assert VolumeStager(volume, "proj", work).upload(["out/a.pt"]) == ["out/a.pt"]
    assert (root / MANIFEST).exists()


#: N jobs that wait for the test's signal (a file): they end together, in one or
#: two status rounds, each writing an output and a log.
GATED = """
rule all:
    input: expand("out/{i}.txt", i=range(int(config["jobs"])))

rule make:
    output: "out/{i}.txt"
    log: "logs/{i}.log"
    shell:
        "while [ ! -e @GO@ ]; do sleep 0.2; done; "
        "echo {wildcards.i} > {output}; echo made > {log}"
"""


@pytest.mark.timeout(420)
@pytest.mark.parametrize("jobs", [2, 6])
def test_listings_per_round_do_not_grow_with_jobs_or_entries(
    modal_server, tmp_path, jobs
):
    """
    A run of 2 or of 6 jobs ending together, in a folder that already holds
    `OLD_ENTRIES` files: the folder is listed at most twice (once per status round
    that ends jobs: they end within a second, and Snakemake's rounds are 2 s apart
    here), where it was listed twice per job before; every job's output, log and
    container log came home and left the volume, the earlier files stay.
    """
    work, go = tmp_path / "wf", tmp_path / "go"
    prefix = default_prefix(work)
    _, folder = _volume(modal_server)
    _old_entries(folder / prefix)
    proc = run_snakemake(
        work,
        GATED.replace("@GO@", str(go)),
        "--jobs",
        str(jobs),
        "--config",
        f"jobs={jobs}",
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )
    deadline = time.monotonic() + 240
    while len(modal_server.state.containers) < jobs and proc.poll() is None:
        assert time.monotonic() < deadline, "the containers did not start"
        time.sleep(0.2)
    go.touch()
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out[-3000:]
    assert len(spawned(modal_server)) == jobs
    assert 1 <= len(listings(modal_server, prefix)) <= 2, out[-3000:]
    for i in range(jobs):
        assert (work / "out" / f"{i}.txt").read_text() == f"{i}\n"
        assert (work / "logs" / f"{i}.log").read_text() == "made\n"
    root = modal_server.state.volume("tests").folder / prefix
    left = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert not {f for f in left if f.startswith(("out/", "logs/", DONE))}
    assert not {
        f for f in left if f.startswith(".snakemake/modal/") and f.endswith(".log")
    }
    assert len([f for f in left if f.startswith("old/")]) == OLD_ENTRIES
    assert list((work / ".snakemake" / "modal").glob("*.log"))  # container logs home


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("entries", "said"),
    [(50_000, None), (50_001, "warn"), (499_999, "warn"), (500_000, "refuse")],
)
def test_the_dry_run_warns_past_50000_entries_and_refuses_from_500000(entries, said):
    """`volume_entries_problem`: Modal's guide's two numbers, each line naming the
    count, the limit and the page."""
    from snakemake_executor_plugin_modal.volume_limits import volume_entries_problem

    problem = volume_entries_problem(entries)
    if said is None:
        assert problem is None
        return
    kind, line = problem
    assert kind == said
    assert f"{entries:,} entries" in line
    assert ("500,000 inodes" if said == "refuse" else "50,000 files") in line
    assert "https://modal.com/docs/guide/volumes" in line


@pytest.mark.timeout(10)
def test_entries_count_files_and_the_folders_above_them():
    """`entries_of`: 40,000 per-image files in 4 folders of 2 levels, each with its
    reuse marker: 80,000 files and 2 x (1 + 2 + 4) folders plus the root."""
    from snakemake_executor_plugin_modal.volume_limits import entries_of

    outputs = [f"runs/e{i % 2}/a{i % 4}/img{i:05d}.pt" for i in range(40_000)]
    markers = [f"{DONE}/{rel}@{KEY}" for rel in outputs]
    assert entries_of(outputs) == 40_000 + 1 + 1 + 2 + 4  # root, runs, e*, a*
    folders_of_markers = len({".snakemake", ".snakemake/modal", DONE}) + 1 + 2 + 4
    assert entries_of([*outputs, *markers]) == 80_000 + 8 + folders_of_markers
