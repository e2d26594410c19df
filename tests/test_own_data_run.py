"""
docs/own-data.md's configuration file, config/own_data.yaml, run through the workflow
to its figure (issue 49): an area and an encoder label the paper does not have, the
architecture beside the label, a configuration with its own estimator settings, sigma
given per configuration, test images from a folder.

It runs where the file says it runs, after the demo: in a copy of the reduced demo's
finished tree (`tiny_copy`), whose checkpoints were built with the tests' small
settings. So that the file's settings names fit those checkpoints and the tests' time,
the working directory holds its own ``config/estimator_demo.yaml``,
``config/diffusion_demo.yaml`` and ``config/estimator_science.yaml`` (a settings
path is looked up in the working directory first, then in the workflow's folder:
`multigeom_workflow.settings.files.resolve_settings_file`), and ``--config`` sets
``n_images=2 top_k=5`` (the copy's test images folder holds 2; the small estimator
gives 8 rows). The file itself is run as written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, run_snakemake

EXAMPLE = REPO / "config" / "own_data.yaml"
TINY = REPO / "tests" / "data"


def test_the_docs_show_the_file_that_runs():
    """docs/own-data.md quotes config/own_data.yaml whole, so that neither drifts."""
    doc = (REPO / "docs" / "own-data.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    assert EXAMPLE.read_text() in blocks


@pytest.mark.workflow
def test_own_labels_and_settings_run_to_the_figure(tiny_copy, tmp_path):
    work = tiny_copy
    (work / "config").mkdir()
    estimator = yaml.safe_load((TINY / "estimator_tiny.yaml").read_text())
    (work / "config" / "estimator_demo.yaml").write_text(yaml.safe_dump(estimator))
    own = {**estimator, "monte_carlo": {**estimator["monte_carlo"], "n_samples": 8}}
    (work / "config" / "estimator_science.yaml").write_text(yaml.safe_dump(own))
    diffusion = (TINY / "diffusion_tiny.yaml").read_text()
    (work / "config" / "diffusion_demo.yaml").write_text(diffusion)
    env = {"MULTIGEOM_GPU_LOCK_DIR": str(tmp_path / "locks")}
    args = ("--config", "n_images=2", "top_k=5")
    result = run_snakemake(work, *args, configfile=EXAMPLE, env=env)
    assert result.returncode == 0, result.stderr[-4000:]

    runs = work / "runs_own_data"
    files = {
        area: [
            torch.load(
                runs / "per_image" / "mycnn" / area / f"img{i:04d}.pt",
                weights_only=False,
            )
            for i in range(2)
        ]
        for area in ("IT", "MT")
    }
    for area, (first, _) in files.items():
        assert (first["encoder_name"], first["area"]) == ("mycnn", area)
        assert first["G_eigenvectors"].shape == (5, 64 * 64)
        assert first["sigma"] == 0.22
        prov = first["provenance"]
        assert prov["architecture"] == "small_cnn"
        # each configuration's settings file, in its provenance
        est_file = prov["configs"]["estimator"]["path"]
        want = "estimator_science.yaml" if area == "MT" else "estimator_demo.yaml"
        assert Path(est_file).resolve() == (work / "config" / want).resolve()
    # MT's own estimator: 8 samples; IT takes the run's, 4
    for area, n in (("MT", 8), ("IT", 4)):
        text = files[area][0]["provenance"]["configs"]["estimator"]["text"]
        assert yaml.safe_load(text)["monte_carlo"]["n_samples"] == n
    # the test images of the folder, in name order
    image = work / "runs" / "demo" / "test_images" / "img0001.png"
    from multigeom_workflow.inputs.images import load_test_image

    assert torch.allclose(
        files["IT"][1]["image"].reshape(1, 64, 64), load_test_image(image), atol=1e-6
    )
    # Stage 5 compared the cross-area pair, and the figure is drawn
    metrics = json.loads((runs / "metrics" / "cross_encoder_metrics.json").read_text())
    compared = {
        (frozenset((p["config_A"]["area"], p["config_B"]["area"])), p["metric"])
        for p in metrics["pairs"].values()
    }
    assert compared == {(frozenset(("IT", "MT")), m) for m in ("G", "J")}
    for name in ("fig4de.png", "fig4de.pdf"):
        assert (work / "results_own_data" / name).stat().st_size > 0
    # independent draws per configuration: the noise ceiling, no shared-draws control
    ceiling = json.loads((runs / "metrics" / "noise_ceiling.json").read_text())
    assert sorted(ceiling["configurations"]) == ["mycnn/IT", "mycnn/MT"]
    assert "shared_draws_control" not in ceiling
    # the demo's own files are untouched: its per-image files are where they were
    assert (work / "runs" / "per_image" / "smallcnn" / "complex").is_dir()
