"""
Where every file of a run lives: one object, `RunLayout`, gives the rules' patterns
(with Snakemake's ``{encoder}``, ``{area}`` and ``{index}`` wildcards), the concrete
paths of one (encoder, area, image), and parses a per-image path back into its
(encoder, area, index).

The folders follow upstream's run layout (``multigeom.pipeline``): ``encoders/``,
``diffusion/``, ``per_image/`` and ``metrics/`` under the runs folder; image i's file
is ``img{i:04d}.pt``. Nothing here imports torch or Snakemake: the Snakefile calls it
at parse time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .names import CEILING_RULE, ESTIMATE_RULE, NAME_PATTERN

__all__ = [
    "CHECKPOINT_NAMES",
    "Computation",
    "ImageKey",
    "RunLayout",
    "WILDCARD_CONSTRAINTS",
    "checkpoint_relpath",
    "image_name",
    "is_ceiling_file",
    "parse_image_file",
    "parse_truth_file",
]

#: The file names of a configuration's two checkpoints, by upstream's folder (kind):
#: ``encoders/<enc>/<area>/best_model.pt``, ``diffusion/<enc>/<area>/final_model.pt``,
#: the same in the published Hub repository.
CHECKPOINT_NAMES = {"encoders": "best_model.pt", "diffusion": "final_model.pt"}

#: The rules' wildcard constraints (Snakemake regular expressions): names of letters,
#: digits and ``_``, an index of four digits or more (``img0003``).
WILDCARD_CONSTRAINTS = {
    "encoder": NAME_PATTERN,
    "area": NAME_PATTERN,
    "index": r"\d\d\d\d+",
}

_IMAGE_FILE = re.compile(
    rf"(?:^|/)(?P<encoder>{WILDCARD_CONSTRAINTS['encoder']})"
    rf"/(?P<area>{WILDCARD_CONSTRAINTS['area']})"
    rf"/img(?P<index>{WILDCARD_CONSTRAINTS['index']})\.pt$"
)
_TRUTH_FILE = re.compile(
    rf"(?:^|/)(?P<area>{WILDCARD_CONSTRAINTS['area']})"
    rf"/img(?P<index>{WILDCARD_CONSTRAINTS['index']})\.pt$"
)


class ImageKey(NamedTuple):
    """The configuration (encoder, area) and the test image (index) of a file."""

    encoder: str
    area: str
    index: int


class Computation(NamedTuple):
    """
    One per-image computation: the estimate of G(x) and J(x) of test image `index` by
    configuration (`encoder`, `area`), either the run's (`ceiling` False: rule
    estimate_image, ``per_image/``) or the noise ceiling's second one with other
    Monte-Carlo seeds (`ceiling` True: rule estimate_image_ceiling,
    ``per_image_ceiling/``). The one value every part of the workflow counts, plans,
    shards and prices (`multigeom_workflow.scenario.Scenario.computations`, the
    planned jobs of Snakemake's plan).
    """

    encoder: str
    area: str
    index: int
    ceiling: bool = False

    @property
    def configuration(self) -> tuple[str, str]:
        """(encoder, area)."""
        return (self.encoder, self.area)

    @property
    def rule(self) -> str:
        """The rule whose job computes it (`multigeom_workflow.settings.names`)."""
        return CEILING_RULE if self.ceiling else ESTIMATE_RULE

    @classmethod
    def of_job(cls, rule: str, wildcards) -> Computation:
        """The computation of a per-image job: its rule and its wildcards
        (``encoder``, ``area``, ``index``: a mapping).
        """
        return cls(
            wildcards["encoder"],
            wildcards["area"],
            int(wildcards["index"]),
            rule == CEILING_RULE,
        )


def image_name(index: int, suffix: str = ".pt") -> str:
    """
    The file name of test image `index`, e.g. ``img0003.pt``.

    Raises
    ------
    ValueError
        If `index` is negative.
    """
    if int(index) < 0:
        raise ValueError(f"image index {index!r}: allowed: 0 or more")
    return f"img{int(index):04d}{suffix}"


def parse_image_file(path: str | Path) -> ImageKey:
    """
    The (encoder, area, index) of a per-image file ``.../<encoder>/<area>/img0003.pt``
    (the run's estimates and the noise ceiling's second ones alike): the two folders
    above the file name its configuration.

    Raises
    ------
    ValueError
        One line naming the path and the form allowed.
    """
    match = _IMAGE_FILE.search(Path(path).as_posix())
    if match is None:
        raise ValueError(
            f"per-image file {str(path)!r}: not of the form "
            "<encoder>/<area>/img<index>.pt (index of 4 digits or more, names of "
            "letters, digits and _)"
        )
    return ImageKey(match["encoder"], match["area"], int(match["index"]))


def is_ceiling_file(path: str | Path) -> bool:
    """
    Whether a per-image file is one of the noise ceiling's second estimates
    (``.../per_image_ceiling/<encoder>/<area>/img0003.pt``), not a run's estimate
    (``.../per_image/...``): the folder above its configuration's says so.
    """
    return Path(path).parent.parent.parent.name == "per_image_ceiling"


def parse_truth_file(path: str | Path) -> tuple[str, int]:
    """
    The (area, index) of a ground-truth file ``.../ground_truth/<area>/img0003.pt``.

    Raises
    ------
    ValueError
        One line naming the path and the form allowed.
    """
    match = _TRUTH_FILE.search(Path(path).as_posix())
    if match is None:
        raise ValueError(
            f"ground-truth file {str(path)!r}: not of the form <area>/img<index>.pt "
            "(index of 4 digits or more)"
        )
    return match["area"], int(match["index"])


@dataclass(frozen=True)
class RunLayout:
    """
    The files of a run, as the rules' patterns and as concrete paths.

    Parameters
    ----------
    runs_dir : str
        Root of upstream's run layout (config key ``runs_dir``); a trailing ``/`` is
        dropped, and an empty one is ``.``.
    results_dir : str
        The figures and the report's tables (config key ``results_dir``).

    Notes
    -----
    Every ``*_pattern`` property or method holds Snakemake wildcards (``{encoder}``,
    ``{area}``, ``{index}``, the index written with 4 digits or more); the path
    methods (`per_image_file`, `ceiling_file`, `truth_file`, `checkpoint_file`,
    `demo_test_image`) fill them. `parse_image_file` reads a per-image path back.
    """

    runs_dir: str = "runs"
    results_dir: str = "results"

    def __post_init__(self):
        object.__setattr__(self, "runs_dir", str(self.runs_dir).rstrip("/") or ".")
        object.__setattr__(
            self, "results_dir", str(self.results_dir).rstrip("/") or "."
        )

    # --- patterns (Snakemake wildcards) ----------------------------------------

    @property
    def per_image_pattern(self) -> str:
        """``<runs>/per_image/{encoder}/{area}/img{index}.pt`` (rule estimate_image)."""
        return f"{self.runs_dir}/per_image/{{encoder}}/{{area}}/img{{index}}.pt"

    @property
    def ceiling_pattern(self) -> str:
        """The noise ceiling's second estimates, ``per_image_ceiling/`` (same form)."""
        return f"{self.runs_dir}/per_image_ceiling/{{encoder}}/{{area}}/img{{index}}.pt"

    @property
    def truth_pattern(self) -> str:
        """A demo area's ground truth, ``<runs>/ground_truth/{area}/img{index}.pt``."""
        return f"{self.runs_dir}/ground_truth/{{area}}/img{{index}}.pt"

    def checkpoint_pattern(self, kind: str) -> str:
        """
        ``<runs>/encoders/{encoder}/{area}/best_model.pt`` (kind ``encoders``) or
        ``<runs>/diffusion/{encoder}/{area}/final_model.pt`` (kind ``diffusion``).

        Raises
        ------
        ValueError
            If `kind` is neither.
        """
        return f"{self.runs_dir}/{checkpoint_relpath(kind, '{encoder}', '{area}')}"

    @property
    def encoder_ckpt_pattern(self) -> str:
        """The fitted encoder, ``<runs>/encoders/{encoder}/{area}/best_model.pt``."""
        return self.checkpoint_pattern("encoders")

    @property
    def diffusion_ckpt_pattern(self) -> str:
        """The diffusion model, ``<runs>/diffusion/{encoder}/{area}/final_model.pt``."""
        return self.checkpoint_pattern("diffusion")

    @property
    def demo_test_image_pattern(self) -> str:
        """The demo's test photos, ``<runs>/demo/test_images/img{index}.png``."""
        return f"{self.runs_dir}/demo/test_images/img{{index}}.png"

    @staticmethod
    def job_log_pattern(rule: str) -> str:
        """A per-image rule's log, ``logs/<rule>/{encoder}/{area}/img{index}.log``."""
        return f"logs/{rule}/{{encoder}}/{{area}}/img{{index}}.log"

    # --- concrete paths ----------------------------------------------------------

    def per_image_file(self, encoder: str, area: str, index: int) -> str:
        """The per-image file ``<runs>/per_image/<enc>/<area>/img0003.pt``."""
        return _fill(self.per_image_pattern, encoder, area, index)

    def per_image_folder(self, encoder: str, area: str) -> str:
        """The folder of a configuration's per-image files."""
        return str(Path(self.per_image_file(encoder, area, 0)).parent)

    def ceiling_folder(self, encoder: str, area: str) -> str:
        """The folder of a configuration's second estimates (noise ceiling)."""
        return str(Path(self.ceiling_file(encoder, area, 0)).parent)

    def ceiling_file(self, encoder: str, area: str, index: int) -> str:
        """The noise ceiling's second estimate of an image (rules/science.smk)."""
        return _fill(self.ceiling_pattern, encoder, area, index)

    def file_of(self, computation: Computation) -> str:
        """The per-image file a `Computation` writes (`per_image_file` or
        `ceiling_file`).
        """
        c = computation
        path = self.ceiling_file if c.ceiling else self.per_image_file
        return path(c.encoder, c.area, c.index)

    def truth_file(self, area: str, index: int) -> str:
        """A demo area's ground truth J_area(x) of test image `index`."""
        return _fill(self.truth_pattern, None, area, index)

    def encoder_ckpt(self, encoder: str, area: str) -> str:
        """The default path of a configuration's fitted encoder."""
        return self.checkpoint_file("encoders", encoder, area)

    def diffusion_ckpt(self, encoder: str, area: str) -> str:
        """The default path of a configuration's conditional diffusion model."""
        return self.checkpoint_file("diffusion", encoder, area)

    def checkpoint_file(self, kind: str, encoder: str, area: str) -> str:
        """A checkpoint's default path, kind ``encoders`` or ``diffusion``."""
        return f"{self.runs_dir}/{checkpoint_relpath(kind, encoder, area)}"

    def fit_report(self, encoder: str, area: str) -> str:
        """A demo encoder's fit report, beside its checkpoint."""
        return f"{self.runs_dir}/encoders/{encoder}/{area}/fit_report.json"

    def conditioning_report(self, encoder: str, area: str) -> str:
        """A demo diffusion model's conditioning check, beside its checkpoint."""
        return f"{self.runs_dir}/diffusion/{encoder}/{area}/conditioning.json"

    def demo_test_image(self, index: int) -> str:
        """The demo's test photo `index`, ``<runs>/demo/test_images/img0003.png``."""
        return f"{self.runs_dir}/demo/test_images/{image_name(index, '.png')}"

    def metrics_file(self, name: str) -> str:
        """
        A file of ``<runs>/metrics/``: ``cross_encoder_metrics.json`` (Stage 5),
        ``per_image_checked.tsv``, ``noise_ceiling.json``, ``ground_truth.json``.
        """
        return f"{self.runs_dir}/metrics/{name}"

    @property
    def stage5_metrics(self) -> str:
        """Stage 5's metrics, upstream's ``metrics/cross_encoder_metrics.json``."""
        return self.metrics_file("cross_encoder_metrics.json")

    @property
    def per_image_checked(self) -> str:
        """The list of checked per-image files Stage 5 reads (rules/alignment.smk)."""
        return self.metrics_file("per_image_checked.tsv")

    @property
    def noise_ceiling(self) -> str:
        """The Monte-Carlo noise ceiling's A_k (rules/science.smk)."""
        return self.metrics_file("noise_ceiling.json")

    @property
    def truth_metrics(self) -> str:
        """A_k of every demo configuration with its area's ground truth."""
        return self.metrics_file("ground_truth.json")

    def result(self, name: str) -> str:
        """A file of the results folder, e.g. ``fig4de.png``."""
        return f"{self.results_dir}/{name}"

    @staticmethod
    def parse(path: str | Path) -> ImageKey:
        """The (encoder, area, index) of a per-image file: `parse_image_file`."""
        return parse_image_file(path)


def checkpoint_relpath(kind: str, encoder: str, area: str) -> str:
    """
    A checkpoint's path inside a run folder and inside the published Hub repository,
    e.g. ``encoders/inception/V1/best_model.pt``.

    Raises
    ------
    ValueError
        If `kind` is not ``encoders`` or ``diffusion``.
    """
    if kind not in CHECKPOINT_NAMES:
        raise ValueError(
            f"checkpoint kind {kind!r}: allowed: {', '.join(CHECKPOINT_NAMES)}"
        )
    return f"{kind}/{encoder}/{area}/{CHECKPOINT_NAMES[kind]}"


def _fill(pattern: str, encoder: str | None, area: str, index: int) -> str:
    """`pattern` with its wildcards given, the index as ``0003``."""
    name = image_name(index)  # checks the index
    return pattern.format(encoder=encoder, area=area, index=name[3:-3])
