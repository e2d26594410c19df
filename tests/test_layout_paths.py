"""
The run's file layout (`multigeom_workflow.settings.layout`): patterns, paths and the
parse back to (encoder, area, index) agree, and a path of another form is named.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY_CONFIG

from multigeom_workflow.scenario import validated_scenario
from multigeom_workflow.settings.layout import (
    CHECKPOINT_NAMES,
    WILDCARD_CONSTRAINTS,
    RunLayout,
    checkpoint_relpath,
    image_name,
    parse_image_file,
    parse_truth_file,
)

LAYOUT = RunLayout("some/runs/", "out")


def pattern_regex(pattern: str) -> re.Pattern:
    """A pattern's wildcards as the rules constrain them (how Snakemake matches)."""
    parts = re.split(r"\{(\w+)\}", pattern)
    regex = "".join(
        re.escape(p) if i % 2 == 0 else f"(?P<{p}>{WILDCARD_CONSTRAINTS[p]})"
        for i, p in enumerate(parts)
    )
    return re.compile(regex + "$")


@pytest.mark.parametrize(
    ("encoder", "area", "index"),
    [("inception", "V1", 0), ("onoff", "complex", 37), ("res_net50", "V4", 12345)],
)
@pytest.mark.parametrize("kind", ["per_image", "ceiling"])
def test_pattern_path_parse_round_trip(kind, encoder, area, index):
    pattern = getattr(LAYOUT, f"{kind}_pattern")
    path = getattr(LAYOUT, f"{kind}_file")(encoder, area, index)
    match = pattern_regex(pattern).match(path)
    assert match is not None, (pattern, path)
    assert match.groupdict() == {
        "encoder": encoder,
        "area": area,
        "index": f"{index:04d}",
    }
    assert parse_image_file(path) == (encoder, area, index)
    assert RunLayout.parse(Path(path).resolve()) == (encoder, area, index)


def test_paths_are_upstreams_layout():
    """Written out by hand from upstream's run layout (multigeom.pipeline)."""
    assert LAYOUT.runs_dir == "some/runs"
    assert LAYOUT.per_image_file("inception", "V1", 3) == (
        "some/runs/per_image/inception/V1/img0003.pt"
    )
    assert LAYOUT.ceiling_file("onoff", "V4", 10) == (
        "some/runs/per_image_ceiling/onoff/V4/img0010.pt"
    )
    assert LAYOUT.encoder_ckpt("onoff", "V1") == (
        "some/runs/encoders/onoff/V1/best_model.pt"
    )
    assert LAYOUT.diffusion_ckpt("onoff", "V1") == (
        "some/runs/diffusion/onoff/V1/final_model.pt"
    )
    assert (
        LAYOUT.truth_file("complex", 2) == "some/runs/ground_truth/complex/img0002.pt"
    )
    assert LAYOUT.demo_test_image(1) == "some/runs/demo/test_images/img0001.png"
    assert LAYOUT.stage5_metrics == "some/runs/metrics/cross_encoder_metrics.json"
    assert LAYOUT.result("fig4de.png") == "out/fig4de.png"
    assert RunLayout("").runs_dir == "."


@pytest.mark.parametrize("kind", sorted(CHECKPOINT_NAMES))
def test_checkpoint_pattern_fills_to_the_path(kind):
    pattern = LAYOUT.checkpoint_pattern(kind)
    path = LAYOUT.checkpoint_file(kind, "smallcnn", "simple")
    assert pattern.format(encoder="smallcnn", area="simple") == path
    assert path == f"some/runs/{kind}/smallcnn/simple/{CHECKPOINT_NAMES[kind]}"
    assert path.endswith(checkpoint_relpath(kind, "smallcnn", "simple"))


def test_truth_pattern_round_trip():
    path = LAYOUT.truth_file("simple", 42)
    assert pattern_regex(LAYOUT.truth_pattern).match(path)["index"] == "0042"
    assert parse_truth_file(path) == ("simple", 42)


@pytest.mark.parametrize(
    "path",
    [
        "runs/per_image/inception/V1/img3.pt",  # index of fewer than 4 digits
        "runs/per_image/inception/V1/image0003.pt",
        "runs/per_image/inception/V1/img0003.pt.bad",
        "img0003.pt",  # no configuration folders
        "runs/per_image/in-ception/V1/img0003.pt",  # not a wildcard's name
    ],
)
def test_a_path_of_another_form_is_named(path):
    with pytest.raises(ValueError, match=re.escape(repr(path))) as err:
        parse_image_file(path)
    assert "<encoder>/<area>/img<index>.pt" in str(err.value)


def test_bad_truth_path_and_kind_and_index_are_named():
    with pytest.raises(ValueError, match=r"'truth/imgX\.pt'.*<area>/img<index>\.pt"):
        parse_truth_file("truth/imgX.pt")
    with pytest.raises(ValueError, match=r"'models'.*encoders, diffusion"):
        checkpoint_relpath("models", "onoff", "V1")
    with pytest.raises(ValueError, match=r"-1.*0 or more"):
        image_name(-1)


