"""The estimate of what is left: the model, measured seconds per image, the budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG, planned_jobs, run_snakemake

from multigeom_workflow.planning.cost import (
    CostEstimate,
    budget_problem,
    estimate_cost,
    gpu_matches,
    gpu_price,
    measured_seconds_per_image,
    modal_prices,
    monte_carlo_work,
    read_timings,
)


def test_known_case_of_the_old_helper():
    """4 configurations x 200 images, 10 workers, 30 s, 15 s start-up, A100-80GB."""
    e = estimate_cost(4 * 200, 10, 30.0, 15.0, gpu="A100-80GB")
    assert e.device_seconds == 24_150
    assert e.wall_seconds == 2_415
    assert round(e.cost_usd, 2) == 16.76


def test_nothing_left_costs_nothing():
    e = estimate_cost(0, 4, 30.0, 15.0, gpu="H100")
    assert (e.device_seconds, e.wall_seconds, e.cost_usd) == (0, 0, 0)
    assert budget_problem(e, 0.0) is None


def test_one_start_up_per_job_for_cold_jobs():
    e = estimate_cost(24, 2, 10.0, 5.0, startups=24)
    assert e.device_seconds == 24 * 10 + 24 * 5 and e.wall_seconds == 180


def test_prices_can_be_overridden_and_unknown_ones_refused():
    e = estimate_cost(10, 2, 100.0, 0.0, gpu="X1", prices={"X1": 0.01})
    assert e.cost_usd == pytest.approx(10.0)
    unknown = estimate_cost(10, 2, 100.0, 0.0, gpu="X2")
    assert unknown.cost_usd is None
    assert "price of Modal GPU 'X2' is unknown" in budget_problem(unknown, 100.0)


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ("A100-80GB", 0.000694),
        ("h100:2", 2 * 0.001097),  # two GPUs
        ("A100-80GB,H100", 0.001097),  # a fallback list: its dearest type
        ("L4:2,T4:2", 2 * 0.000222),
        ("X9000", None),
        ("A100-80GB,X9000", None),
        ("H100:0", None),
    ],
)
def test_gpu_price_as_the_plugins_guard(gpu, expected):
    """Modal's price page (July 2026): A100-80GB 0.000694, H100 0.001097, L4
    0.000222, T4 0.000164 USD/s."""
    from snakemake_executor_plugin_modal.prices import parse_gpu

    price = gpu_price(gpu, modal_prices())
    assert price == (None if expected is None else pytest.approx(expected))
    if expected is not None:  # the plugin's budget guard prices the same
        assert parse_gpu(gpu).usd_per_second == pytest.approx(expected)


def test_budget():
    e = estimate_cost(800, 10, 30.0, 15.0, gpu="A100-80GB")
    assert budget_problem(e, 20.0) is None
    line = budget_problem(e, 10.0)
    assert line == (
        "budget: the run is estimated at 16.76 USD (24,150 GPU-seconds on A100-80GB), "
        "above the limit modal.max_cost_usd = 10.00 USD"
    )


def test_monte_carlo_work_of_the_paper_and_the_demo():
    from multigeom.config import config_path

    paper = yaml.safe_load(config_path("estimator").read_text())
    demo = yaml.safe_load((REPO / "config/estimator_demo.yaml").read_text())
    assert monte_carlo_work(paper) == 24 * 200
    assert monte_carlo_work(demo) == 4 * 32


@pytest.mark.parametrize(
    "gpu, name, expected",
    [
        ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
        ("A100-40GB", "NVIDIA A100-SXM4-80GB", False),
        ("A10", "NVIDIA A100-SXM4-40GB", False),
        ("L4", "NVIDIA L40S", False),
        ("L4", "NVIDIA L4", True),
        ("H100", "NVIDIA H100 80GB HBM3", True),
    ],
)
def test_gpu_names(gpu, name, expected):
    assert gpu_matches(gpu, name) is expected


def per_image(path, seconds, device, name):
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = {"device": device, "device_name": name}
    torch.save({"elapsed_seconds": seconds, "provenance": prov}, path)
    return path


def test_measured_seconds_respect_the_device(tmp_path):
    files = [
        per_image(tmp_path / "a.pt", 10.0, "cpu", "x86_64"),
        per_image(tmp_path / "b.pt", 30.0, "cpu", "x86_64"),
        per_image(tmp_path / "c.pt", 14.0, "cpu", "x86_64"),
        per_image(tmp_path / "d.pt", 2.0, "cuda:0", "NVIDIA A100-SXM4-80GB"),
        per_image(tmp_path / "e.pt", 4.0, "cuda:1", "NVIDIA H100 80GB HBM3"),
        tmp_path / "missing.pt",
    ]
    torch.save({"elapsed_seconds": 99.0, "provenance": None}, tmp_path / "old.pt")
    files.append(tmp_path / "old.pt")  # no device recorded: not a measurement
    for t, f in enumerate(p for p in files if p.exists()):  # the order they were made
        os.utime(f, (1_000 + t, 1_000 + t))
    timings = read_timings(files)
    assert len(timings) == 5
    assert measured_seconds_per_image(timings, "cpu") == (14.0, 3)
    assert measured_seconds_per_image(timings, "cuda") == (3.0, 2)
    assert measured_seconds_per_image(timings, "cuda", "A100-80GB") == (2.0, 1)
    assert measured_seconds_per_image(timings, "cuda", "T4") is None
    assert read_timings([tmp_path / "missing.pt"]) == []
    # Only the newest two files are read: old.pt (no device) and e.pt.
    assert read_timings(files, limit=2) == [("cuda:1", "NVIDIA H100 80GB HBM3", 4.0)]


def test_estimate_is_a_dataclass_of_its_inputs():
    e = CostEstimate(5, 1, 2.0, "given", 1, 3.0, "given")
    assert (e.device_seconds, e.wall_seconds, e.cost_usd) == (13.0, 13.0, None)


def write_config(tmp_path, **changes):
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config.update(changes)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def estimate_block(result) -> list[str]:
    lines = result.stderr.splitlines()
    start = lines.index("Estimate of the per-image work left (multigeom-workflow):")
    block = []
    for line in lines[start + 1 :]:
        if not (line.startswith("  ") or line.startswith("warning:")):
            break
        block.append(line)
    return block


@pytest.mark.workflow
def test_the_estimate_counts_the_noise_ceilings_second_estimates(tmp_path):
    """
    Every per-image computation is counted: 4 configurations x 3 images, plus the
    second estimates of the first 2 images of each (the noise ceiling), 8 of them.
    """
    work = tmp_path / "work"
    work.mkdir()
    cfg = write_config(tmp_path, n_images=3, noise_ceiling_images=2)
    result = run_snakemake(work, "-n", configfile=cfg)
    assert estimate_block(result)[4:6] == [
        "  noise ceiling                 0 / 8 second estimates done",
        "  per-image computations left: 20",
    ]
    planned = planned_jobs(result)
    assert planned["estimate_image"] + planned["estimate_image_ceiling"] == 20


@pytest.mark.workflow
def test_dry_run_prints_the_estimate_before_the_jobs(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cfg = write_config(
        tmp_path,
        n_images=3,
        noise_ceiling_images=0,
        modal={"gpu": "H100", "max_cost_usd": 0.0},
    )
    result = run_snakemake(work, "-n", configfile=cfg)
    assert result.returncode == 0, result.stderr[-2000:]
    block = estimate_block(result)
    assert block[:5] == [
        "  onoff/complex                 0 / 3 images done",
        "  smallcnn/complex              0 / 3 images done",
        "  onoff/simple                  0 / 3 images done",
        "  smallcnn/simple               0 / 3 images done",
        "  per-image computations left: 12",
    ]
    # 2 timesteps x 4 samples = 8 of the paper's 4800: 885 s x 8 / 4800 = 1.475 s.
    assert block[5].startswith("  here (cpu): 2 worker(s) (--cores); 1.48 s per image")
    # Warm workers: one start-up per worker (2) and configuration (4).
    assert block[6] == (
        "    start-up 15 s x 8 (upstream's figure; warm workers: one per worker and "
        "configuration)"
    )
    assert block[7] == "    device-seconds 138; wall-clock 69 s"
    assert block[8].startswith(
        "  on Modal (H100, 0.001097 USD/s): 10 container(s); 0.05 s"
    )
    # 12 images in 10 shards (sizes 2, 2, 1 x 8 in configuration order): the second
    # shard holds the last image of onoff/complex and the first of smallcnn/complex,
    # so 11 (shard, configuration) start-ups.
    assert block[9] == (
        "    start-up 15 s x 11 (upstream's figure; one per shard and configuration, "
        "10 shard(s))"
    )
    # 12 x 0.05 + 11 x 15 = 165.6 GPU-seconds at 0.001097 USD/s = 0.18 USD
    assert block[10] == (
        "    GPU-seconds 166; wall-clock 17 s; cost 0.18 USD "
        "(limit modal.max_cost_usd = 0.00 USD)"
    )
    # Over budget: the dry run warns, and is not refused.
    assert block[11].startswith("warning: budget: the run is estimated at 0.18 USD")
    assert planned_jobs(result)["estimate_image"] == 12


def test_modal_estimate_counts_the_containers_the_shards_fill():
    """Fewer images left than containers: one container per shard, not 10 (nor one
    per computation): 2 images left, each with its noise ceiling's second estimate
    (4 computations), make 2 shards of one image, each with 2 computations."""
    from multigeom_workflow.planning.plan import modal_estimate
    from multigeom_workflow.scenario import validated_scenario

    s = validated_scenario(yaml.safe_load(TINY_CONFIG.read_text()), REPO)
    c = s.configurations[0]
    done = {(c.encoder, c.area): (0, 4)}
    pending = [((c.encoder, c.area), 0), ((c.encoder, c.area), 1)]
    est = modal_estimate(s, done, [], nodes=10, pending=pending)
    assert est.workers == 2
    assert est.startups == 2
    assert est.wall_seconds == pytest.approx(est.device_seconds / 2)


def test_existing_files_lists_folders_and_leaves_out_dangling_links(tmp_path):
    """Existing per-image files found by one listing per folder: a missing folder
    gives none, a dangling link (or a file gone meanwhile) is not a file."""
    from multigeom_workflow.planning.cost import existing_files, read_timings

    folder = tmp_path / "per_image" / "e" / "a"
    folder.mkdir(parents=True)
    real = folder / "img0000.pt"
    real.write_bytes(b"x")
    (folder / "img0001.pt").symlink_to(folder / "gone.pt")
    files = [real, folder / "img0001.pt", folder / "img0002.pt"]
    files.append(tmp_path / "per_image" / "e" / "b" / "img0000.pt")  # no folder
    assert existing_files(files) == [real]
    assert read_timings(files) == []  # `real` is not a per-image dict: no timing


def test_shards_at_once_under_the_budget_closed_form():
    """The Modal plugin's guard starts a shard when its worst case, price x (time
    limit + start-up), fits beside those running: 125-minute shards on A100-80GB
    (0.000694 USD/s) hold 0.000694 x 7,620 = 5.28828 USD each."""
    from multigeom_workflow.planning.plan import concurrency_line, shards_at_once

    n, worst = shards_at_once([125] * 10, 0.000694, 30.0)
    assert n == 5 and worst == pytest.approx([5.28828] * 10)
    assert shards_at_once([125] * 10, 0.000694, 52.9)[0] == 10
    assert shards_at_once([125] * 3, None, 0.0)[0] == 3  # unknown price: not held
    line = concurrency_line([125] * 10, 0.000694, 30.0)
    assert line.startswith(
        "warning: modal.max_cost_usd = 30.00 USD holds the worst case of 5 of the 10 "
        "shards at once"
    )
    assert "52.88 USD lets every shard start at once" in line
    assert concurrency_line([125] * 10, 0.000694, 60.0) is None


def test_the_paper_s_budget_starts_every_shard_at_once():
    """config/paper.yaml on Modal (10 shards, the modal profile's jobs): every
    shard's worst case fits in its budget at once, as the plugin's guard holds it:
    the dry run's count (`planning.plan.shards_at_once`) and the plugin's
    `Ledger.admit` agree."""
    from multigeom_workflow.planning.cost import gpu_price, modal_prices
    from multigeom_workflow.planning.plan import shards_at_once
    from multigeom_workflow.planning.slurm import modal_plan
    from multigeom_workflow.scenario.load import validated_scenario
    from multigeom_workflow.settings.load import load_config

    repo = Path(__file__).resolve().parents[1]
    files = [str(repo / "config" / "config.yaml"), str(repo / "config" / "paper.yaml")]
    scenario = validated_scenario(load_config(files, [], repo), repo, remote=True)
    plan = modal_plan(scenario, 10)
    price = gpu_price(scenario.modal["gpu"], modal_prices())
    n, worst = shards_at_once(plan.limits, price, scenario.modal["max_cost_usd"])
    assert len(plan.shards) == 10 and n == 10
    assert sum(worst) <= scenario.modal["max_cost_usd"] < 2 * sum(worst)
    # the plugin's own guard, given the shards in order, starts the same number: each
    # admitted with every earlier one's worst case held (calls.Ledger.admit)
    from snakemake_executor_plugin_modal.calls import Ledger
    from snakemake_executor_plugin_modal.prices import parse_gpu

    ledger = Ledger(max_cost_usd=scenario.modal["max_cost_usd"])
    gpu = parse_gpu(scenario.modal["gpu"])
    held, started = 0.0, 0
    for minutes in plan.limits:
        admission = ledger.admit(gpu, 60 * minutes, reserved_usd=held, running=started)
        if admission.verdict != "start":
            break
        held += ledger.worst_case(gpu, admission.timeout_s)
        started += 1
    assert started == n
    assert held == pytest.approx(sum(worst))


@pytest.mark.parametrize("executor", ["modal", "local"])
def test_a_dry_run_reads_the_timings_once(monkeypatch, executor):
    """The dry run's estimate, the Modal budget before the plan and the shards of
    Snakemake's plan on Modal all read the run's timings, from one reading
    (`Run.timings`); the lines are those of a reading each."""
    from types import SimpleNamespace

    from multigeom_workflow.on_snakemake import estimate
    from multigeom_workflow.on_snakemake.run import Run
    from multigeom_workflow.planning import cost
    from multigeom_workflow.scenario.load import validated_scenario
    from multigeom_workflow.settings.load import load_config
    from multigeom_workflow.snakemake_adapter import GivenResources

    files = [str(REPO / "config" / "config.yaml"), str(REPO / "config" / "paper.yaml")]
    scenario = validated_scenario(load_config(files, [], REPO), REPO, remote=True)
    # 12 s per image measured on this GPU, whatever the files
    measured = [("cuda", "NVIDIA A100-SXM4-80GB", 12.0)] * 8
    reads = []
    monkeypatch.setattr(
        cost, "read_timings", lambda *a, **k: reads.append(1) or measured
    )

    def new_run():
        facts = SimpleNamespace(cores=2, nodes=10, dryrun=True)
        return Run(
            scenario=scenario, executor=executor, facts=facts, given=GivenResources()
        )

    planned = scenario.computations()[:40]
    run = new_run()
    estimate.modal_estimate_now(run)
    once = estimate.estimate_text(None, run, planned)
    assert len(reads) == 1
    assert "12 s per image" in "\n".join(once), once
    # a reading each (a fresh Run each time): the same lines
    assert estimate.estimate_text(None, new_run(), planned) == once
    assert len(reads) == 2


@pytest.mark.parametrize(
    ("images_left", "startups", "expected"),
    [
        (24_000, 10, None),  # 48,030 entries: under 50,000
        (25_000, 10, "warn"),  # 50,030
        (249_000, 10, "warn"),  # 498,030
        (250_000, 10, "refuse"),  # 500,030: at least the 500,000 inodes
    ],
)
def test_the_volume_entries_a_run_may_leave_are_warned_of_and_refused(
    images_left, startups, expected
):
    """Each per-image file and its reuse marker (2 per image) and a shard's log,
    container log and benchmark (3 per shard) against Modal's 50,000 files and
    500,000 inodes (the plugin's volume_limits, Modal's guide 'Volumes')."""
    from multigeom_workflow.on_modal.preflight import volume_entries, volume_problem

    e = CostEstimate(images_left, 1, 2.0, "given", startups, 3.0, "given")
    assert volume_entries(e) == 2 * images_left + 3 * startups
    said = volume_problem(e)
    assert (said and said[0]) == expected
    if said:
        assert f"{2 * images_left + 3 * startups:,} entries" in said[1]
        assert "https://modal.com/docs/guide/volumes" in said[1]
