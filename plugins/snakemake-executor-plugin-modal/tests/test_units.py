"""Unit tests: GPU specifications and prices, pinned requirements, the cost ledger,
staging through the volume, and the container's reading of Snakemake's markers."""

from __future__ import annotations

import math
import os
import time
import types
from pathlib import Path

import pytest
import snakemake
from snakemake.persistence.file import FilePersistence
from snakemake_interface_common.exceptions import WorkflowError

from snakemake_executor_plugin_modal.calls import Ledger
from snakemake_executor_plugin_modal.container import DONE, _incomplete
from snakemake_executor_plugin_modal.image import pinned_requirements
from snakemake_executor_plugin_modal.prices import (
    ContainerRequest,
    GpuRequest,
    parse_gpu,
)
from snakemake_executor_plugin_modal.staging import VolumeStager, relative_to_workdir


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("A100", GpuRequest("A100", 1)),
        ("h100:2", GpuRequest("H100", 2)),
        (" A100-80GB ", GpuRequest("A100-80GB", 1)),
    ],
)
def test_parse_gpu(spec, expected):
    assert parse_gpu(spec) == expected


@pytest.mark.parametrize("spec", ["", ":2", "H100:0", "H100:two"])
def test_parse_gpu_rejects(spec):
    with pytest.raises(ValueError, match="GPU specification"):
        parse_gpu(spec)


def test_prices_per_container():
    # price page (July 2026): H100 0.001097 USD/s, A100 40 GB 0.000583 USD/s
    assert GpuRequest("H100", 2).usd_per_second == pytest.approx(2 * 0.001097)
    assert GpuRequest("A100", 1).usd_per_second == pytest.approx(0.000583)
    assert GpuRequest("H100", 2).modal_spec == "H100:2"
    assert math.isnan(GpuRequest("X9000").usd_per_second)


def test_container_request_prices_gpus_cores_and_memory():
    # Modal's price page (July 2026): H100 0.001097 USD/s per GPU, a physical core
    # 0.0000131 USD/s, a GiB of memory 0.00000222 USD/s
    two = ContainerRequest(GpuRequest("H100", 2), cpu=8.0, memory_mb=32768)
    assert two.gpu_usd_per_second == pytest.approx(2 * 0.001097)  # 0.002194
    assert two.cpu_usd_per_second == pytest.approx(8 * 0.0000131)  # 0.0001048
    assert two.memory_usd_per_second == pytest.approx(32 * 0.00000222)  # 0.00007104
    assert two.usd_per_second == pytest.approx(0.00236984)
    # a CPU container of 1 core without a memory request: Modal's default 128 MiB
    cpu = ContainerRequest(None, 1.0, None)
    assert cpu.usd_per_second == pytest.approx(0.0000131 + 0.125 * 0.00000222)
    # nothing requested: Modal's defaults, 0.125 cores and 128 MiB
    assert ContainerRequest().usd_per_second == pytest.approx(
        0.125 * 0.0000131 + 0.125 * 0.00000222
    )
    assert math.isnan(ContainerRequest(GpuRequest("X9000")).usd_per_second)


