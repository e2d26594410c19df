"""Unit tests: GPU specifications and prices, pinned requirements, the cost ledger,
staging through the volume, and the container's reading of Snakemake's markers."""

from __future__ import annotations

import math
import os
import types
from pathlib import Path

import pytest
import snakemake
from snakemake.persistence.file import FilePersistence
from snakemake_executor_plugin_modal.calls import Ledger
from snakemake_executor_plugin_modal.container import _incomplete
from snakemake_executor_plugin_modal.image import pinned_requirements
from snakemake_executor_plugin_modal.prices import GpuRequest, parse_gpu
from snakemake_executor_plugin_modal.staging import VolumeStager, relative_to_workdir
from snakemake_interface_common.exceptions import WorkflowError


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


def test_ledger_known_case_and_refusal():
    ledger = Ledger(max_cost_usd=1.0)
    ledger.add(GpuRequest("H100", 2), 300.0)  # 600 GPU-s x 0.001097 = 0.6582 USD
    assert ledger.gpu_seconds == 600.0
    assert ledger.cost_usd == pytest.approx(0.6582)
    # next job: unknown runtime -> mean of finished calls (300 s) -> 0.6582 more
    assert "not submitting" in ledger.refusal(GpuRequest("H100", 2), None)
    assert ledger.refusal(GpuRequest("T4"), 60.0) is None  # 0.00984 USD fits
    assert ledger.refusal(None, 1e9) is None  # CPU containers are not priced
    assert "1 container(s), 600 GPU-seconds, 0.66 USD" in ledger.summary()


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


def test_upload_sends_only_missing_or_changed_files(fake_modal, tmp_path):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "a.txt").write_text("a")
    (work / "data" / "b.txt").write_text("b")
    volume = fake_modal.Volume.from_name("units", create_if_missing=True)
    stager = VolumeStager(volume, "proj", work)
    assert stager.upload(["data"]) == ["data/a.txt", "data/b.txt"]
    assert stager.upload(["data/a.txt", "data"]) == []
    # a new stager lists the volume: still nothing to send
    assert VolumeStager(volume, "proj", work).upload(["data"]) == []
    (work / "data" / "b.txt").write_text("bb")  # changed size
    assert VolumeStager(volume, "proj", work).upload(["data"]) == ["data/b.txt"]
    committed = tmp_path / "fake-modal" / "volumes" / "units" / "proj" / "data"
    assert (committed / "b.txt").read_text() == "bb"
    with pytest.raises(WorkflowError, match="does not exist locally"):
        stager.upload(["missing.txt"])


def test_download_is_atomic_and_keeps_the_volume_time(fake_modal, tmp_path):
    work = tmp_path / "work"
    src = tmp_path / "src"
    (src / "out").mkdir(parents=True)
    (src / "out" / "r.txt").write_text("result")
    volume = fake_modal.Volume.from_name("units", create_if_missing=True)
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


def _job(gpu=0, gpu_model=None, runtime=None):
    res = {"gpu": gpu}
    if gpu_model:
        res["gpu_model"] = gpu_model
    if runtime is not None:
        res["runtime"] = runtime
    return types.SimpleNamespace(resources=res, threads=1)


@pytest.mark.parametrize(
    ("jobs", "default", "expected"),
    [
        ([_job()], "A100", None),  # no GPU asked: a CPU container
        ([_job(gpu=1)], "A100-80GB", GpuRequest("A100-80GB", 1)),
        ([_job(gpu=1)], "H100:2", GpuRequest("H100", 2)),  # the default's count
        ([_job(gpu=2, gpu_model="l4")], "A100", GpuRequest("L4", 2)),
        ([_job(gpu=1), _job(gpu=1), _job()], "T4", GpuRequest("T4", 1)),  # group
    ],
)
def test_gpu_request_from_resources(jobs, default, expected):
    from snakemake_executor_plugin_modal import Executor, ExecutorSettings

    executor = types.SimpleNamespace(
        settings=ExecutorSettings(gpu=default), get_jobname=lambda job: "job"
    )
    job = jobs[0] if len(jobs) == 1 else types.SimpleNamespace(jobs=jobs)
    assert Executor.gpu_request(executor, job) == expected


def test_gpu_request_errors():
    from snakemake_executor_plugin_modal import Executor, ExecutorSettings

    executor = types.SimpleNamespace(
        settings=ExecutorSettings(gpu=None), get_jobname=lambda job: "job"
    )
    with pytest.raises(WorkflowError, match="no --modal-gpu is set"):
        Executor.gpu_request(executor, _job(gpu=1))
    group = types.SimpleNamespace(
        jobs=[_job(gpu=1, gpu_model="A100"), _job(gpu=1, gpu_model="H100")]
    )
    with pytest.raises(WorkflowError, match="different 'gpu_model' resources"):
        Executor.gpu_request(executor, group)


def test_runtime_resource_is_minutes():
    from snakemake_executor_plugin_modal import _runtime_seconds

    assert _runtime_seconds(_job(runtime=2)) == 120.0
    assert _runtime_seconds(_job()) is None
