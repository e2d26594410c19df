"""
The embedded demo: everything the workflow needs, made offline and deterministically
from seeds, in upstream's run layout, one module per job.

* `data`: the photographs, the training crops and the two synthetic areas
  (``complex``, ``simple``; upstream's `GaborTeacher`) with their noisy responses.
* `training`: the encoders fitted to each area and the conditional diffusion models.
* `diagnostics`: `encoder_warnings` and `conditioning_sensitivity`, the checks that
  surface in the run's output.
* `truth`: the ground truth of each area, its Fisher information per test image.

The public names of the four are listed here too, each imported when first used:
the Snakefile reads `encoder_warnings` at parse time without importing torch.
"""

import importlib

# each public name and its module, imported when first used (PEP 562): the Snakefile
# reads `encoder_warnings` at parse time, and that must not import torch
_MODULE_OF = {
    "TEACHERS": "data",
    "cut_training_crops": "data",
    "export_photo": "data",
    "load_teacher": "data",
    "simulate_area": "data",
    "conditioning_sensitivity": "diagnostics",
    "encoder_warnings": "diagnostics",
    "write_conditioning_reports": "diagnostics",
    "build_demo_encoder": "training",
    "fit_demo_encoder": "training",
    "train_backbone": "training",
    "train_demo_diffusion": "training",
    "area_fisher": "truth",
    "write_area_fisher": "truth",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