def test_ledger_known_case_and_admission():
    ledger = Ledger(max_cost_usd=1.0, startup_s=100.0)
    # two H100, 4 cores, 16 GiB: 0.002194 + 0.0000524 + 0.00003552 = 0.00228192 USD/s
    two = ContainerRequest(GpuRequest("H100", 2), cpu=4.0, memory_mb=16384)
    ledger.add(two, 300.0)
    assert (ledger.gpu_seconds, ledger.core_seconds, ledger.gib_seconds) == (
        600.0,
        1200.0,
        4800.0,
    )
    assert ledger.gpu_usd == pytest.approx(600 * 0.001097)  # 0.6582
    assert ledger.cpu_usd == pytest.approx(1200 * 0.0000131)  # 0.01572
    assert ledger.memory_usd == pytest.approx(4800 * 0.00000222)  # 0.010656
    assert ledger.cost_usd == pytest.approx(0.684576)
    # 0.315424 USD left. 60 s of the same: worst case 0.00228192 x (60 + 100) s
    # = 0.3651072 USD: refused
    alone = ledger.admit(two, 60)
    assert alone.verdict == "refuse" and "= 0.37 USD" in alone.message
    assert "(2 x H100 + 4 cores + 16 GiB)" in alone.message
    assert "could bring it to 1.05 USD" in alone.message  # 0.684576 + 0.3651072
    # the same while a call runs: refused at once, it would not fit even alone
    busy = ledger.admit(two, 60, reserved_usd=0.1, running=1)
    assert busy.verdict == "refuse"
    # one H100, 2 cores, 8 GiB: 0.001097 + 0.0000262 + 0.00001776 = 0.00114096 USD/s;
    # 160 s (0.1825536 USD) fit alone: held back while 0.2 USD are held
    one = ContainerRequest(GpuRequest("H100"), cpu=2.0, memory_mb=8192)
    held = ledger.admit(one, 60, reserved_usd=0.2, running=1)
    assert held.verdict == "wait"
    assert "0.12 USD left while 1 call(s) run" in held.message  # 0.315424 - 0.2
    # what running calls may still cost is held aside: 0.28 USD of them, 0.035424
    # left; one T4, 1 core, 128 MiB: 0.000164 + 0.0000131 + 0.0000002775 USD/s
    # x 160 s = 0.0283804 USD fits
    t4 = ContainerRequest(GpuRequest("T4"), cpu=1.0)
    assert ledger.admit(t4, 60, reserved_usd=0.28, running=1).verdict == "start"
    # a default timeout (no runtime) is cut to the budget left when nothing runs:
    # floor(0.315424 / 0.00114096 - 100) = 176 s; for `two` 38 s, below the minimum
    cut = ledger.admit(one, 3600, may_cut=True)
    assert (cut.verdict, cut.timeout_s) == ("start", 176)
    assert "timeout cut from 3600 s to 176 s" in cut.message
    assert ledger.admit(two, 3600, may_cut=True).verdict == "refuse"
    # a CPU container is priced too: 1 core, 128 MiB, 0.0000133775 USD/s; 600 s
    # (0.00936425 USD with its start-up) fit, a day does not
    cpu = ContainerRequest(None, 1.0)
    assert ledger.worst_case(cpu, 600) == pytest.approx(0.0000133775 * 700)
    assert ledger.admit(cpu, 600).verdict == "start"
    assert ledger.admit(cpu, 86400).verdict == "refuse"
    # a GPU type without a price (refused before the run: preflight) is not held
    assert ledger.admit(ContainerRequest(GpuRequest("X9000")), 1e9).verdict == "start"
    assert Ledger().admit(two, 86400).verdict == "start"  # no limit
    assert (
        "1 container(s), 600 GPU-seconds, 1,200 core-seconds, 4,800 GiB-seconds, "
        "0.6846 USD spent (GPU 0.6582, CPU 0.0157, memory 0.0107)"
    ) in ledger.summary()


def test_spending_that_reaches_the_budget_stops_the_run():
    ledger = Ledger(max_cost_usd=1.0)
    # one H100, 1 core, 1 GiB: 0.001097 + 0.0000131 + 0.00000222 = 0.00111232 USD/s
    ledger.add(ContainerRequest(GpuRequest("H100"), 1.0, 1024), 500.0)  # 0.55616
    assert ledger.spent_line(0.44, None) is None  # 0.99616 < 1
    line = ledger.spent_line(0.44384, None)  # 1.0000
    assert "1.00 USD spent, running calls included" in line
    assert ledger.exhausted == line
    refused = ledger.admit(ContainerRequest(GpuRequest("T4"), 1.0), 1)
    assert refused.verdict == "refuse" and refused.message == line


def test_gpu_fallback_list():
    request = parse_gpu("a100-80gb,H100")
    assert request.modal_spec == ["A100-80GB", "H100"]
    assert request.usd_per_second == pytest.approx(0.001097)  # the dearest: H100
    assert parse_gpu(["L4:2", "T4:2"]).modal_spec == ["L4:2", "T4:2"]
    with pytest.raises(ValueError, match="same count"):
        parse_gpu("H100:2,A100")


@pytest.mark.parametrize(
    ("version", "direct_url", "expected"),
    [
        ("2.8.0", None, "2.8.0"),
        ("2.8.0+cpu", None, "2.8.0"),  # the index's (CUDA) build of the same version
        ("2.8.0+cu128", None, "2.8.0"),
        ("0.1.dev5+g1a2b3c", None, "local build"),
        ("1.0", '{"url": "file:///src", "dir_info": {"editable": true}}', "editable"),
        ("1.0", '{"url": "https://example.org/x.whl"}', "from https://example.org"),
    ],
)
def test_pins_are_installable_from_the_index(
    monkeypatch, version, direct_url, expected
):
    from snakemake_executor_plugin_modal import image

    dist = types.SimpleNamespace(version=version, read_text=lambda name: direct_url)
    real = image.metadata.distribution
    monkeypatch.setattr(
        image.metadata,
        "distribution",
        lambda name: dist if name == "torch" else real(name),
    )
    if expected[0].isdigit():
        assert image.pinned_requirements(["torch"])[-1] == f"torch=={expected}"
    else:
        with pytest.raises(WorkflowError, match=f"--modal-pip: torch .*{expected}"):
            image.pinned_requirements(["torch"])


