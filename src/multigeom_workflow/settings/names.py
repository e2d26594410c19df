"""
The workflow's vocabulary: the names of encoders and areas, of the engines and their
precisions, the size of a test image, the range of seeds, the folder names of
downloads. Each fact is written here once; the
config schema's enums and the rules' wildcard constraints are checked against it
(tests/test_layout.py).
"""

from __future__ import annotations

__all__ = [
    "ARCHITECTURES",
    "AREAS",
    "CEILING_ROW",
    "DEMO_AREAS",
    "DEMO_ENCODERS",
    "ENCODERS",
    "ENGINES",
    "MAX_SEED",
    "NAME_PATTERN",
    "N_PIXELS",
    "PAPER_AREAS",
    "PAPER_ENCODERS",
    "PER_IMAGE_RULES",
    "PRECISIONS",
    "TINYIMAGENET_DIR",
    "configuration_label",
    "default_architecture",
    "parse_configuration_label",
]

#: Encoders built by the workflow's embedded demo (see
#: `multigeom_workflow.inputs.demo`).
DEMO_ENCODERS = ("onoff", "smallcnn", "widecnn")
#: Synthetic areas of the demo: populations of upstream's `GaborTeacher`.
DEMO_AREAS = ("complex", "simple")
#: Encoders and areas of the paper (Azeglio et al. 2026, Fig. 4D-E).
PAPER_ENCODERS = ("inception", "resnet50", "onoff")
PAPER_AREAS = ("V1", "V4")
#: The encoder and area names the workflow knows: the paper's and the demo's. A run may
#: name others (`NAME_PATTERN`): an area of the user's, an encoder label of the user's
#: with its `ARCHITECTURES` entry beside it (docs/own-data.md).
ENCODERS = tuple(dict.fromkeys(PAPER_ENCODERS + DEMO_ENCODERS))
AREAS = PAPER_AREAS + DEMO_AREAS
#: What an encoder or area name may be (a regular expression, the rules' wildcard
#: constraint, `multigeom_workflow.settings.layout.WILDCARD_CONSTRAINTS`): letters,
#: digits and ``_``, since names are folders of the run layout and parts of labels.
NAME_PATTERN = "[A-Za-z0-9_]+"
#: What upstream multigeom builds an encoder from, by upstream's own names: its
#: reference encoders (`multigeom.encoders.reference.REFERENCE_ENCODERS`: the paper's
#: Inception and ResNet-50 around torchvision's ImageNet backbones, the ON-OFF front
#: end) and its registered backbones of `NeuralEncoder`
#: (`multigeom.encoders.registry.BACKBONES`, filled by `multigeom.encoders.backbones`).
#: Checked against upstream by tests/test_scenario.py.
ARCHITECTURES = ("inception", "resnet50", "onoff", "small_cnn")
#: The architecture of each encoder name the workflow knows (the demo's smallcnn and
#: widecnn are `NeuralEncoder`s around upstream's `SmallCNNBackbone`,
#: `multigeom_workflow.inputs.demo.training.build_demo_encoder`).
_KNOWN_ARCHITECTURES = {
    "inception": "inception",
    "resnet50": "resnet50",
    "onoff": "onoff",
    "smallcnn": "small_cnn",
    "widecnn": "small_cnn",
}
#: The rule of a run's per-image estimates (rules/estimate.smk).
ESTIMATE_RULE = "estimate_image"
#: The rule of the noise ceiling's second estimates (rules/science.smk): the same
#: computation with the ceiling's seed, its resources those of `ESTIMATE_RULE`.
CEILING_RULE = "estimate_image_ceiling"
#: The rules whose jobs are per-image computations, by name.
PER_IMAGE_RULES = (ESTIMATE_RULE, CEILING_RULE)
#: The row of the noise ceiling's second estimates (all configurations) where the dry
#: run's estimate, ``multigeom-workflow progress`` and the live view count them.
CEILING_ROW = "noise ceiling"
#: Pixels of a test image, 64 x 64 (upstream `multigeom.datasets.CANONICAL_TRANSFORM`).
N_PIXELS = 64 * 64


#: The per-image engines (config key ``engine``): upstream's estimator verbatim, or
#: the workflow's re-implementation of it for large batches
#: (`multigeom_workflow.compute.engine`).
ENGINES = ("upstream", "fast")
#: The arithmetic of a per-image estimate (config key ``precision``), either engine:
#: fp32 is IEEE float32 on every device (TF32 off for cuDNN convolutions and CUDA
#: matrix products while the estimator runs); tf32 is PyTorch's default on a GPU
#: (convolutions in TF32, matrix products in IEEE float32), what upstream's own command
#: line runs there, CUDA only, biased (docs/gpus.md,
#: `multigeom_workflow.compute.arithmetic`).
PRECISIONS = ("fp32", "tf32")


#: The seeds `torch.Generator.manual_seed` takes without overflow: 0 to 2**64 - 1
#: (negative ones alias positive ones, -1 being 2**64 - 1).
MAX_SEED = 2**64 - 1
#: The name of TinyImageNet's folder, inside the archive and on disk.
TINYIMAGENET_DIR = "tiny-imagenet-200"


def default_architecture(encoder: str) -> str | None:
    """
    The architecture (`ARCHITECTURES`) of an encoder name the workflow knows (the
    paper's, the demo's), or None for a label of the user's, whose configuration must
    name it (config key ``configs[i].architecture``).
    """
    return _KNOWN_ARCHITECTURES.get(encoder)


def configuration_label(encoder: str, area: str) -> str:
    """How metrics, figures and messages name a configuration, ``"<enc>/<area>"``."""
    return f"{encoder}/{area}"


def parse_configuration_label(label: str) -> tuple[str, str]:
    """
    The (encoder, area) of a `configuration_label`.

    Raises
    ------
    ValueError
        One line naming the label and the form allowed, ``<encoder>/<area>``.
    """
    encoder, sep, area = str(label).partition("/")
    if not (sep and encoder and area) or "/" in area:
        raise ValueError(f"configuration label {label!r}: allowed: <encoder>/<area>")
    return encoder, area