def test_scenario_paths_come_from_its_layout(tmp_path, monkeypatch):
    """The scenario's paths are its layout's (one definition of the per-image file)."""
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg.update(yaml.safe_load(TINY_CONFIG.read_text()), runs_dir="r/", results_dir="o")
    s = validated_scenario(cfg, REPO)
    assert (s.runs_dir, s.results_dir) == ("r", "o")
    c = s.configurations[0]
    assert s.layout == RunLayout(s.runs_dir, s.results_dir)
    assert s.per_image_file(c.encoder, c.area, 1) == s.layout.per_image_file(
        c.encoder, c.area, 1
    )
    assert s.ceiling_file(c.encoder, c.area, 1) == s.layout.ceiling_file(
        c.encoder, c.area, 1
    )
    assert c.encoder_ckpt == s.layout.encoder_ckpt(c.encoder, c.area)
    assert [parse_image_file(f)[:2] for f in s.per_image_files(c)] == [
        (c.encoder, c.area)
    ] * s.n_images


@pytest.mark.parametrize(
    ("a", "b", "kind"),
    [
        (("inception", "V1"), ("resnet50", "V1"), "cross-model"),
        (("inception", "V1"), ("inception", "V4"), "cross-area"),
        (("inception", "V1"), ("resnet50", "V4"), None),
        (("inception", "V1"), ("inception", "V1"), None),
    ],
)
def test_pair_kinds_agree_in_the_scenario_and_the_figure(a, b, kind):
    """One definition: Scenario.comparable_pairs and the figure's comparison_kind."""
    from multigeom_workflow.results.figure import comparison_kind
    from multigeom_workflow.scenario import Configuration, Scenario
    from multigeom_workflow.settings.pairs import pair_kind

    assert pair_kind(a, b) == pair_kind(b, a) == kind
    metrics_pair = {
        "config_A": {"encoder": a[0], "area": a[1]},
        "config_B": {"encoder": b[0], "area": b[1]},
    }
    assert comparison_kind(metrics_pair) == kind
    configs = tuple(Configuration(*c, "e.pt", "d.pt") for c in (a, b))
    scenario = Scenario(
        configurations=configs,
        n_images=1,
        runs_dir="runs",
        seed=0,
        top_k=1,
        device="cpu",
        estimator={},
        estimator_file=Path("e.yaml"),
        diffusion={},
        diffusion_file=Path("d.yaml"),
        test_source="demo",
        test_image_files=("x.png",),
        modal={},
    )
    assert scenario.comparable_pairs == ([configs] if kind else [])
    assert (scenario.stage5_skipped is None) == (kind is not None)


def test_configuration_label_round_trip_and_bad_label():
    from multigeom_workflow.settings.names import (
        configuration_label,
        parse_configuration_label,
    )

    assert configuration_label("smallcnn", "complex") == "smallcnn/complex"
    assert parse_configuration_label("smallcnn/complex") == ("smallcnn", "complex")
    for bad in ("smallcnn", "a/b/c", "/V1"):
        with pytest.raises(ValueError, match=rf"{bad!r}.*<encoder>/<area>"):
            parse_configuration_label(bad)


@pytest.mark.parametrize("rule", ["estimate_image", "estimate_image_ceiling"])
def test_job_log_pattern_mirrors_the_output(rule):
    """A per-image job's log names its rule and wildcards."""
    log = RunLayout.job_log_pattern(rule)
    assert log == f"logs/{rule}/{{encoder}}/{{area}}/img{{index}}.log"
    filled = log.format(encoder="onoff", area="V1", index="0007")
    assert pattern_regex(log).match(filled).groupdict() == {
        "encoder": "onoff",
        "area": "V1",
        "index": "0007",
    }


def test_a_computation_names_its_rule_and_its_file():
    """`Computation`: the one value of a per-image computation; its rule (the run's
    estimate or the noise ceiling's second one) and its file (`RunLayout.file_of`) are
    the rules' own (rules/estimate.smk, rules/science.smk)."""
    from multigeom_workflow.settings.layout import Computation, RunLayout

    layout = RunLayout("runs", "results")
    first = Computation.of_job(
        "estimate_image", {"encoder": "onoff", "area": "V1", "index": "0003"}
    )
    second = first._replace(ceiling=True)
    assert (first.rule, second.rule) == ("estimate_image", "estimate_image_ceiling")
    assert first.configuration == ("onoff", "V1") and first.index == 3
    assert layout.file_of(first) == "runs/per_image/onoff/V1/img0003.pt"
    assert layout.file_of(second) == "runs/per_image_ceiling/onoff/V1/img0003.pt"
    assert (
        Computation.of_job("estimate_image_ceiling", first._asdict() | {"index": 3})
        == second
    )
