"""
docs/outputs.md against what the workflow writes: its loading example runs on a built
run and prints the files' values, and the keys it lists for the per-image file are
those the writer writes (`multigeom_workflow.compute.estimate`), no more, no fewer.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, TINY_CONFIG
from PIL import Image

from multigeom_workflow.compute.estimate import Models, estimate_request
from multigeom_workflow.compute.request import EstimateRequest
from multigeom_workflow.settings.files import to_namespace

DOC = REPO / "docs" / "outputs.md"
#: The tables of the per-image file's keys: heading -> where in the file's dict.
KEY_TABLES = {
    "The per-image file": (),
    "`provenance`": ("provenance",),
    '`provenance["arithmetic"]`': ("provenance", "arithmetic"),
    '`provenance["fast_engine"]`': ("provenance", "fast_engine"),
}


def section(text: str, heading: str) -> list[str]:
    """The lines under the Markdown heading `heading`, up to the next heading."""
    lines = text.splitlines()
    starts = [
        i
        for i, line in enumerate(lines)
        if line.startswith("#") and line.lstrip("#").strip() == heading
    ]
    assert len(starts) == 1, f"docs/outputs.md: heading {heading!r} {len(starts)} times"
    body, fenced = [], False
    for line in lines[starts[0] + 1 :]:
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            break
        body.append(line)
    return body


def documented_keys(text: str, heading: str) -> set[str]:
    """The keys of the table under `heading`: its rows' first cells, in backticks."""
    return {
        m[1]
        for line in section(text, heading)
        if (m := re.match(r"\|\s*`([^`]+)`\s*\|", line))
    }


def assert_documented(
    d: dict, text: str, heading: str, where: tuple, what: str, unless: set = frozenset()
):
    """
    The dict at `where` in the per-image dict `d` has the keys of the table, less
    those `unless` names.
    """
    for key in where:
        d = d[key]
    listed = documented_keys(text, heading) - set(unless)
    assert set(d) == listed, (
        f"docs/outputs.md, table {heading!r} lists {sorted(listed)}; a per-image file "
        f"({what}) holds {sorted(d)}"
    )


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` blocks of a Markdown text."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_loading_example_prints_what_the_files_hold(tiny_run, monkeypatch):
    """
    The one Python block of docs/outputs.md, run in the reduced demo's working
    directory: it prints a per-image file's shape, dtype and top eigenvalues, and one
    Stage 5 curve, each equal to what the files hold.
    """
    text = DOC.read_text()
    (block,) = python_blocks("\n".join(section(text, "Loading the results")) + "\n")
    monkeypatch.chdir(tiny_run)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "docs/outputs.md", "exec"), {"__name__": "outputs_doc"})
    lines = out.getvalue().splitlines()
    top_k = yaml.safe_load(TINY_CONFIG.read_text())["top_k"]

    path, encoder, area, index = lines[0].split()
    d = torch.load(tiny_run / path, weights_only=False)
    assert (encoder, area, int(index)) == (d["encoder_name"], d["area"], d["img_idx"])
    assert lines[1] == f"G_eigenvectors ({top_k}, 4096) torch.float32"
    for line, key in zip(lines[2:4], ("G_eigenvalues", "J_eigenvalues"), strict=True):
        printed = ast.literal_eval(line.split(" eigenvalues ", 1)[1])
        assert printed == d[key][:3].tolist(), line

    metrics = json.loads(
        (tiny_run / "runs/metrics/cross_encoder_metrics.json").read_text()
    )
    label, pair = next(iter(metrics["pairs"].items()))
    assert lines[4] == f"{label} n_images {pair['n_images']}"
    curve = lines[5:]
    assert len(curve) == top_k == len(pair["k"])
    for k, line in enumerate(curve, start=1):
        a, sem = pair["alignment_mean"][k - 1], pair["alignment_sem"][k - 1]
        assert line == f"k={k} A_k={a:.4f} sem={sem:.4f} chance={k / 4096:.5f}"

    # the output the page shows is the run's
    shown = re.search(r"it prints, first:\n\n```\n(.*?)```", text, re.S)
    assert shown is not None
    assert lines[:2] == shown[1].splitlines()


def test_the_built_files_hold_the_documented_keys(tiny_run):
    """A per-image file and a ceiling file of the reduced demo, keys as documented."""
    text = DOC.read_text()
    for path in ("runs/per_image/smallcnn/simple/img0001.pt",
                 "runs/per_image_ceiling/onoff/complex/img0000.pt"):  # fmt: skip
        d = torch.load(tiny_run / path, weights_only=False)
        assert d["provenance"]["engine"] == "fast"
        for heading, where in KEY_TABLES.items():
            assert_documented(d, text, heading, where, path)


DIFFUSION = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
ESTIMATOR = yaml.safe_load((REPO / "tests/data/estimator_tiny.yaml").read_text())


@pytest.fixture(scope="module")
def models():
    """Upstream's UNet of the tests' diffusion settings and a small-CNN encoder, random
    weights (seeded): a per-image file without a built run."""
    from multigeom.diffusion.model import build_diffusion_model, build_scheduler
    from multigeom.encoders.backbones import SmallCNNBackbone
    from multigeom.encoders.neural import NeuralEncoder

    torch.manual_seed(0)
    cfg = to_namespace(DIFFUSION)
    unet = build_diffusion_model(cfg).eval()
    encoder = NeuralEncoder(SmallCNNBackbone(), n_neurons=50).eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    alphas = build_scheduler(cfg).alphas_cumprod
    return Models(encoder, unet, alphas, None, torch.device("cpu"))


@pytest.mark.parametrize("engine", ["fast", "upstream"])
def test_the_documented_keys_are_those_the_writer_writes(
    models, tmp_path, monkeypatch, engine
):
    """
    One per-image file written by `estimate_request` (the path of every per-image job:
    upstream's provenance, the workflow's additions, either engine) holds exactly the
    keys the tables of docs/outputs.md list; ``fast_engine`` only with engine fast.
    Upstream's git queries and the processor's name are answered here (each a
    process otherwise: not in the fast tier).
    """
    import platform

    import multigeom.utils

    monkeypatch.setattr(multigeom.utils, "_git", lambda *args: None)
    monkeypatch.setattr(platform, "processor", lambda: "")
    png = tmp_path / "img.png"
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)
    Image.fromarray(pixels).save(png)
    request = EstimateRequest(
        image=str(png),
        index=1,
        out=str(tmp_path / "img0001.pt"),
        estimator=ESTIMATOR,
        encoder_name="smallcnn",
        area="V1",
        encoder_ckpt="unused",
        diffusion_ckpt="unused",
        diffusion=DIFFUSION,
        settings_files={
            "estimator": str(REPO / "tests/data/estimator_tiny.yaml"),
            "diffusion": str(REPO / "tests/data/diffusion_tiny.yaml"),
        },
        engine=engine,
    )
    d = torch.load(estimate_request(models, request), weights_only=False)
    text = DOC.read_text()
    fast_only = {"fast_engine"} if engine == "upstream" else set()
    for heading, where in KEY_TABLES.items():
        if fast_only & set(where):
            assert "fast_engine" not in d["provenance"]
            continue
        assert_documented(d, text, heading, where, f"engine {engine}", fast_only)
    assert tuple(d["G_eigenvectors"].shape) == (ESTIMATOR["top_k"], 4096)
    assert d["G_eigenvectors"].dtype == d["J_eigenvalues"].dtype == torch.float32
