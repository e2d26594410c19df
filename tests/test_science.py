"""The figure's references: noise ceiling, ground truth, poor-encoder warning."""

from __future__ import annotations

import hashlib
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import CONFIGURATIONS, REPO, TINY_CONFIG, planned_jobs, run_snakemake

from multigeom_workflow.compute.estimate import load_models
from multigeom_workflow.inputs.demo.data import (
    cut_training_crops,
    load_teacher,
    simulate_area,
)
from multigeom_workflow.inputs.demo.diagnostics import (
    conditioning_sensitivity,
    encoder_warnings,
    write_conditioning_reports,
)
from multigeom_workflow.inputs.demo.truth import area_fisher, write_area_fisher
from multigeom_workflow.inputs.images import load_test_image
from multigeom_workflow.results.science import (
    against_ceiling,
    noise_ceiling,
    truth_alignment,
)
from multigeom_workflow.scenario import ConfigError, validated_scenario
from multigeom_workflow.settings.seeds import (
    CEILING_SEED_OFFSET,
    ceiling_estimator,
    configuration_seed,
)

P, K = 4096, 6


def _rotated_basis(theta: float) -> torch.Tensor:
    """Rows e_0..e_{K-1} of R^P, the first turned by `theta` towards e_K."""
    v = torch.zeros(K, P)
    v[torch.arange(K), torch.arange(K)] = 1.0
    v[0, 0], v[0, K] = math.cos(theta), math.sin(theta)
    return v


def _per_image(path, index: int, g: torch.Tensor, j: torch.Tensor) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    values = torch.arange(K, 0, -1, dtype=torch.float32)
    torch.save(
        {
            "img_idx": index,
            "G_eigenvalues": values,
            "G_eigenvectors": g,
            "J_eigenvalues": values,
            "J_eigenvectors": j,
        },
        path,
    )
    return str(path)


def test_noise_ceiling_of_two_seeds_has_its_closed_form(tmp_path):
    # Two images of one configuration; the second estimate of image i has its first
    # G eigenvector turned by theta_i: A_k = (cos^2 theta_i + k - 1) / k, and J equal.
    thetas = {0: 0.3, 1: 1.1}
    first, second = [], []
    for i, theta in thetas.items():
        base = _rotated_basis(0.0)
        first.append(_per_image(tmp_path / f"a/enc/ar/img{i:04d}.pt", i, base, base))
        second.append(
            _per_image(
                tmp_path / f"b/enc/ar/img{i:04d}.pt", i, _rotated_basis(theta), base
            )
        )
    out = tmp_path / "ceiling.json"
    result = noise_ceiling(first, second, K, out)
    assert json.loads(out.read_text()) == result
    curves = result["configurations"]["enc/ar"]
    k = np.arange(1, K + 1)
    per_image = np.array([(math.cos(t) ** 2 + k - 1) / k for t in thetas.values()])
    assert curves["G"]["n_images"] == 2
    np.testing.assert_allclose(curves["G"]["alignment_mean"], per_image.mean(0))
    np.testing.assert_allclose(
        curves["G"]["alignment_sem"], per_image.std(0, ddof=1) / math.sqrt(2)
    )
    np.testing.assert_allclose(curves["J"]["alignment_mean"], np.ones(K))


def test_ceiling_estimator_only_moves_the_seed():
    estimator = {"seed": 42, "top_k": 5, "monte_carlo": {"n_samples": 4}}
    assert ceiling_estimator(estimator) == {**estimator, "seed": 42 + 10**6}
    assert CEILING_SEED_OFFSET == 10**6