def test_python_versions_modal_cannot_build_are_refused():
    from snakemake_executor_plugin_modal.image import check_python_version

    assert check_python_version((3, 12, 1)) == "3.12"
    with pytest.raises(WorkflowError, match="Python 3.9: Modal's image builder"):
        check_python_version((3, 9, 0))


def test_default_volume_folder_is_unique_per_checkout(tmp_path):
    from snakemake_executor_plugin_modal.staging import default_prefix

    a, b = tmp_path / "x" / "wf", tmp_path / "y" / "wf"
    assert default_prefix(a).startswith("wf-") and default_prefix(a) != default_prefix(
        b
    )
    assert default_prefix(a) == default_prefix(str(a))


class _Call:
    """A FunctionCall whose ``get`` raises the given exceptions, then returns."""

    object_id = "fc-test"

    def __init__(self, *raises):
        self.raises = list(raises)
        self.cancels = []

    def cancel(self, terminate_containers=False):
        self.cancels.append(terminate_containers)

    def get(self, timeout=None):
        if self.raises:
            raise self.raises.pop(0)
        return {"returncode": 0, "log_tail": "", "seconds": 1.0}


def test_poll_tolerates_transport_errors_for_a_bounded_while():
    """What the installed client raises once its retries of a transport error are
    spent (``modal.exception.ConnectionError``, modal/_utils/grpc_utils.py,
    ``process_exception_before_retry``), an ``OSError`` and a bare ``TimeoutError``:
    taken as "running" for the grace period, then the call is given up."""
    import modal.exception

    from snakemake_executor_plugin_modal.calls import ContainerCall

    warnings = []
    lost = modal.exception.ConnectionError("Deadline exceeded")
    call = ContainerCall(
        _Call(lost, OSError("reset"), TimeoutError()), None, 60, warn=warnings.append
    )
    assert call.poll() is None and call.poll() is None and call.poll() is None
    assert len(warnings) == 2 and "still taken as running" in warnings[0]
    assert call.poll().ok
    gone = ContainerCall(_Call(lost, lost), None, 60, warn=warnings.append, grace_s=0)
    outcome = gone.poll()
    assert not outcome.ok and "could not be reached" in outcome.message
    assert outcome.given_up
    # a socket's timeout (an OSError with ETIMEDOUT is a TimeoutError) is a transport
    # error, bounded; only poll_function's bare TimeoutError() means "running"
    socket_timeout = OSError(110, "Connection timed out")
    assert isinstance(socket_timeout, TimeoutError)
    cut = ContainerCall(_Call(socket_timeout), None, 60, warn=print, grace_s=0)
    assert "could not be reached" in cut.poll().message


def test_poll_takes_expired_output_as_a_failure():
    import modal.exception

    from snakemake_executor_plugin_modal.calls import ContainerCall

    expired = modal.exception.OutputExpiredError()
    # a Modal TimeoutError, not Python's: not "still running"
    assert isinstance(expired, modal.exception.TimeoutError)
    assert not isinstance(expired, TimeoutError)
    outcome = ContainerCall(_Call(expired), None, 60).poll()
    assert not outcome.ok and "OutputExpiredError" in outcome.message


def test_pinned_requirements():
    pins = pinned_requirements(["pytest", "numpy>=1", "pytest"])
    assert f"snakemake=={snakemake.__version__}" in pins
    assert f"pytest=={pytest.__version__}" in pins
    assert "numpy>=1" in pins and len(pins) == 3
    with pytest.raises(WorkflowError, match="not installed locally"):
        pinned_requirements(["surely-not-installed-package-xyz"])


def test_incomplete_marker_is_snakemakes_own(tmp_path):
    stub = types.SimpleNamespace(_fetch_max_len=lambda subject: 255)
    records = tmp_path / "snakemake1234" / "persistence" / "incomplete"
    for key in ["runs/per_image/a/b/img0001.pt", "x/" * 150 + "long.txt"]:
        marker = FilePersistence._record_path(stub, str(records), key)
        assert not _incomplete([records], key)
        Path(marker).parent.mkdir(parents=True, exist_ok=True)
        Path(marker).touch()
        assert _incomplete([records], key)


def test_relative_to_workdir(tmp_path):
    assert relative_to_workdir("a/b.txt", tmp_path) == "a/b.txt"
    assert relative_to_workdir(tmp_path / "c.txt", tmp_path) == "c.txt"
    with pytest.raises(WorkflowError, match="outside the working directory"):
        relative_to_workdir("../elsewhere.txt", tmp_path)


def _volume(server, name: str = "units"):
    """
    The volume ``name`` on the local Modal server, through the installed client (as
    the executor opens it), and the folder holding its committed files.
    """
    import modal

    volume = modal.Volume.from_name(name, create_if_missing=True)
    volume.hydrate()
    return volume, server.state.volume(name).folder


