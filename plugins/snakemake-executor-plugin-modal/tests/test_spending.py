"""
How a run on Modal ends, refuses and bills: the budget at every moment, a container
that started before its inputs were uploaded, client errors that leave no container
running, a failed shard's finished files, and a shard of 10,000 images.
"""

from __future__ import annotations

import re

from .helpers import run_snakemake
from .test_failures import COPY, SHARD, SLOW, calls, cancels, counts

HANG = """
rule all:
    input: "a.txt", "b.txt"

rule slow:
    output: "{x}.txt"
    log: "{x}.log"
    threads: 2
    resources: gpu=1, mem_mb=2048
    shell: "echo started > {log}; sleep {config[sleep]}; echo done > {output}"
"""

#: What one second of a T4 container of 1 core and 1 GiB costs, USD, at Modal's
#: rates (July 2026): 0.000164 (T4) + 0.0000131 (a physical core) + 0.00000222
#: (a GiB).
T4_1_CORE_1_GIB = 0.000164 + 0.0000131 + 0.00000222
#: The same with 2 cores and 2 GiB (HANG's jobs): 0.00019464 USD/s.
T4_2_CORES_2_GIB = 0.000164 + 2 * 0.0000131 + 2 * 0.00000222

_SUMMARY = re.compile(
    r"Modal: (\d+) container\(s\), ([\d,]+) GPU-seconds, ([\d,]+) core-seconds, "
    r"([\d,]+) GiB-seconds, ([\d.]+) USD spent \(GPU ([\d.]+), CPU ([\d.]+), "
    r"memory ([\d.]+)\)"
)


def summary(text: str) -> dict:
    """
    The run's last line ("Modal: N container(s), G GPU-seconds, C core-seconds, M
    GiB-seconds, X USD spent (GPU a, CPU b, memory c)"), read: ``containers``,
    ``gpu_s``, ``core_s``, ``gib_s``, ``usd``, ``gpu_usd``, ``cpu_usd``,
    ``memory_usd``.
    """
    found = _SUMMARY.findall(text)
    assert found, text[-3000:]
    values = [float(v.replace(",", "")) for v in found[-1]]
    keys = ("containers", "gpu_s", "core_s", "gib_s", "usd", "gpu_usd", "cpu_usd")
    return dict(zip([*keys, "memory_usd"], values, strict=True))


def spent(text: str) -> float:
    """The USD of the run's last line (`summary`)."""
    return summary(text)["usd"]


def test_a_hanging_shard_is_cancelled_when_the_budget_is_reached(
    modal_server, tmp_path
):
    """
    Two shards that hang, each on a T4 with 2 cores and 2 GiB (0.00019464 USD/s:
    the GPU, the cores and the memory at Modal's rates), a budget of 30 s of one
    (30 x 0.00019464 = 0.0058392 USD): the first starts with its 30 s timeout (its
    worst case fits exactly, with no start-up allowance), the second waits (nothing
    left beside the first's worst case) and its line prices the container's GPU,
    cores and memory; the first's container takes 5 s to start (the server's
    ``start_delay_s``: billed, before its timeout counts), so the spending reaches
    the budget before Modal's timeout: every call is cancelled with one line, the
    waiting job refused. Neither the ledger nor what the server billed passes the
    budget; the run's last line counts 2 cores and 2 GiB per GPU-second.
    """
    modal_server.faults.start_delay_s = 5.0
    budget = 30 * T4_2_CORES_2_GIB
    result = run_snakemake(
        tmp_path,
        HANG,
        "--config",
        "sleep=600",
        "--modal-timeout",
        "30",
        "--modal-startup-seconds",
        "0",
        "--modal-max-cost-usd",
        f"{budget:.5f}",
        timeout=120,
    )
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert len(calls(modal_server)) == 1, text[-3000:]  # the second never started
    assert (
        "waits: --modal-max-cost-usd 0.00584: its worst case, 0.00019464 USD/s "
        "(1 x T4 + 2 cores + 2 GiB) x (30 s of timeout + 0 s of start-up)"
    ) in text
    assert "the budget is reached: every call is cancelled" in text
    assert calls(modal_server)[0]["call_id"] in cancels(modal_server)
    # what Modal was asked for: 2 cores (milli-cores) and 2048 MiB
    (variant,) = [f for f in modal_server.state.functions.values() if f.options]
    resources = variant.options.resources
    assert (resources.milli_cpu, resources.memory_mb) == (2000, 2048)
    bill_line = summary(text)
    assert bill_line["usd"] <= budget
    assert abs(bill_line["core_s"] - 2 * bill_line["gpu_s"]) <= 1  # each rounded
    assert abs(bill_line["gib_s"] - 2 * bill_line["gpu_s"]) <= 1
    (bill,) = modal_server.state.bill()
    assert bill["end"] is not None
    assert (bill["end"] - bill["start"]) * T4_2_CORES_2_GIB <= budget
    (container,) = modal_server.state.containers.values()
    assert container.asked_at - container.started_at >= 5.0  # the delay, billed
    assert modal_server.state.running_containers() == []


