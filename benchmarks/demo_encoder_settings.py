"""
Which demo encoder settings reach the validation correlation goal, and at what CPU
cost: fits demo encoders to a demo area as rule fit_demo_encoder does, on one thread,
for each variant of the ``demo`` settings of config/config.yaml, and prints the
correlation with the area's noiseless responses on the held-out crops and on the 16
test photographs (the demo's goal: 0.5 on both), the response std on the test
photographs and the CPU seconds of the fit.

Usage: python benchmarks/demo_encoder_settings.py [--area simple]
    [--encoders smallcnn,widecnn] [--variant 'backbone_epochs=16;n_train_crops=2048']
A variant is semicolon-separated ``key=value`` overrides of the ``demo`` settings.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--area", default="simple")
    p.add_argument("--encoders", default="smallcnn,widecnn")
    p.add_argument("--variant", action="append", default=None, help="k=v;k=v")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    from multigeom.datasets import CANONICAL_TRANSFORM
    from PIL import Image

    from multigeom_workflow.inputs.demo.data import cut_training_crops, simulate_area
    from multigeom_workflow.inputs.demo.training import fit_demo_encoder
    from multigeom_workflow.inputs.images import DEMO_TEST_PHOTOS, package_photo

    tests = []
    for package, name in DEMO_TEST_PHOTOS:
        with Image.open(package_photo(package, name)) as img:
            tests.append(CANONICAL_TRANSFORM(img.convert("RGB")))
    tests = torch.stack(tests)
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())["demo"]
    work = Path(tempfile.mkdtemp(prefix="encoder-settings-"))
    for variant in args.variant or [""]:
        demo = dict(base)
        for item in filter(None, variant.split(";")):
            key, value = item.split("=", 1)
            demo[key.strip()] = yaml.safe_load(value)
        crops = cut_training_crops(demo["n_train_crops"], demo["seed"])
        area = simulate_area(args.area, crops, demo["seed"], demo["noise_sigma"])
        for name in args.encoders.split(","):
            t0 = time.process_time()
            fit = fit_demo_encoder(
                name,
                area,
                crops,
                epochs=demo["readout_epochs"],
                lr=demo["readout_lr"],
                seed=demo["seed"],
                out=work / "encoder.pt",
                backbone_epochs=demo["backbone_epochs"],
                backbone_lr=demo["backbone_lr"],
                backbone_batch_size=demo["backbone_batch_size"],
                backbone_readout_lr=demo["backbone_readout_lr"],
                test_images=tests,
            )
            print(
                f"[{variant or 'as is'}] {name}/{args.area}: corr "
                f"{fit['val_corr_clean']:.3f}, on the test images "
                f"{fit['test_corr_clean']:.3f}, std {fit['response_std']:.3f}, "
                f"{time.process_time() - t0:.0f} CPU s",
                flush=True,
            )


if __name__ == "__main__":
    main()