def test_upload_sends_only_missing_or_changed_files(modal_server, tmp_path):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "a.txt").write_text("a")
    (work / "data" / "b.txt").write_text("b")
    volume, folder = _volume(modal_server)
    stager = VolumeStager(volume, "proj", work)
    assert stager.upload(["data"]) == ["data/a.txt", "data/b.txt"]
    assert stager.upload(["data/a.txt", "data"]) == []
    # a new stager lists the volume: still nothing to send
    assert VolumeStager(volume, "proj", work).upload(["data"]) == []
    # changed content, same size and modification time: sent (content-checked)
    st = os.stat(work / "data" / "b.txt")
    (work / "data" / "b.txt").write_text("c")
    os.utime(work / "data" / "b.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert VolumeStager(volume, "proj", work).upload(["data"]) == ["data/b.txt"]
    committed = folder / "proj" / "data"
    assert (committed / "a.txt").read_text() == "a"
    assert (committed / "b.txt").read_text() == "c"
    # two batches: the first and the changed file's (none when nothing changed)
    assert len(modal_server.state.calls_of("VolumePutFiles")) == 2
    with pytest.raises(WorkflowError, match="does not exist locally"):
        stager.upload(["missing.txt"])


def test_files_and_remove_with_reuse_markers(modal_server, tmp_path):
    """The listing and deletion the workflow's progress/clear commands call."""
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    for name in ("a.pt", "b.pt"):
        (work / "out" / name).write_text(name)
    (work / "in.txt").write_text("in")
    volume, folder = _volume(modal_server)
    stager = VolumeStager(volume, "proj", work)
    stager.upload(["out", "in.txt"])
    markers = work / DONE / "out"
    markers.mkdir(parents=True)
    (markers / "a.pt@k1").write_text("k1")
    (markers / "ab.pt@k2").write_text("k2")  # another file's marker: kept
    with volume.batch_upload(force=True) as batch:
        batch.put_directory(str(work / DONE), f"/proj/{DONE}")
    assert sorted(stager.files("out")) == ["out/a.pt", "out/b.pt"]
    assert "in.txt" in stager.files() and stager.files("nowhere") == {}
    assert VolumeStager(volume, "other", work).files() == {}
    assert stager.remove(["out/a.pt", "out/missing.pt"]) == ["out/a.pt"]
    assert sorted(stager.files("out")) == ["out/b.pt"]
    assert sorted(stager.files(DONE)) == [f"{DONE}/out/ab.pt@k2"]
    assert not (folder / "proj" / "out" / "a.pt").exists()
    assert not (folder / "proj" / DONE / "out" / "a.pt@k1").exists()
    # the volume's manifest forgets it: the next upload sends it again
    assert VolumeStager(volume, "proj", work).upload(["out"]) == ["out/a.pt"]


def test_download_is_atomic_and_keeps_the_volume_time(modal_server, tmp_path):
    work = tmp_path / "work"
    src = tmp_path / "src"
    (src / "out").mkdir(parents=True)
    (src / "out" / "r.txt").write_text("result")
    volume, _ = _volume(modal_server)
    with volume.batch_upload(force=True) as batch:
        batch.put_file(str(src / "out" / "r.txt"), "/proj/out/r.txt")
    stager = VolumeStager(volume, "proj", work)
    assert stager.download(["out/r.txt"]) == ["out/r.txt"]
    local = work / "out" / "r.txt"
    assert local.read_text() == "result"
    remote = {e.path: e for e in volume.listdir("proj", recursive=True)}
    assert int(os.stat(local).st_mtime) == remote["proj/out/r.txt"].mtime
    assert not list(work.rglob("*.modal-part"))
    assert stager.upload(["out/r.txt"]) == []  # not sent back
    with pytest.raises(WorkflowError, match="is not on the Modal volume"):
        stager.download(["out/none.txt"])
    assert stager.download(["out/none.txt"], missing_ok=True) == []


def _job(gpu=0, gpu_model=None, runtime=None, modal_gpu=None, budget=None):
    res = {"gpu": gpu}
    if gpu_model:
        res["gpu_model"] = gpu_model
    if modal_gpu:
        res["modal_gpu"] = modal_gpu
    if budget is not None:
        res["modal_max_cost_usd"] = budget
    if runtime is not None:
        res["runtime"] = runtime
    return types.SimpleNamespace(resources=res, threads=1, is_group=lambda: False)


def _group(jobs):
    return types.SimpleNamespace(jobs=jobs, is_group=lambda: True)


@pytest.mark.parametrize(
    ("jobs", "default", "expected"),
    [
        ([_job()], "A100", None),  # no GPU asked: a CPU container
        ([_job(gpu=1)], "A100-80GB", GpuRequest("A100-80GB", 1)),
        ([_job(gpu=1)], "H100:2", GpuRequest("H100", 2)),  # the default's count
        ([_job(gpu=2, gpu_model="l4")], "A100", GpuRequest("L4", 2)),
        ([_job(gpu=1), _job(gpu=1), _job()], "T4", GpuRequest("T4", 1)),  # group
        # a job's modal_gpu wins over gpu_model and --modal-gpu, implies one GPU,
        # keeps its count and fallback list
        ([_job(modal_gpu="h200")], "A100", GpuRequest("H200", 1)),
        ([_job(gpu=1, gpu_model="L4", modal_gpu="H100")], "T4", GpuRequest("H100")),
        ([_job(gpu=1, modal_gpu="H100:2")], None, GpuRequest("H100", 2)),
        ([_job(gpu=3, modal_gpu="H100:2")], None, GpuRequest("H100", 3)),
        (
            [_job(gpu=1, modal_gpu="A100-80GB,H100")],
            None,
            GpuRequest("A100-80GB", 1, ("H100",)),
        ),
    ],
)
def test_gpu_request_from_resources(jobs, default, expected):
    from snakemake_executor_plugin_modal import Executor, ExecutorSettings

    executor = types.SimpleNamespace(
        settings=ExecutorSettings(gpu=default),
        default_gpu=None if default is None else parse_gpu(default),
        get_jobname=lambda job: "job",
    )
    job = jobs[0] if len(jobs) == 1 else _group(jobs)
    assert Executor.gpu_request(executor, job) == expected


@pytest.mark.parametrize(
    ("setting", "jobs", "expected"),
    [
        (None, [_job()], None),
        (5.0, [_job()], (5.0, "--modal-max-cost-usd")),
        (None, [_job(budget="12.5")], (12.5, "resource modal_max_cost_usd")),
        (5.0, [_job(budget="12.5")], (5.0, "--modal-max-cost-usd")),  # the lower
        (
            20,
            [_job(budget=7), _job(budget="3.25")],
            (3.25, "resource modal_max_cost_usd"),
        ),
    ],
)
def test_budget_of_a_job(setting, jobs, expected):
    from snakemake_executor_plugin_modal import Executor, ExecutorSettings

    executor = types.SimpleNamespace(
        settings=ExecutorSettings(max_cost_usd=setting), get_jobname=lambda job: "j"
    )
    job = jobs[0] if len(jobs) == 1 else _group(jobs)
    assert Executor.budget(executor, job) == expected
    if expected is not None:  # the ledger refuses above that budget, naming it
        ledger = Ledger()
        h100 = ContainerRequest(GpuRequest("H100"), 1.0, 1024)  # 0.00111232 USD/s
        ledger.add(h100, expected[0] / 0.00111232 + 1)
        refusal = ledger.refusal(h100, 60.0, 0.0, expected)
        assert refusal.startswith(expected[1])
        # 60 + 120 s of it (0.2 USD) with nothing spent: within every budget here
        assert Ledger().refusal(h100, 60.0, 0.0, expected) is None


def test_budget_resource_errors():
    from snakemake_executor_plugin_modal import Executor, ExecutorSettings

    executor = types.SimpleNamespace(
        settings=ExecutorSettings(), get_jobname=lambda job: "j"
    )
    for bad in ("ten", "-1", "nan"):
        with pytest.raises(WorkflowError, match="modal_max_cost_usd=.*number >= 0"):
            Executor.budget(executor, _job(budget=bad))


def test_gpu_request_errors():
    from snakemake_executor_plugin_modal import Executor, ExecutorSettings

    executor = types.SimpleNamespace(
        settings=ExecutorSettings(gpu=None),
        default_gpu=None,
        get_jobname=lambda job: "job",
    )
    with pytest.raises(WorkflowError, match="no --modal-gpu is set"):
        Executor.gpu_request(executor, _job(gpu=1))
    group = _group([_job(gpu=1, gpu_model="A100"), _job(gpu=1, gpu_model="H100")])
    with pytest.raises(WorkflowError, match="request different GPUs"):
        Executor.gpu_request(executor, group)
    with pytest.raises(WorkflowError, match="resource 'modal_gpu'.*positive integer"):
        Executor.gpu_request(executor, _job(modal_gpu="H100:0"))


def test_runtime_resource_is_minutes():
    from snakemake_executor_plugin_modal.resources import runtime_seconds

    assert runtime_seconds(_job(runtime=2)) == 120.0
    assert runtime_seconds(_job()) is None


def test_files_named_by_the_config_are_shipped_tracked_or_not(tmp_path):
    from snakemake_executor_plugin_modal.jobspec import config_files

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "new-settings.yaml").write_text("a: 1")  # not in git
    (tmp_path / "data").mkdir()
    config = {
        "settings": "config/new-settings.yaml",
        "nested": [{"folder": "data"}, "not a path", 3],
        "outside": "../elsewhere.yaml",
    }
    assert config_files(config, tmp_path) == ["config/new-settings.yaml"]


