"""The embedded demo's assets: real photographs, crops, synthetic areas, encoders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from multigeom_workflow.inputs.demo.data import (
    cut_training_crops,
    export_photo,
    simulate_area,
)
from multigeom_workflow.inputs.demo.training import build_demo_encoder
from multigeom_workflow.inputs.images import (
    DEMO_TEST_PHOTOS,
    DEMO_TRAIN_PHOTOS,
    package_photo,
)


def test_test_and_training_photographs_are_apart_and_shipped():
    assert len(DEMO_TEST_PHOTOS) >= 16
    assert not set(DEMO_TEST_PHOTOS) & set(DEMO_TRAIN_PHOTOS)
    for package, name in DEMO_TEST_PHOTOS + DEMO_TRAIN_PHOTOS:
        assert package_photo(package, name).stat().st_size > 1000


def test_missing_photo_is_named():
    with pytest.raises(FileNotFoundError, match="data/nothing.png"):
        package_photo("skimage", "nothing.png")


@pytest.mark.parametrize(
    "photo",
    [DEMO_TEST_PHOTOS[0], ("plenoptic", "einstein.pgm"), ("skimage", "rocket.jpg")],
)
def test_exported_photo_keeps_its_pixels(photo, tmp_path):
    source = package_photo(*photo)
    export_photo(source, tmp_path / "img.png")
    with Image.open(source) as a, Image.open(tmp_path / "img.png") as b:
        assert a.mode == b.mode
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_crops_are_deterministic_canonical_images():
    a, b = cut_training_crops(12, seed=3), cut_training_crops(12, seed=3)
    assert a.shape == (12, 1, 64, 64) and torch.equal(a, b)
    assert a.min() >= -1.0 and a.max() <= 1.0
    assert not torch.equal(a, cut_training_crops(12, seed=4))
    # Different crops, not one repeated.
    assert len({tuple(c.flatten()[:50].tolist()) for c in a}) == 12


@pytest.fixture(scope="module")
def crops():
    return cut_training_crops(64, seed=0)


@pytest.mark.parametrize("area, n_complex", [("complex", 50), ("simple", 0)])
def test_areas_have_known_ground_truth(crops, area, n_complex):
    from multigeom.datasets import GaborTeacher

    sim = simulate_area(area, crops, seed=0, noise_sigma=0.22)
    teacher = GaborTeacher(**sim["teacher_kwargs"])
    teacher.load_state_dict(sim["teacher_state"])
    assert int(teacher.is_complex.sum()) == n_complex
    with torch.no_grad():
        assert torch.allclose(teacher(crops), sim["clean"], atol=1e-6)
    # Calibrated to unit standard deviation, then noise of sigma 0.22 on top.
    assert torch.allclose(sim["clean"].std(0), torch.ones(50), atol=1e-3)
    assert (sim["noisy"] - sim["clean"]).std().item() == pytest.approx(0.22, rel=0.1)


def test_the_two_areas_differ(crops):
    a = simulate_area("complex", crops, seed=0, noise_sigma=0.22)
    b = simulate_area("simple", crops, seed=0, noise_sigma=0.22)
    assert not torch.allclose(a["clean"], b["clean"])


def test_smallcnn_weights_come_from_the_seed():
    a, b, c = (build_demo_encoder("smallcnn", s) for s in (0, 0, 1))
    wa, wb, wc = (e.backbone.features[0].weight for e in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    with pytest.raises(ValueError, match="allowed: onoff, smallcnn"):
        build_demo_encoder("inception", 0)


@pytest.mark.parametrize("name", ["smallcnn", "widecnn"])
def test_the_readout_learns_at_its_own_rate(name):
    # Adam's first step moves a parameter by its group's learning rate times g / |g|
    # (the bias-corrected moments of one gradient), and OneCycleLR scales both groups'
    # rates by the same factor: a readout weight moves readout_lr / lr times as far as
    # a backbone weight, wherever the gradient is well above Adam's eps.
    from multigeom_workflow.inputs.demo.training import train_backbone

    encoder = build_demo_encoder(name, seed=0)
    crops = torch.rand(8, 1, 64, 64) * 2 - 1
    responses = torch.randn(8, 50)
    before = {k: v.detach().clone() for k, v in encoder.named_parameters()}
    torch.manual_seed(0)
    # One step: OneCycleLR's rate there is max_lr / 2.5e5 (its div_factor times its
    # final_div_factor), so large rates keep each step far above float32's resolution.
    train_backbone(
        encoder, crops, responses, epochs=1, lr=1.0, batch_size=8, readout_lr=25.0
    )
    steps = {"backbone": [], "readout": []}
    for key, value in encoder.named_parameters():
        step = (value.detach() - before[key]).abs().flatten()
        steps[key.split(".")[0]].append(step[step > 0.5 * step.max()])
    backbone, readout = (float(torch.cat(steps[k]).median()) for k in steps)
    assert readout / backbone == pytest.approx(25.0, rel=0.01)
