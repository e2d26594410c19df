"""
The job's command, made fit for the container from Snakemake's own pieces (issue
47): ``--directory`` left out and ``--target-jobs`` left to the container, each
found as Snakemake formats it (``format_cli_arg``), never by a regular expression;
a command whose shape changed stops in one line naming the Snakemake version.
"""

from __future__ import annotations

import pytest
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.utils import format_cli_arg, join_cli_args

from snakemake_executor_plugin_modal.container import TARGETS
from snakemake_executor_plugin_modal.jobspec import command_piece
from snakemake_executor_plugin_modal.snakemake_reads import snakemake_version

from .helpers import COPY, run_snakemake, spawned


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "workdir",
    ["/runs/a", "/my runs/it's here", "/runs/--directory x"],
    ids=["plain", "spaces-and-quote", "flag-inside"],
)
def test_the_directory_piece_is_left_out_as_snakemake_wrote_it(workdir):
    """Snakemake's general arguments joined by its own ``join_cli_args``: the
    ``--directory`` piece, formatted by its ``format_cli_arg`` (quoted by
    ``repr``), leaves, and every other piece stays as it was."""
    others = [
        "python -m snakemake",
        format_cli_arg("--snakefile", "/runs/a/Snakefile"),
        "--force --nocolor",
        format_cli_arg("--config", ["x=1", "y='a b'"]),
    ]
    piece = format_cli_arg("--directory", workdir)
    command = join_cli_args([*others[:2], piece, *others[2:]])
    assert command_piece(command, piece, "", "--directory") == join_cli_args(others)
    last = join_cli_args([*others, piece])  # at the end too
    assert command_piece(last, piece, "", "--directory") == join_cli_args(others)


@pytest.mark.timeout(10)
def test_the_target_jobs_are_left_to_the_container():
    """``--target-jobs`` as Snakemake's ``get_job_args`` formats it gives way to
    the placeholder the container fills with the jobs left to run."""
    piece = format_cli_arg("--target-jobs", ["copy:", "shard:i=1"])
    args = join_cli_args([piece, "--cores 2", "--attempt 1"])
    got = command_piece(args, piece, f"--target-jobs {TARGETS}", "the jobs")
    assert got == f"--target-jobs {TARGETS} --cores 2 --attempt 1"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("times", [0, 2])
def test_a_command_of_another_shape_stops_in_one_line(times):
    """The piece absent (Snakemake formats it otherwise now) or twice: one line
    naming the Snakemake version and the tested range, not a guess."""
    piece = format_cli_arg("--directory", "/runs/a")
    command = join_cli_args(["python -m snakemake", *[piece] * times, "--force"])
    with pytest.raises(WorkflowError) as raised:
        command_piece(command, piece, "", "--directory")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"Modal: Snakemake {snakemake_version()}'s job command holds --directory "
        f"(\"--directory '/runs/a'\") {times} times, not once as the plugin reads "
        "it (tested with Snakemake 9.19 to 9.27)"
    )


@pytest.mark.timeout(300)
def test_a_run_with_directory_runs_its_job_without_it(modal_server, tmp_path):
    """``snakemake --directory <workdir>``: Snakemake puts the local path in the
    job's command; the container's command has no ``--directory`` (the path does
    not exist there) and its ``--target-jobs`` is the container's to fill; the job
    runs and its output comes home."""
    (tmp_path / "in.txt").write_text("hello\n")
    result = run_snakemake(tmp_path, COPY, "--directory", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out.txt").read_text() == "hello\n"
    ((spec,),) = [c["args"] for c in spawned(modal_server)]
    assert "--directory" not in spec["command"]
    assert spec["command"].count(f"--target-jobs {TARGETS}") == 1
    assert "--snakefile" in spec["command"] and "--force" in spec["command"]