def test_an_error_stopping_the_app_is_reported_not_raised():
    from snakemake_executor_plugin_modal.calls import RunApp

    class Run:
        def __exit__(self, *exc):
            raise OSError("connection reset")

    app, warnings = RunApp.__new__(RunApp), []
    app._run = Run()
    app.stop(warn=warnings.append)
    assert warnings == [
        "Modal: could not stop the app cleanly (OSError: connection reset)"
    ]
    app.stop(warn=warnings.append)  # idempotent
    assert len(warnings) == 1


def test_a_failed_upload_is_sent_again(modal_server, tmp_path, monkeypatch):
    """A batch upload that fails in the middle records nothing as sent: a retry in
    the same run (same stager) sends every file again.

    The failure is the installed client's own: its files' bytes were sent
    (``MountPutFile``), then the request that puts the batch on the volume
    (``VolumePutFiles``) met a connection reset on every attempt, which the client
    retries three times and then raises as ``modal.exception.ConnectionError``
    (modal 1.6.4, modal/_utils/grpc_utils.py, ``process_exception_before_retry``).
    """
    import modal.exception
    from modal._grpc_client import UnaryUnaryWrapper

    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("input")
    volume, folder = _volume(modal_server)
    stager = VolumeStager(volume, "proj", work)
    direct, attempts = UnaryUnaryWrapper.direct, []

    async def reset(self, req, *args, **kwargs):
        if self.name.endswith("/VolumePutFiles"):
            attempts.append(req)
            raise ConnectionResetError(104, "Connection reset by peer")
        return await direct(self, req, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(UnaryUnaryWrapper, "direct", reset)
        with pytest.raises(
            modal.exception.ConnectionError, match=r"\[Errno 104\] Connection reset"
        ):
            stager.upload(["in.txt"])
    assert len(attempts) == 4  # the first and three retries
    assert modal_server.state.calls_of("MountPutFile")  # the bytes had gone
    assert "in.txt" not in stager.manifest()
    assert stager.files() == {}
    assert stager.upload(["in.txt"]) == ["in.txt"]
    assert (folder / "proj" / "in.txt").read_text() == "input"
    assert VolumeStager(volume, "proj", work).upload(["in.txt"]) == []


def test_a_call_given_up_is_cancelled_and_its_cost_counted(monkeypatch):
    """After the grace period of unreadable status the call is cancelled (its
    container would go on billing and committing beside the retry's), and the
    seconds until then are what the ledger counts."""
    import modal.exception

    from snakemake_executor_plugin_modal import calls

    clock = iter([1000.0, 1000.0, 1700.0, 1700.0, 1700.0, 9999.0])
    # the fake clock for the plugin's module only: patched on the time module itself,
    # every thread of this process read it (modal's event loop, whose thread died of
    # the exhausted clock and failed the later tests of this process)
    fake_time = types.SimpleNamespace(**vars(time))
    fake_time.monotonic = lambda: next(clock)
    monkeypatch.setattr(calls, "time", fake_time)
    lost = modal.exception.ConnectionError("Deadline exceeded")
    handle = _Call(lost, lost)
    call = calls.ContainerCall(handle, GpuRequest("H100"), 3600, warn=print)
    assert call.poll() is None  # t=1000: unreachable since now
    outcome = call.poll()  # t=1700: 700 s > 600 s of grace
    assert outcome.given_up and "given up and cancelled" in outcome.message
    assert handle.cancels == [True] and call.cancelled
    ledger = Ledger()
    ledger.add(call.request, call.seconds)  # what the executor does with every outcome
    assert ledger.gpu_seconds == pytest.approx(700.0)
    # no request given: Modal's defaults, 0.125 cores and 128 MiB, beside the H100
    assert call.usd_per_second == pytest.approx(
        0.001097 + 0.125 * (0.0000131 + 0.00000222)
    )
    assert ledger.cost_usd == pytest.approx(700 * 0.001098915)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (
            lambda exc: exc.ImageBuildError("Image build for im-1 failed", "im-1"),
            "image could not be built .*modal image logs im-1",
        ),
        (lambda exc: exc.AuthError("Token missing"), "refused the credentials"),
        (
            lambda exc: exc.InvalidError("GPU type X9000 is not supported"),
            r"rejected the GPU request \(this run asks for X9000\)",
        ),
        (
            lambda exc: exc.InvalidError("Unsupported Python version: '3.9'."),
            "image builder does not offer this Python",
        ),
        (
            lambda exc: exc.ModuleNotMountable("mypkg has no spec"),
            "--modal-local-packages: .*ModuleNotMountable: mypkg has no spec",
        ),
        (lambda exc: exc.ConnectionError("Deadline"), "could not be reached"),
        (lambda exc: exc.NotFoundError("Environment x"), "app could not start"),
    ],
)
def test_errors_at_app_start_are_named(make, named):
    """What Modal 1.6 raises when the image is built or the app starts, each named
    for what it is (the real client's exception classes)."""
    import modal.exception as exc

    from snakemake_executor_plugin_modal.calls import start_error

    error = start_error(make(exc), ["X9000"])
    assert isinstance(error, WorkflowError)
    with pytest.raises(WorkflowError, match=named):
        raise error
    assert "nothing was submitted" in str(error)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("H100", None),
        ("a100-80gb,H100", None),
        ("H100!:2", None),
        ("B300", "GPU type 'B300' is not one the plugin knows"),
        ("A100-80GB,X1", "GPU type 'X1' is not one"),
        ("H100:0", "positive integer"),
    ],
)
def test_gpu_types_are_checked_before_the_build(spec, problem):
    from snakemake_executor_plugin_modal.preflight import gpu_problem

    found = gpu_problem(spec, "--modal-gpu")
    if problem is None:
        assert found is None
    else:
        assert found.startswith("--modal-gpu") and problem in found
        if "GPU type" in problem:
            assert "allowed: A10, A100, A100-40GB, A100-80GB, A10G, B200" in found