def test_the_first_wave_holds_each_calls_worst_case(modal_server, tmp_path):
    """
    Ten one-image jobs of runtime 1 min on a T4 with 1 core and 1 GiB with a budget
    for three worst cases (3 x 0.00017932 USD/s x (60 + 10) s = 0.0376572 USD):
    three start at once, the others wait and start as those end; the run finishes,
    spending what the ten took.
    """
    snakefile = """
rule all:
    input: expand("img{i}.txt", i=range(10))

rule image:
    output: "img{i}.txt"
    resources: gpu=1, runtime=1, mem_mb=1024
    shell: "sleep 1; echo {wildcards.i} > {output}"
"""
    budget = 3 * T4_1_CORE_1_GIB * 70
    result = run_snakemake(
        tmp_path,
        snakefile,
        "--jobs",
        "10",
        "--modal-startup-seconds",
        "10",
        "--modal-max-cost-usd",
        f"{budget:.5f}",
        timeout=300,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert text.count(" waits: ") >= 7  # at most 3 of the 10 started at once
    assert len(calls(modal_server)) == 10
    # never more than three containers at once (what the server billed)
    bill = modal_server.state.bill()
    assert all(b["end"] is not None for b in bill)
    for record in bill:
        at = record["start"] + 0.01
        assert sum(b["start"] <= at < b["end"] for b in bill) <= 3
    assert spent(text) <= budget


def test_a_container_started_before_an_upload_reloads_the_volume(
    modal_server, tmp_path
):
    """
    The server starts each function's container ahead of its input (``Faults.
    containers_ahead``): its view of the volume is the one committed before the
    client's upload, as on Modal when an input goes to a container started
    earlier. Without ``Volume.reload()`` the container does not see a file uploaded
    after it started; the plugin's containers reload first, so a job's input
    uploaded after the app started is there.
    """
    import modal

    modal_server.faults.containers_ahead = True
    mount = str(modal_server.mount.parent / "probe")

    def sees(path, reload):
        import os

        import modal

        if reload:
            modal.Volume.from_name("probe").reload()
        return os.path.exists(path)

    app = modal.App("probe")
    volume = modal.Volume.from_name("probe", create_if_missing=True)
    function = app.function(
        volumes={mount: volume}, serialized=True, single_use_containers=True
    )(sees)
    with app.run():
        (tmp_path / "in.txt").write_text("uploaded after the start\n")
        with volume.batch_upload() as batch:
            batch.put_file(str(tmp_path / "in.txt"), "/in.txt")
        assert function.spawn(f"{mount}/in.txt", False).get(timeout=60) is False
        assert function.spawn(f"{mount}/in.txt", True).get(timeout=60) is True
    (tmp_path / "wf").mkdir()
    (tmp_path / "wf" / "in.txt").write_text("input\n")
    result = run_snakemake(tmp_path / "wf", COPY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "wf" / "out.txt").read_text() == "input\n"
    # the job's input went to a container started before its upload
    state = modal_server.state
    (job,) = [c for c in calls(modal_server) if c["function"] == "run_job"]
    container = state.containers[job["task_ids"][0]]
    upload = [c for c in state.calls_of("VolumePutFiles") if c.status == "OK"][-1]
    assert container.started_at < upload.at


def test_client_errors_of_get_leave_no_container_running(modal_server, tmp_path):
    """
    A token revoked during the run (``FunctionGetOutputs`` answers
    ``UNAUTHENTICATED``, which the client raises at once as ``AuthError``): the
    call is cancelled before its job fails, not left billing beside the retry. A
    rate limit (``RESOURCE_EXHAUSTED``, ``ResourceExhaustedError``, not retried by
    the client either) is taken as "status not readable": the call goes on and
    finishes.
    """
    faults = modal_server.faults
    faults.fail_rpc(
        "FunctionGetOutputs", "UNAUTHENTICATED", times=None, message="token revoked"
    )
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=300", timeout=120)
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the Modal call failed: AuthError: token revoked" in text
    call_id = calls(modal_server)[0]["call_id"]
    assert cancels(modal_server) == [call_id]
    assert modal_server.state.running_containers() == []

    faults.rpc.clear()
    faults.fail_rpc(
        "FunctionGetOutputs", "RESOURCE_EXHAUSTED", times=2, message="slow down"
    )
    work = tmp_path / "limited"
    result = run_snakemake(work, SLOW, "--config", "sleep=0", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "status not readable (ResourceExhaustedError: slow down)" in text
    assert (work / "out.txt").read_text() == "done\n"


def test_a_cancel_that_fails_is_tried_again(modal_server, tmp_path):
    """The first two cancels of the revoked-token call are lost (each past the
    client's own 3 retries of ``UNAVAILABLE``: 8 failed ``FunctionCallCancel``):
    the third, a few seconds later, stops it."""
    faults = modal_server.faults
    faults.fail_rpc("FunctionGetOutputs", "UNAUTHENTICATED", times=None)
    lost = faults.fail_rpc("FunctionCallCancel", times=8)
    result = run_snakemake(tmp_path, SLOW, "--config", "sleep=300", timeout=120)
    assert result.returncode != 0
    assert cancels(modal_server) == [calls(modal_server)[0]["call_id"]]
    assert lost.failed == 8
    statuses = [c.status for c in modal_server.state.calls_of("FunctionCallCancel")]
    assert statuses == ["UNAVAILABLE"] * 8 + ["OK"]
    assert modal_server.state.running_containers() == []


THREE = SHARD.replace("i=range(2)", "i=range(3)")


def test_a_failed_shard_brings_home_the_images_it_finished(modal_server, tmp_path):
    """
    One image of a shard of three fails: the two others, committed by the container,
    are downloaded once Snakemake has removed the failed job's outputs; the next run
    computes only the failed one.
    """
    ran = tmp_path / "ran"
    ran.mkdir()
    work = tmp_path / "wf"
    base = ["--group-components", "shard=3", "--config", f"counts={ran}", "tt=0"]
    first = run_snakemake(work, THREE, *base, "fail=1", "--retries", "0")
    text = first.stdout + first.stderr
    assert first.returncode != 0
    assert "2 output(s) its container finished are brought home" in text
    assert (work / "img0.txt").read_text() == (work / "img2.txt").read_text() == "1\n"
    assert not (work / "img1.txt").exists()
    second = run_snakemake(work, THREE, *base, "fail=-1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert counts(ran) == {"0": 1, "1": 2, "2": 1}
    assert (work / "img1.txt").read_text() == "1\n"


def test_ten_thousand_targets_start_in_one_container(modal_server, tmp_path):
    """
    A shard's targets go to the shell in a file: 10,000 ``--target-jobs`` entries
    (about 540 KB, above the 128 KiB that one argument of ``sh -c`` may hold) reach
    the command as 10,000 arguments.
    """
    import modal

    from snakemake_executor_plugin_modal.container import TARGETS, run_job

    mount = str(modal_server.mount)
    volume = modal.Volume.from_name("big", create_if_missing=True)
    app = modal.App("big")
    function = app.function(volumes={mount: volume}, timeout=120, serialized=True)(
        run_job
    )
    targets = [
        f"'estimate_image:area=V1,encoder=resnet50,index={i:05d}'" for i in range(10000)
    ]
    spec = {
        "mount": mount,
        "volume": "big",
        "prefix": "wf",
        "stage": [],
        "command": f"python -c 'import sys; print(len(sys.argv) - 1)' {TARGETS}",
        "outputs": [],
        "job_outputs": [],
        "results": [],
        "log": ".snakemake/modal/big.log",
        "sync_every_s": 30,
        "members": [{"target": t, "outputs": [], "key": "k"} for t in targets],
    }
    assert len(" ".join(targets)) > 128 * 1024
    with app.run():
        result = function.spawn(spec).get(timeout=120)
    assert result["returncode"] == 0, result["log_tail"]
    assert result["log_tail"].strip().splitlines()[-1] == "10000"