def test_truth_alignment_pairs_configurations_with_their_area(tmp_path):
    truth_vecs = _rotated_basis(0.0)
    truth = tmp_path / "ground_truth/simple/img0000.pt"
    truth.parent.mkdir(parents=True)
    torch.save(
        {"J_eigenvalues": torch.ones(K), "J_eigenvectors": truth_vecs}, str(truth)
    )
    theta = 0.7
    files = [
        _per_image(
            tmp_path / "per_image/enc/simple/img0000.pt",
            0,
            _rotated_basis(theta),
            truth_vecs,
        ),
        _per_image(  # an area without truth is left out
            tmp_path / "per_image/enc/V1/img0000.pt", 0, truth_vecs, truth_vecs
        ),
    ]
    result = truth_alignment(files, [truth], K)
    assert list(result["configurations"]) == ["enc/simple"]
    curves = result["configurations"]["enc/simple"]
    k = np.arange(1, K + 1)
    np.testing.assert_allclose(
        curves["G"]["alignment_mean"], (math.cos(theta) ** 2 + k - 1) / k
    )
    np.testing.assert_allclose(curves["J"]["alignment_mean"], np.ones(K))


def test_area_fisher_matches_finite_differences():
    # J_area = sigma^-2 J_f^T J_f with J_f by central differences of the GaborTeacher
    # (in float64), against upstream's autograd eigendecomposition.
    crops = cut_training_crops(40, seed=3)
    area = simulate_area("complex", crops, seed=0, noise_sigma=0.22)
    image = crops[:1]
    truth = area_fisher(area, image, top_k=10)
    teacher = load_teacher(area).double()
    x = image.double().flatten()
    h = 1e-4
    jac = torch.empty(50, P, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, P, 512):
            idx = torch.arange(start, start + 512)
            step = torch.zeros(512, P, dtype=torch.float64)
            step[torch.arange(512), idx] = h
            plus = teacher((x + step).view(-1, 1, 64, 64))
            minus = teacher((x - step).view(-1, 1, 64, 64))
            jac[:, idx] = ((plus - minus) / (2 * h)).T
    fisher = jac.T @ jac / 0.22**2
    values, vectors = torch.linalg.eigh(fisher)
    values, vectors = values.flip(0)[:10], vectors.flip(1)[:, :10].T
    np.testing.assert_allclose(truth["J_eigenvalues"], values, rtol=1e-3)
    overlap = truth["J_eigenvectors"].double() @ vectors.T
    assert float((overlap**2).sum()) / 10 > 0.999
    assert truth["J_eigenvectors"].shape == (10, P)
    assert truth["sigma"] == 0.22