def test_settings_problems_name_every_refusal(monkeypatch):
    """Each refusal in one line; no credentials is the installed client's
    ``config.get`` finding no token in the environment and no ``.modal.toml``."""
    import modal.config

    from snakemake_executor_plugin_modal import ExecutorSettings
    from snakemake_executor_plugin_modal.preflight import (
        OAUTH_SETTINGS,
        requested_settings,
        settings_problems,
    )

    monkeypatch.setattr(modal.config, "_user_config", {})
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", *OAUTH_SETTINGS.values()):
        monkeypatch.delenv(name, raising=False)
    settings = ExecutorSettings(
        gpu="X9000", local_packages=["no_such_pkg_xyz"], volume="my runs"
    )
    assert requested_settings() is settings  # recorded when Snakemake makes them
    problems = settings_problems(settings)
    assert len(problems) == 4, problems
    assert problems[0].startswith("no Modal credentials")
    assert problems[1].startswith("--modal-volume 'my runs': Modal refuses this name")
    assert "--modal-gpu = 'X9000'" in problems[2]
    assert "'no_such_pkg_xyz' is not importable here" in problems[3]
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-1")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-1")
    assert settings_problems(ExecutorSettings(gpu="L4")) == []


def test_part_files_of_a_killed_container_are_removed_and_never_listed(
    modal_server, tmp_path
):
    """A container killed between copying an output to its part file and renaming it
    leaves ``.<name>.part-*`` on the volume (Modal commits in the background): the
    executor never lists it, and the job's next container deletes it first."""
    from snakemake_executor_plugin_modal.container import PART, remove_parts

    volume, folder = _volume(modal_server)
    committed = folder / "proj"  # the volume's committed files, as a container's
    (committed / "out").mkdir(parents=True)
    (committed / "out" / "a.txt").write_text("done")
    (committed / "out" / f".b.txt{PART}0a1b2c").write_text("half")
    stager = VolumeStager(volume, "proj", tmp_path / "work")
    assert sorted(stager.files()) == ["out/a.txt"]
    assert remove_parts(committed, ["out/a.txt"]) == []  # another file's: kept
    assert remove_parts(committed, ["out/b.txt"]) == [f"out/.b.txt{PART}0a1b2c"]
    assert sorted(p.name for p in (committed / "out").iterdir()) == ["a.txt"]


