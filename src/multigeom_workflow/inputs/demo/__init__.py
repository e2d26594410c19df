"""
The embedded demo: everything the workflow needs, made offline and deterministically
from seeds, in upstream's run layout, one module per job.

* `data`: the photographs, the training crops and the two synthetic areas
  (``complex``, ``simple``; upstream's `GaborTeacher`) with their noisy responses.
* `training`: the encoders fitted to each area and the conditional diffusion models.
* `diagnostics`: `encoder_warnings` and `conditioning_sensitivity`, the checks that
  surface in the run's output.
* `truth`: the ground truth of each area, its Fisher information per test image.

The public names of the four are listed here too (the rules read
`encoder_warnings` from this package).
"""

from .data import (
    TEACHERS,
    cut_training_crops,
    export_photo,
    load_teacher,
    simulate_area,
)
from .diagnostics import conditioning_sensitivity, encoder_warnings
from .training import (
    build_demo_encoder,
    fit_demo_encoder,
    train_backbone,
    train_demo_diffusion,
)
from .truth import area_fisher

__all__ = [
    "TEACHERS",
    "area_fisher",
    "build_demo_encoder",
    "conditioning_sensitivity",
    "cut_training_crops",
    "encoder_warnings",
    "export_photo",
    "fit_demo_encoder",
    "load_teacher",
    "simulate_area",
    "train_backbone",
    "train_demo_diffusion",
]
