"""
The layer over snakemake-executor-plugin-slurm's status query
(`multigeom_workflow.on_slurm.status`), earlier runs' allocations
(`multigeom_workflow.on_slurm.allocations`), and kept files on file systems without
hard links (`multigeom_workflow.compute.kept`): their values, and the installed
plugin's source where they rely on it. The real cluster's endings:
tests/test_slurm_endings.py.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import os
from pathlib import Path

import pytest

from multigeom_workflow.compute import kept as kept_module
from multigeom_workflow.compute.kept import (
    KEEP_ENV,
    choose_keep_method,
    keep_finished,
    second_name,
    take_kept,
)
from multigeom_workflow.on_slurm import allocations, status
from multigeom_workflow.on_slurm.status import StatusLayer, state_for_plugin


def test_the_plugin_fails_on_the_states_the_layer_hands_it():
    """The installed plugin's failure states and status query are those the layer
    was written against (snakemake-executor-plugin-slurm 2.8.0)."""
    import snakemake_executor_plugin_slurm as plugin

    source = inspect.getsource(plugin.Executor.check_active_jobs)
    listed = source.split("fail_stati = (", 1)[1].split(")", 1)[0]
    assert {s.strip().strip('",') for s in listed.split()} - {""} == set(
        status.PLUGIN_FAIL_STATES
    )
    assert "status in fail_stati" in source
    # called by its module name: the layer replaces it there
    assert "await query_job_status(" in source
    assert "query_job_status" in vars(plugin)
    # a node failure adds the node to every later --exclude: handed FAILED instead
    assert 'status == "NODE_FAIL"' in source and "_failed_nodes.add" in source
    assert 'status == "PREEMPTED"' in source  # yielded as running


@pytest.mark.parametrize(
    ("state", "live", "given"),
    [
        ("CANCELLED by 0", None, "CANCELLED"),  # scancel: the plugin waited on it
        ("CANCELLED by 1000", "CANCELLED", "CANCELLED"),
        ("CANCELLED+", None, "CANCELLED"),
        ("PREEMPTED", "PREEMPTED", "FAILED"),  # PreemptMode=CANCEL: final
        ("PREEMPTED", "PENDING", "PENDING"),  # PreemptMode=REQUEUE: runs again
        ("NODE_FAIL", "PENDING", "PENDING"),  # sacct's ended attempt, requeued
        ("NODE_FAIL", None, "FAILED"),  # not requeued: no --exclude of the node
        ("TIMEOUT", None, "TIMEOUT"),
        ("OUT_OF_MEMORY", None, "OUT_OF_MEMORY"),
        ("DEADLINE", None, "DEADLINE"),
        ("BOOT_FAIL", None, "BOOT_FAIL"),
        ("REVOKED", None, "FAILED"),
        ("RUNNING", None, "RUNNING"),
        ("PENDING", None, "PENDING"),
        ("COMPLETED", None, "COMPLETED"),
    ],
)
def test_each_state_is_handed_to_the_plugin_as_slurm_means_it(state, live, given):
    assert state_for_plugin(state, live) == given


class Logger:
    def __init__(self):
        self.lines = []

    def warning(self, line):
        self.lines.append(line)


def test_the_layer_says_each_end_once_and_asks_the_controller_only_for_ends():
    answers = iter(
        [
            {"1": "RUNNING", "2": "RUNNING", "3": "RUNNING"},
            {"1": "CANCELLED by 0", "2": "NODE_FAIL", "3": "PENDING"},
            {"1": "CANCELLED by 0", "2": "RUNNING", "3": "RUNNING"},
        ]
    )
    asked = []

    async def query(command, logger):
        return next(answers), 0.01

    async def live(ids):
        asked.append(ids)
        return {"2": "PENDING"}  # 1 gone from the controller, 2 requeued

    layer, logger = StatusLayer(query, live), Logger()
    seen = [asyncio.run(layer.query("sacct ...", logger))[0] for _ in range(3)]
    assert seen[0] == {"1": "RUNNING", "2": "RUNNING", "3": "RUNNING"}
    assert seen[1] == {"1": "CANCELLED", "2": "PENDING", "3": "PENDING"}
    assert seen[2]["1"] == "CANCELLED"
    assert asked == [["1", "2"], ["1"]]
    ended = [x for x in logger.lines if "ended" in x]
    assert ended == [status.how_it_ended("1", "CANCELLED by 0")]
    assert "cancelled (scancel) by uid 0" in ended[0]
    requeued = [x for x in logger.lines if "requeued" in x]
    assert [x.split(":")[0] for x in requeued] == [
        "SLURM allocation 2 was requeued after NODE_FAIL (now PENDING)",
        "SLURM allocation 3 was requeued (now PENDING)",
    ]


def test_an_end_the_controller_cannot_confirm_is_asked_again():
    async def query(command, logger):
        return {"7": "NODE_FAIL"}, 0.01

    async def live(ids):
        return None  # squeue failed: SLURM may still requeue it

    states, _ = asyncio.run(StatusLayer(query, live).query("sacct", Logger()))
    assert states == {"7": "PENDING"}


def test_install_puts_the_layer_once_over_the_plugins_query(monkeypatch):
    import snakemake_executor_plugin_slurm as plugin

    original = plugin.query_job_status
    monkeypatch.setattr(plugin, "query_job_status", original)
    # what install also lays (tests/test_slurm_site.py), restored after the test
    monkeypatch.setattr(plugin, "subprocess", vars(plugin)["subprocess"])
    monkeypatch.setattr(
        plugin.Executor, "check_active_jobs", plugin.Executor.check_active_jobs
    )
    layer = status.install()
    assert plugin.query_job_status == layer.query and layer.original is original
    assert status.install() is layer


def test_earlier_allocations_are_this_directorys_per_image_shards(tmp_path):
    here, other = str(tmp_path), "/elsewhere"
    rows = [
        ["11", "RUNNING", here, "rule_shard-00_estimate_image_estimate_image_ceiling"],
        ["12", "PENDING", here, "rule_shard-01_estimate_image"],
        ["13", "RUNNING", other, "rule_shard-00_estimate_image"],
        ["14", "RUNNING", here, "rule_align_configs"],
        ["15", "COMPLETED", here, "rule_shard-02_estimate_image"],
    ]
    found = allocations.earlier_allocations(here, lambda args: rows)
    assert found == [("11", "RUNNING"), ("12", "PENDING")]
    answers = iter([[["11", "CANCELLED", here, "x"]], []])
    cancelled = []
    line = allocations.cancel_earlier_allocations(
        here,
        lambda args: rows if "-u" in args else next(answers),
        cancelled.extend,
        kept=lambda ids: 3 if ids == ["11", "12"] else 0,
    )
    assert cancelled == ["11", "12"]
    assert line.startswith("cancelled 2 SLURM allocation(s) of an earlier run")
    assert "(11 RUNNING, 12 PENDING)" in line
    assert "the 3 image(s) they finished are kept and taken back" in line
    assert allocations.cancel_earlier_allocations(here, lambda args: []) is None


def test_allocations_that_do_not_end_stop_the_run_with_one_line(tmp_path):
    rows = [["11", "RUNNING", str(tmp_path), "rule_shard-00_estimate_image"]]
    with pytest.raises(SystemExit, match=r"config error: SLURM allocation\(s\) 11 "):
        allocations.cancel_earlier_allocations(
            str(tmp_path), lambda args: rows, lambda ids: None, wait_s=0
        )


def refuse_links_between_folders(monkeypatch):
    """os.link as BeeGFS up to v7 has it: EPERM for a link into another folder."""
    real = os.link

    def link(src, dst, *args, **kwargs):
        if os.path.dirname(os.path.abspath(src)) != os.path.dirname(
            os.path.abspath(dst)
        ):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(kept_module.os, "link", link)


def test_without_links_between_folders_a_copy_is_kept_and_taken_back(
    tmp_path, monkeypatch
):
    refuse_links_between_folders(monkeypatch)
    assert choose_keep_method(tmp_path)[0] == "copy"
    assert "PermissionError" in choose_keep_method(tmp_path)[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the probe leaves nothing
    out = tmp_path / "img0003.pt"
    out.write_bytes(b"finished image")
    monkeypatch.setenv(KEEP_ENV, "link")  # chosen as links: falls back to a copy
    kept = keep_finished(out, "31")
    assert kept.read_bytes() == b"finished image" and not kept.samefile(out)
    out.unlink()
    assert take_kept(out, "32") == kept and out.read_bytes() == b"finished image"
    assert [p.name for p in tmp_path.glob(".*.part")] == []


def test_keeping_never_fails_a_finished_image(tmp_path, monkeypatch, capsys):
    out = tmp_path / "img0004.pt"
    out.write_bytes(b"done")

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(kept_module, "second_name", refuse)
    assert keep_finished(out, "41") is None
    assert out.read_bytes() == b"done"
    assert "no second name could be kept" in capsys.readouterr().out


def test_a_requeued_allocation_takes_back_its_own_finished_images(tmp_path):
    """SLURM runs job 51 again: what it kept in its first run comes back."""
    out = tmp_path / "img0001.pt"
    out.write_bytes(b"first run's image")
    keep_finished(out, "51")
    out.unlink()  # its Snakemake (--force) removed the outputs first
    assert take_kept(out, "51") == tmp_path / ".kept-slurm-51" / "img0001.pt"
    assert out.read_bytes() == b"first run's image"


def test_second_name_links_where_it_can(tmp_path):
    src = tmp_path / "a"
    src.write_bytes(b"x")
    (tmp_path / "d").mkdir()
    assert second_name(src, tmp_path / "d" / "a") == "link"
    assert (tmp_path / "d" / "a").samefile(src)
    with pytest.raises(FileExistsError):
        second_name(src, tmp_path / "d" / "a", "copy")


def test_what_a_cancelled_allocation_removed_is_put_back_and_still_kept(tmp_path):
    """The earlier run's Snakemake, cancelled, removed a file it had just finished
    (after the new run planned with it there): put back, its kept name stays."""
    from multigeom_workflow.compute.kept import put_back

    out = tmp_path / "img0003.pt"
    out.write_bytes(b"finished by the orphan")
    keep_finished(out, "61")
    out.unlink()
    assert put_back([tmp_path], ["61"]) == [out]
    assert out.read_bytes() == b"finished by the orphan"
    assert (tmp_path / ".kept-slurm-61" / "img0003.pt").exists()
    assert put_back([tmp_path], ["61"]) == []  # there already


def test_one_vocabulary_of_slurm_states():
    """SLURM's job states are written once (settings/slurm_states.py) and imported
    everywhere: no other module of the package spells a state code as a literal
    set member."""
    import ast

    from multigeom_workflow.on_slurm import submit
    from multigeom_workflow.settings import slurm_states

    assert status.ENDED_STATES is slurm_states.ENDED_STATES
    assert allocations.LIVE_STATES is slurm_states.LIVE_STATES
    assert submit.WILL_RUN is slurm_states.WILL_RUN
    assert "PREEMPTED" in slurm_states.ENDED_STATES
    assert "PREEMPTED" not in slurm_states.LIVE_STATES
    codes = {"PENDING", "RUNNING", "PREEMPTED", "REQUEUED", "COMPLETING"}
    package = Path(slurm_states.__file__).parents[1]
    spelled = {}
    for path in package.rglob("*.py"):
        if path.name == "slurm_states.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
                found = {
                    e.value
                    for e in node.elts
                    if isinstance(e, ast.Constant) and e.value in codes
                }
                if len(found) > 1:
                    spelled[str(path.relative_to(package))] = sorted(found)
    assert not spelled, spelled


def test_kept_files_follow_the_controller_for_a_preempted_allocation(
    tmp_path, monkeypatch
):
    """``sacct -X`` says PREEMPTED for a requeued job and for a cancelled one alike;
    the controller's live state decides (settings.slurm_states): a requeued one
    (PENDING in squeue) keeps its folder, a preempted one that SLURM does not run
    again gives its finished images back."""
    answers = {
        "squeue": [("101", "PENDING"), ("102", "PREEMPTED")],
        "sacct": [("101", "PREEMPTED"), ("102", "PREEMPTED"), ("103", "COMPLETED")],
    }
    monkeypatch.setattr(kept_module, "_slurm_rows", lambda cmd: answers[cmd[0]])
    states = kept_module.slurm_job_states(["101", "102", "103", "104"])
    assert states == {"101": "PENDING", "102": "PREEMPTED", "103": "COMPLETED"}
    folder = tmp_path / "per_image"
    for job in ("101", "102"):
        kept = folder / f"{kept_module.KEPT_PREFIX}{job}"
        kept.mkdir(parents=True)
        (kept / f"img000{job[-1]}.pt").write_bytes(b"x")
    found = kept_module.ended_allocation_files([folder], lambda ids: states)
    assert [t.name for t, _ in found.put_back] == ["img0002.pt"]
    assert found.ended == ["102 PREEMPTED"]
    assert [d.name for d in found.drop] == [f"{kept_module.KEPT_PREFIX}102"]