def test_the_logs_hint_names_the_app_id(tmp_path):
    """An ephemeral app has no name `modal app logs` can find: the hint gives its id."""
    from snakemake_executor_plugin_modal import Executor
    from snakemake_executor_plugin_modal.calls import Outcome, RunApp

    app = RunApp.__new__(RunApp)
    app.app = types.SimpleNamespace(name="snakemake-wf", app_id="ap-1a2b3c")
    executor = types.SimpleNamespace(workdir=tmp_path, app=app)
    job_info = types.SimpleNamespace(aux={"spec": {"log": ".snakemake/modal/j.log"}})
    text = Executor.log_report(executor, job_info, Outcome(False))
    assert "`modal app logs ap-1a2b3c`" in text


def test_a_last_sync_that_fails_is_tried_again_then_raised():
    """A job's last sync or commit that fails is said in one line and tried again
    after each wait; once the waits are spent, its error is raised (the job
    fails)."""
    from snakemake_executor_plugin_modal.container import retried

    tries, said, slept = [], [], []

    def commit():
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("conflict")
        return "committed"

    def say(line, flush=False):
        said.append(line)

    kw = {"waits": (1.0, 2.0, 4.0), "say": say, "sleep": slept.append}
    assert retried(commit, "the last commit", **kw) == "committed"
    assert len(tries) == 3 and slept == [1.0, 2.0]
    assert said == [
        "modal: the last commit failed (RuntimeError: conflict); trying again in 1 s",
        "modal: the last commit failed (RuntimeError: conflict); trying again in 2 s",
    ]
    tries.clear()
    with pytest.raises(RuntimeError, match="conflict"):
        retried(commit, "the last commit", **{**kw, "waits": (1.0,)})
    assert len(tries) == 2


