"""While a group job runs, its finished outputs reach the volume (committed every
--modal-sync-seconds), and an output still being written never does."""

from __future__ import annotations

import subprocess
import time

from snakemake_executor_plugin_modal.staging import default_prefix

from .helpers import run_snakemake, spawned

GROUP = """
rule all:
    input: "second.txt"

rule first:
    output: "first.txt"
    group: "g"
    shell: "echo one > {output}"

rule second:
    input: "first.txt"
    output: "second.txt"
    group: "g"
    shell: "echo partial > {output}; sleep 6; echo two > {output}"
"""


def test_finished_outputs_are_committed_while_the_group_runs(modal_server, tmp_path):
    work = tmp_path / "wf"
    proc = run_snakemake(
        work,
        GROUP,
        "--modal-sync-seconds",
        "1",
        popen={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True},
    )
    # the volume as committed (containers write to their own view of it)
    volume = modal_server.state.root / "volumes" / "main" / "tests"
    volume /= default_prefix(work)
    first_at = second_at = None
    seen_second = set()
    while proc.poll() is None:
        now = time.monotonic()
        if first_at is None and (volume / "first.txt").exists():
            first_at = now
        if (volume / "second.txt").exists():
            second_at = second_at or now
            seen_second.add((volume / "second.txt").read_text())
        time.sleep(0.2)
    out = proc.stdout.read()
    assert proc.returncode == 0, out[-3000:]
    # second.txt takes 6 s: first.txt must be on the volume well before it
    assert first_at is not None and second_at is not None
    assert second_at - first_at > 3, "first.txt was not committed during the job"
    assert seen_second <= {"two\n"}, "a partly written output reached the volume"
    assert (work / "second.txt").read_text() == "two\n"
    assert len(spawned(modal_server)) == 1  # one container for the group