def test_an_areas_truth_files_are_each_images_own(tmp_path):
    # rule area_fisher: one process writes every image's file of an area; each is
    # area_fisher of that image alone, whichever images share the process
    from PIL import Image

    crops = cut_training_crops(40, seed=3)
    area = simulate_area("simple", crops, seed=0, noise_sigma=0.22)
    torch.save(area, tmp_path / "area.pt")
    images = []
    for i in range(3):
        pixels = ((crops[i, 0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        images.append(tmp_path / f"img{i}.png")
        Image.fromarray(pixels.numpy()).save(images[-1])
    outs = [tmp_path / f"truth{i}.pt" for i in range(3)]
    write_area_fisher(tmp_path / "area.pt", images, outs, top_k=4)
    last = tmp_path / "last.pt"
    write_area_fisher(tmp_path / "area.pt", images[2:], [last], top_k=4)
    for i, out in enumerate(outs):
        got = torch.load(out, weights_only=False)
        alone = area_fisher(area, load_test_image(images[i]).unsqueeze(0), top_k=4)
        assert got["img_idx"] == i and got["area"] == "simple"
        assert torch.equal(got["J_eigenvalues"], alone["J_eigenvalues"])
        assert torch.equal(got["J_eigenvectors"], alone["J_eigenvectors"])
    assert torch.equal(
        torch.load(last, weights_only=False)["J_eigenvectors"],
        torch.load(outs[2], weights_only=False)["J_eigenvectors"],
    )
    assert not list(tmp_path.glob(".*"))  # no temporary file left
    with pytest.raises(ValueError, match="3 test images but 2 ground-truth files"):
        write_area_fisher(tmp_path / "area.pt", images, outs[:2], top_k=4)


def test_conditioning_reports_of_one_job_are_each_configurations_own(
    tiny_run, tmp_path
):
    # rule check_conditioning: every configuration's report in one process; the same
    # reports in the reverse order, and the run's own, agree to the bit
    diffusion = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
    runs = tiny_run / "runs"
    configs = list(reversed(CONFIGURATIONS))
    outs = [tmp_path / f"{e}-{a}.json" for e, a in configs]
    made = json.loads((runs / "diffusion/onoff/complex/conditioning.json").read_text())
    results = write_conditioning_reports(
        configs,
        [runs / f"encoders/{e}/{a}/best_model.pt" for e, a in configs],
        [runs / f"diffusion/{e}/{a}/final_model.pt" for e, a in configs],
        outs,
        torch.load(runs / "demo/train_crops.pt")[-16:],
        diffusion,
        made["timesteps"],
        0.22,
        load_models=load_models,
    )
    assert [(r["encoder"], r["area"]) for r in results] == configs
    for (e, a), out in zip(configs, outs, strict=True):
        run = json.loads((runs / f"diffusion/{e}/{a}/conditioning.json").read_text())
        assert json.loads(out.read_text()) == run
    with pytest.raises(ValueError, match="4 configurations, 4 encoders, 4 diffusion"):
        write_conditioning_reports(
            configs, outs, outs, outs[:3], None, {}, [], 0.2, load_models=load_models
        )


def test_the_truth_is_one_job_per_area_and_the_checks_one_job(tiny_copy):
    # a ground-truth file is an intermediate: it is made again once its figure is
    # missing too, by the one job of its area (both images), not of the other area
    for path in (
        "runs/ground_truth/simple/img0001.pt",
        "runs/metrics/ground_truth.json",
        "results/ground_truth.png",
        "runs/diffusion/onoff/simple/conditioning.json",
    ):
        (tiny_copy / path).unlink()
    result = run_snakemake(tiny_copy, "-n")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = planned_jobs(result)
    assert jobs.get("area_fisher") == 1 and jobs.get("check_conditioning") == 1
    assert (
        "output: runs/ground_truth/simple/img0000.pt, "
        "runs/ground_truth/simple/img0001.pt\n" in result.stdout + result.stderr
    )


def test_encoder_warning_names_figure_threshold_and_value():
    bad = {"val_corr_clean": 0.17, "response_std": 0.002, "noise_sigma": 0.22}
    (line,) = encoder_warnings("onoff/complex", bad, 0.5, "results/fig4de.png")
    assert line.startswith("warning: encoder onoff/complex: ")
    assert "correlation 0.170" in line and "< 0.5 (demo.min_val_corr)" in line
    assert "response std 0.002" in line and "< sigma = 0.22" in line
    assert "results/fig4de.png" in line and "\n" not in line
    good = {"val_corr_clean": 0.7, "response_std": 0.6, "noise_sigma": 0.22}
    assert encoder_warnings("smallcnn/complex", good, 0.5, "f") == []
    low_scale = {**good, "response_std": 0.1}
    (line,) = encoder_warnings("smallcnn/complex", low_scale, 0.5, "f")
    assert "correlation" not in line and "response std 0.100" in line


def test_conditioning_sensitivity_is_zero_for_a_model_that_ignores_r():
    class Unet(torch.nn.Module):
        def __init__(self, gain):
            super().__init__()
            self.gain = gain

        def forward(self, x_t, t, r):
            return x_t + self.gain * r.mean(dim=1).view(-1, 1, 1, 1)

    encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(P, 3))
    images = torch.rand(4, 1, 64, 64) * 2 - 1
    schedule = torch.linspace(0.99, 0.01, 1000)
    blind = conditioning_sensitivity(
        encoder, Unet(0.0), schedule, images, [100, 600], 0.22
    )
    assert blind["pair"] == [0.0, 0.0] and blind["other_image_mean"] == 0.0
    seeing = conditioning_sensitivity(
        encoder, Unet(5.0), schedule, images, [100, 600], 0.22
    )
    assert seeing["pair_mean"] > 0.01 and seeing["timesteps"] == [100, 600]


def test_reduced_demo_draws_ceiling_and_truth(tiny_run):
    ceiling = json.loads((tiny_run / "runs/metrics/noise_ceiling.json").read_text())
    labels = sorted(f"{e}/{a}" for e, a in CONFIGURATIONS)
    assert sorted(ceiling["configurations"]) == labels
    for curves in ceiling["configurations"].values():
        assert curves["G"]["n_images"] == 1
        # J has no Monte-Carlo part: both estimates agree (near-degenerate pairs may
        # turn within their span, so the subspace of all top_k is compared).
        assert curves["J"]["alignment_mean"][-1] == pytest.approx(1.0, abs=1e-4)
    truth = json.loads((tiny_run / "runs/metrics/ground_truth.json").read_text())
    assert sorted(truth["configurations"]) == labels
    for name in ("ground_truth.png", "ground_truth.pdf"):
        assert (tiny_run / "results" / name).stat().st_size > 1000
    for enc, area in CONFIGURATIONS:
        report = tiny_run / f"runs/diffusion/{enc}/{area}/conditioning.json"
        assert set(json.loads(report.read_text())) >= {"pair_mean", "timesteps"}


def test_more_ceiling_images_recompute_no_first_estimate(tiny_copy):
    result = run_snakemake(tiny_copy, "-n", "--config", "noise_ceiling_images=2")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = planned_jobs(result)
    assert jobs.get("estimate_image_ceiling") == 4
    assert "estimate_image" not in jobs


def test_run_start_warns_once_per_poor_encoder(tiny_copy):
    # The reduced demo's onoff encoders cannot predict Gabor cells (and its smallcnn
    # ones are fitted on 58 crops): a warning line each, before the plan.
    result = run_snakemake(tiny_copy, "-n")
    lines = [
        line for line in result.stderr.splitlines() if line.startswith("warning: enc")
    ]
    assert len(lines) == len(CONFIGURATIONS)
    assert any("onoff/complex" in line for line in lines)
    assert all("(demo.min_val_corr)" in line or "sigma" in line for line in lines)


def test_too_many_ceiling_images_is_one_line(tiny_copy):
    result = run_snakemake(tiny_copy, "-n", "--config", "noise_ceiling_images=3")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "config error: config key 'noise_ceiling_images' = 3: the ceiling compares "
        "images of the run; allowed: 0 to n_images (2)"
    )


# --- config key monte_carlo_seeds ---


def _own_seed(encoder: str, area: str, seed: int = 42) -> int:
    """The documented formula: seed + 2**16 (1 + H), H = SHA-256 of it mod 65535."""
    h = int(hashlib.sha256(f"{seed}/{encoder}/{area}".encode()).hexdigest(), 16)
    return seed + 2**16 * (1 + h % 65535)


def _direct_g(run, encoder, area, index, seed):
    """G eigenvalues of test image `index`, estimated here with the draws of `seed`."""
    from multigeom_workflow.compute.engine import estimate_image_fast
    from multigeom_workflow.compute.estimate import load_models
    from multigeom_workflow.inputs.images import load_test_image
    from multigeom_workflow.settings.files import to_namespace

    torch.set_num_threads(1)
    scenario = validated_scenario(yaml.safe_load(TINY_CONFIG.read_text()), REPO)
    models = load_models(
        run / f"runs/encoders/{encoder}/{area}/best_model.pt",
        run / f"runs/diffusion/{encoder}/{area}/final_model.pt",
        scenario.diffusion,
        "cpu",
    )
    x = load_test_image(run / f"runs/demo/test_images/img{index:04d}.png")
    g, _ = estimate_image_fast(
        x.unsqueeze(0),
        models.encoder,
        models.unet,
        models.alphas_cumprod,
        to_namespace(scenario.estimator),
        seed=seed,
        device=torch.device("cpu"),
    )
    return g.eigenvalues


def test_per_image_files_are_drawn_from_the_seeds_of_their_mode(tiny_copy):
    from multigeom_workflow.results.verify import Expected, check_per_image_file

    pair = [("smallcnn", "complex"), ("smallcnn", "simple")]

    def load(enc, area):
        path = tiny_copy / f"runs/per_image/{enc}/{area}/img0001.pt"
        return torch.load(path, weights_only=False)

    # shared (the reduced demo, as the paper): image 1 of every configuration from 43
    for enc, area in pair:
        assert load(enc, area)["provenance"]["seed"] == 42
    np.testing.assert_allclose(
        load(*pair[0])["G_eigenvalues"],
        _direct_g(tiny_copy, *pair[0], 1, 43),
        rtol=1e-5,
    )
    # per_configuration: the same files recomputed, each from its own seed + 1
    targets = [f"runs/per_image/{e}/{a}/img0001.pt" for e, a in pair]
    result = run_snakemake(  # (targets after an option of one value)
        tiny_copy,
        *("--config", "monte_carlo_seeds=per_configuration", "--latency-wait", "5"),
        *targets,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seeds = [load(e, a)["provenance"]["seed"] for e, a in pair]
    assert seeds == [_own_seed(e, a) for e, a in pair]
    assert seeds[0] != seeds[1]
    assert seeds[0] == configuration_seed(42, *pair[0], "per_configuration")
    g = load(*pair[0])["G_eigenvalues"]
    np.testing.assert_allclose(
        g, _direct_g(tiny_copy, *pair[0], 1, seeds[0] + 1), rtol=1e-5
    )
    assert not np.allclose(g, _direct_g(tiny_copy, *pair[0], 1, 43), rtol=1e-3)
    # the per-image check agrees with the mode it is given
    path = tiny_copy / f"runs/per_image/{pair[0][0]}/{pair[0][1]}/img0001.pt"
    common = {"top_k": 5, "seed": 42, "sigma": 0.22}
    own = Expected(**common, monte_carlo_seeds="per_configuration")
    assert (
        check_per_image_file(
            path, encoder=pair[0][0], area=pair[0][1], index=1, expected=own
        )
        is None
    )
    assert (
        check_per_image_file(
            path,
            encoder=pair[0][0],
            area=pair[0][1],
            index=1,
            expected=Expected(**common),
        )
        == f"was made with seed {seeds[0]}, the run's is 42"
    )


def _tiny_config(**changes) -> dict:
    return {**yaml.safe_load(TINY_CONFIG.read_text()), **changes}


def test_monte_carlo_seeds_bad_value_is_one_line():
    with pytest.raises(ConfigError) as err:
        validated_scenario(_tiny_config(monte_carlo_seeds="random"), REPO)
    assert str(err.value) == (
        "config key 'monte_carlo_seeds' = 'random': not allowed; allowed: shared, "
        "per_configuration"
    )


def test_seed_ranges_stay_apart_modulo_2_32_and_within_torchs_bound():
    from multigeom_workflow.settings.checks import check_seed
    from multigeom_workflow.settings.names import MAX_SEED

    # torch's CPU generator reads a seed's low 32 bits: 43 and 2**32 + 43 draw alike
    draws = [
        torch.randn(3, generator=torch.Generator().manual_seed(s))
        for s in (43, 43 + 2**32)
    ]
    assert torch.equal(*draws)
    configs = [SimpleNamespace(encoder=e, area=a) for e, a in CONFIGURATIONS]
    per = "per_configuration"
    top = MAX_SEED - 2**32  # a seed whose configurations' seeds all fit
    check_seed(top, 2, 1, configs, per)
    with pytest.raises(ConfigError, match=r"'seed' = \d+: image i of a configuration"):
        check_seed(MAX_SEED - 2**16, 2, 1, configs, per)  # offsets >= 2**16
    # shared: the noise ceiling's seeds (seed + 10**6 + i) must not reach seed + i
    check_seed(42, CEILING_SEED_OFFSET, 1, configs, "shared")
    with pytest.raises(ConfigError) as err:
        check_seed(42, CEILING_SEED_OFFSET + 1, 1, configs, "shared")
    assert str(err.value) == (
        "config key 'seed' = 42: with monte_carlo_seeds 'shared', the seeds of every "
        "configuration (42 to 1000042) and of noise ceiling (1000042 to 1000042) draw "
        "the same numbers (torch's CPU generator reads a seed's low 32 bits), so their "
        "Monte-Carlo draws would not be independent; allowed: n_images at most 1000000 "
        "(the noise ceiling's seeds start at seed + 1000000)"
    )
    # per_configuration: a configuration whose seeds reach the ceiling's is refused
    # (1 + H = 15: seeds from seed + 983040, n_images up to seed + 1000000), and
    # another seed parts them
    seed = next(s for s in range(10**6) if (_own_seed("e", "a", s) - s) // 2**16 == 15)
    one = [SimpleNamespace(encoder="e", area="a")]
    n = CEILING_SEED_OFFSET - 15 * 2**16 + 1
    with pytest.raises(ConfigError, match="e/a .* and of noise ceiling .*another seed"):
        check_seed(seed, n, 1, one, per)
    check_seed(seed, n - 1, 1, one, per)
    check_seed(seed + 1, n, 1, one, per)


def _curve(mean: float, sem: float, n: int = 12) -> dict:
    return {
        "k": list(range(1, n + 1)),
        "alignment_mean": [mean] * n,
        "alignment_sem": [sem] * n,
    }


def _pair(metric, a, b, mean, sem):
    enc_a, area_a = a.split("/")
    enc_b, area_b = b.split("/")
    return {
        "metric": metric,
        "config_A": {"encoder": enc_a, "area": area_a},
        "config_B": {"encoder": enc_b, "area": area_b},
        **_curve(mean, sem),
    }


def test_a_pair_is_read_against_the_lower_ceiling_of_its_configurations():
    """
    z = (ceiling - A) / sqrt(sem_A^2 + sem_ceiling^2) by hand: cross-area G of widecnn
    against widecnn/complex's 0.40 ± 0.02 (the lower of 0.40 and 0.55), J against 1;
    a pair differing in both, and a G pair with a configuration without a ceiling,
    are left out.
    """
    ceiling = {
        "configurations": {
            "widecnn/complex": {"G": _curve(0.40, 0.02)},
            "widecnn/simple": {"G": _curve(0.55, 0.01)},
            "smallcnn/simple": {"G": _curve(0.50, 0.03)},
        }
    }
    metrics = {
        "pairs": {
            "1": _pair("G", "widecnn/complex", "widecnn/simple", 0.30, 0.01),
            "2": _pair("J", "widecnn/complex", "widecnn/simple", 0.20, 0.05),
            "3": _pair("G", "smallcnn/simple", "widecnn/complex", 0.10, 0.01),
            "4": _pair("G", "smallcnn/complex", "widecnn/complex", 0.30, 0.01),
            "5": _pair("G", "smallcnn/simple", "widecnn/simple", 0.49, 0.0),
        }
    }
    rows = against_ceiling(metrics, ceiling, k=10)
    assert [(r["metric"], r["kind"], r["pair"]) for r in rows] == [
        ("G", "cross-area", "widecnn/complex vs widecnn/simple"),
        ("G", "cross-model", "smallcnn/simple vs widecnn/simple"),
        ("J", "cross-area", "widecnn/complex vs widecnn/simple"),
    ]
    g_area, g_model, j_area = rows
    assert g_area["ceiling"] == 0.40 and g_area["ceiling_sem"] == 0.02
    assert g_area["z"] == pytest.approx(0.10 / math.sqrt(0.01**2 + 0.02**2))
    assert g_area["fraction"] == pytest.approx(0.75)
    # smallcnn/simple's 0.50 ± 0.03 is the lower: z = 0.01 / 0.03
    assert g_model["ceiling"] == 0.50
    assert g_model["z"] == pytest.approx(1 / 3)
    assert j_area["ceiling"] == 1.0 and j_area["z"] == pytest.approx(0.80 / 0.05)
    # k beyond the curves reads their last k
    assert against_ceiling(metrics, ceiling, k=50)[0]["z"] == pytest.approx(g_area["z"])