def test_a_sync_that_fails_once_never_ends_the_later_syncs():
    """``Volume.commit`` refused once (a conflict, a transient error): one line, and
    the next periodic sync is made as planned (before: the syncing thread ended,
    and every image finished after it was lost to a later timeout or preemption)."""
    import threading

    from snakemake_executor_plugin_modal.container import sync_until

    done, calls, said = threading.Event(), [], []

    def sync():
        calls.append(len(calls))
        if len(calls) == 2:
            raise OSError("volume commit conflict")
        if len(calls) == 5:
            done.set()

    failed = sync_until(done, 0.001, sync, say=lambda line, **kw: said.append(line))
    assert failed == 1 and len(calls) == 5
    assert said == [
        "modal: a periodic sync of finished outputs failed (OSError: volume commit "
        "conflict); trying again in 0.001 s"
    ]


def test_part_files_are_found_with_one_listing_per_folder(tmp_path, monkeypatch):
    from snakemake_executor_plugin_modal import container
    from snakemake_executor_plugin_modal.container import PART, remove_parts

    folder = tmp_path / "runs" / "per_image"
    folder.mkdir(parents=True)
    outputs = [f"runs/per_image/img{i:04d}.pt" for i in range(50)]
    parts = [f".img0003.pt{PART}ab12", f".img0049.pt{PART}cd34"]
    kept = ["img0003.pt", f".img0100.pt{PART}ef56", f".img0003.ptx{PART}x"]
    for name in [*parts, *kept]:
        (folder / name).write_text("x")
    listed = []
    real = os.listdir
    monkeypatch.setattr(container.os, "listdir", lambda p: listed.append(p) or real(p))
    gone = remove_parts(tmp_path, [*outputs, "logs/missing/job.log"])
    assert listed == [folder, tmp_path / "logs" / "missing"]
    assert gone == sorted(f"runs/per_image/{p}" for p in parts)
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)


def test_markers_list_each_folder_once(tmp_path, monkeypatch):
    from snakemake_executor_plugin_modal import container
    from snakemake_executor_plugin_modal.container import DONE, Markers

    folder = tmp_path / DONE / "runs"
    folder.mkdir(parents=True)
    (folder / ("a.pt@" + "1" * 64)).write_text("old")  # another key: replaced
    (folder / ("z.pt@" + "2" * 64)).write_text("other")  # another output: kept
    listed = []
    real = os.listdir
    monkeypatch.setattr(container.os, "listdir", lambda p: listed.append(p) or real(p))
    markers = Markers(tmp_path)
    for name in ("a.pt", "b.pt", "c.pt"):
        markers.mark(f"runs/{name}", None)
        markers.mark(f"runs/{name}", "f" * 64)
    markers.mark("runs/b.pt", None)  # an output removed: its marker goes
    assert listed == [folder]  # (before iterdir below, which lists too)
    assert sorted(p.name for p in folder.iterdir()) == [
        "a.pt@" + "f" * 64,
        "c.pt@" + "f" * 64,
        "z.pt@" + "2" * 64,
    ]


def test_a_download_takes_each_path_and_folder_as_the_listing_has_them(tmp_path):
    """Files and whole folders, found in one sorted listing (linear in the paths,
    not paths x volume entries); a folder's name as a prefix of another's is not
    that folder."""
    from snakemake_executor_plugin_modal.staging import VolumeStager

    listing = [
        "runs/a/img0000.pt",
        "runs/a/img0001.pt",
        "runs/ab/img0000.pt",
        "runs/a.pt",
        "logs/x.log",
    ]
    stager = VolumeStager.__new__(VolumeStager)
    stager.prefix = "proj"
    stager.manifest = lambda: {}
    stager._lock = __import__("threading").Lock()
    stager.files = lambda folder="": {f: f for f in listing}
    fetched = []
    stager._fetch = lambda rel, entry: fetched.append(rel)
    got = stager.download(["runs/a", "logs/x.log", "runs/none"], missing_ok=True)
    assert got == ["logs/x.log", "runs/a/img0000.pt", "runs/a/img0001.pt"]
    assert sorted(fetched) == got
    with pytest.raises(WorkflowError, match="runs/none is not on the Modal volume"):
        stager.download(["runs/none"])
