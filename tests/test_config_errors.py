"""
Bad configuration values stop the run before any job, with one line that names the
key, the value and what is allowed.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import TINY_CONFIG, run_snakemake

BAD = [
    # (changes to the reduced demo's config, words the message must hold)
    ({"n_images": 0}, ["'n_images' = 0", "allowed: an integer >= 1"]),
    ({"engine": "turbo"}, ["'engine' = 'turbo'", "allowed: upstream, fast"]),
    ({"configs": []}, ["'configs'", "allowed: a list of 1 or more"]),
    ({"top_k": "many"}, ["'top_k' = 'many'", "allowed: an integer >= 1"]),
    ({"n_images": 17}, ["'n_images' = 17", "16 images", "1 to 16"]),
    (
        {"configs": [{"encoder": "vgg", "area": "V1"}]},
        ["configs[0].encoder", "'vgg'", "inception"],
    ),
    (
        {"configs": {"encoder": "onoff", "area": "IT"}},
        ["configs[0].area", "'IT'", "V4"],
    ),
    (
        {
            "configs": [
                {"encoder": "inception", "area": "V1"},
                {"encoder": "onoff", "area": "complex"},
            ]
        },
        [
            "configs[0].encoder_ckpt",
            "runs/encoders/inception/V1/best_model.pt",
            "no such checkpoint",
        ],
    ),
    (
        {"configs": [{"encoder": "inception", "area": "complex"}]},
        ["configs[0].encoder", "'inception'", "onoff, smallcnn"],
    ),
    (
        {"test_images": {"source": "tinyimagenet", "path": "/no/such/folder"}},
        ["test_images.path", "/no/such/folder", "tiny-imagenet-200"],
    ),
    (
        {"test_images": {"source": "imagenet"}},
        ["test_images.source", "'imagenet'", "tinyimagenet"],
    ),
    ({"top_k": 9}, ["'top_k' = 9", "8 rows", "at most 8"]),
    ({"device": "gpu"}, ["'device'", "'gpu'", "cuda"]),
    (
        {"estimator": "nope.yaml"},
        ["'estimator' = 'nope.yaml'", "packaged names", "estimator"],
    ),
    ({"colour": "red"}, ["'colour' was unexpected"]),
]


@pytest.mark.parametrize("changes, words", BAD, ids=[str(c) for c, _ in BAD])
def test_bad_value_stops_before_any_job(tmp_path, changes, words):
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config.update(changes)
    configfile = tmp_path / "bad.yaml"
    configfile.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = run_snakemake(workdir, configfile=configfile)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("config error: ")
    for word in words:
        assert word in lines[0]
    # No job ran: nothing was written but Snakemake's own folder.
    assert sorted(p.name for p in workdir.iterdir()) in ([], [".snakemake"])
