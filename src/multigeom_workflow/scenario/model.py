"""
The scenario of a run as a value: its (encoder, area) configurations, test images,
estimator settings and where every file lives (`Configuration`, `Scenario`). Built and
checked by `multigeom_workflow.scenario.load`.

Nothing here imports torch: the Snakefile reads it at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..settings.layout import Computation, RunLayout
from ..settings.names import DEMO_AREAS, configuration_label
from ..settings.pairs import pair_kind

__all__ = ["Configuration", "Scenario"]


@dataclass(frozen=True)
class Configuration:
    """
    One (encoder, area) configuration: its two checkpoints and its settings.

    Attributes
    ----------
    encoder, area : str
        Labels, e.g. ``("inception", "V1")``: the paper's, the demo's or the user's
        (`multigeom_workflow.settings.names.NAME_PATTERN`).
    encoder_ckpt, diffusion_ckpt : str
        Paths of the fitted encoder and of its conditional diffusion model, relative to
        the working directory or absolute.
    architecture : str
        What upstream builds the encoder from
        (`multigeom_workflow.settings.names.ARCHITECTURES`): config key
        ``configs[i].architecture``, or the known one of the paper's and the demo's
        labels.
    estimator, diffusion : dict
        The configuration's estimator settings (the run's ``seed`` and ``top_k``
        applied, not yet its own seed: `Scenario.estimator_of`) and diffusion-model
        settings, as upstream's YAML files hold them, with its ``sigma`` applied to
        both; the run's unless the configuration gives its own. Empty until
        `multigeom_workflow.scenario.load` resolves them.
    estimator_file, diffusion_file : Path or None
        The files they were read from.
    own : tuple of str
        The settings keys the configuration gives itself (``estimator``,
        ``diffusion``, ``sigma``), in that order; empty when it takes the run's.
    """

    encoder: str
    area: str
    encoder_ckpt: str
    diffusion_ckpt: str
    architecture: str = ""
    estimator: dict = field(default_factory=dict, compare=False, hash=False)
    estimator_file: Path | None = None
    diffusion: dict = field(default_factory=dict, compare=False, hash=False)
    diffusion_file: Path | None = None
    own: tuple[str, ...] = ()

    @property
    def is_demo(self) -> bool:
        """True when the workflow builds the checkpoints itself (a demo area)."""
        return self.area in DEMO_AREAS

    @property
    def label(self) -> str:
        """``"<encoder>/<area>"`` (`settings.names.configuration_label`)."""
        return configuration_label(self.encoder, self.area)

    @property
    def sigma(self) -> float:
        """The observation noise sigma of its estimator settings."""
        return float(self.estimator["monte_carlo"]["observation_noise_sigma"])


@dataclass(frozen=True)
class Scenario:
    """
    Everything a run computes, validated.

    Attributes
    ----------
    configurations : tuple of Configuration
        In the order of the configuration file.
    n_images : int
        The first `n_images` test images are estimated for every configuration.
    runs_dir : str
        Root of upstream's run layout (``encoders/``, ``diffusion/``, ``per_image/``,
        ``metrics/``).
    seed, top_k : int
        Image i is seeded with ``seed + i`` (with `monte_carlo_seeds`
        ``per_configuration``: `multigeom_workflow.settings.seeds.configuration_seed` +
        i); ``top_k`` eigenpairs of G(x) and J(x) are kept, and Stage 5 compares k =
        1..top_k.
    device : str
        Where per-image jobs compute: ``"cpu"``, ``"cuda"`` (any free GPU, one per
        job) or ``"cuda:N"``, resolved from `device_asked` (``"auto"`` too) and the
        GPUs this machine shows (`multigeom_workflow.compute.gpus.resolve_device`).
    gpu_ids : tuple of str
        The GPUs this machine shows (``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi``),
        listed once for the run when `device` is CUDA; empty otherwise.
    estimator, diffusion : dict
        The estimator settings (with `seed` and `top_k` applied) and the diffusion-model
        settings, as upstream's YAML files hold them.
    estimator_file, diffusion_file : Path
        The files they were read from.
    test_image_files : tuple of str
        The whole ordered test set; image i is ``test_image_files[i]``.
    modal : dict
        The config's ``modal`` settings: ``gpu``, ``max_cost_usd``,
        ``prices_usd_per_s``.
    warm_workers : bool
        Per-image jobs hand their image to warm workers (config ``workers: warm``).
    blockers : tuple of str
        One-line problems that must stop a real run before any job, but not a dry run,
        which shows its plan with these as warnings (e.g. torchvision weights missing
        from its cache).
    notes : tuple of str
        One-line notices of values repaired at parse time (e.g. `test_images.path`
        given as the ``tiny-imagenet-200`` folder itself), printed once per run.
    engine, precision : str
        The per-image engine (``upstream`` or ``fast``) and the fast engine's precision
        (``fp32``, or ``tf32`` on a GPU); not rule params (like `device`).
    ceiling_images : int
        The first `ceiling_images` images of every configuration are estimated a
        second time with other seeds (config key ``noise_ceiling_images``), into
        `ceiling_file`.
    monte_carlo_seeds : str
        ``shared`` (every configuration draws image i's numbers from seed + i, the
        paper's way) or ``per_configuration`` (config key ``monte_carlo_seeds``).
    results_dir : str
        The figures and the report's tables (config key ``results_dir``); with
        `runs_dir`, the run's `layout`.
    draws_control : bool
        Config key ``shared_draws_control``: with shared draws and a noise ceiling,
        the figure's control of what the shared draws make (`draws_control_pairs`).
    """

    configurations: tuple[Configuration, ...]
    n_images: int
    runs_dir: str
    seed: int
    top_k: int
    device: str
    estimator: dict
    estimator_file: Path
    diffusion: dict
    diffusion_file: Path
    test_source: str
    test_image_files: tuple[str, ...]
    modal: dict
    device_asked: str = "cpu"
    gpu_ids: tuple[str, ...] = ()
    warm_workers: bool = True
    blockers: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    engine: str = "fast"
    precision: str = "fp32"
    monte_carlo_seeds: str = "shared"
    ceiling_images: int = 0
    results_dir: str = "results"
    draws_control: bool = True

    def estimator_of(self, encoder: str, area: str) -> dict:
        """
        A configuration's estimator settings (`Configuration.estimator`: its own or
        the run's) with its seed applied (config key ``monte_carlo_seeds``).
        """
        from ..settings.seeds import configuration_estimator

        return configuration_estimator(
            self.configuration(encoder, area).estimator,
            encoder,
            area,
            self.monte_carlo_seeds,
        )

    def diffusion_of(self, encoder: str, area: str) -> dict:
        """A configuration's diffusion settings (`Configuration.diffusion`)."""
        return self.configuration(encoder, area).diffusion

    @property
    def settings_per_configuration(self) -> bool:
        """
        Whether some configuration's estimator or diffusion settings differ from the
        run's (config keys ``configs[i].estimator``, ``.diffusion``, ``.sigma``): the
        rules then take each configuration's.
        """
        return any(
            c.estimator != self.estimator or c.diffusion != self.diffusion
            for c in self.configurations
        )

    @property
    def gpu_slots(self) -> int:
        """
        GPUs the run's per-image jobs share on this machine: 1 with ``cuda:N``, else
        the visible GPUs (`gpu_ids`, at least 1); 0 on the CPU.
        """
        if not self.uses_gpu:
            return 0
        return 1 if ":" in self.device else max(len(self.gpu_ids), 1)

    @property
    def uses_gpu(self) -> bool:
        """Whether the per-image jobs compute on a CUDA device."""
        return self.device.startswith("cuda")

    @property
    def gpu_fallback(self) -> str | None:
        """The one-line notice when a GPU was asked for and none is visible."""
        if self.device_asked in ("cpu", self.device) or self.uses_gpu:
            return None
        return (
            f"no GPU found (config key 'device' = {self.device_asked!r}): a local "
            "run's per-image jobs run on the CPU here (with the Modal or SLURM "
            "profile, on their GPUs)"
        )

    @property
    def comparable_pairs(self) -> list[tuple[Configuration, Configuration]]:
        """
        The pairs of configurations that Fig. 4D-E compares: cross-model (two encoders,
        same area) and cross-area (same encoder, two areas), as
        `multigeom_workflow.settings.pairs.pair_kind` classifies them.
        """
        cs = self.configurations
        return [
            (a, b)
            for i, a in enumerate(cs)
            for b in cs[i + 1 :]
            if pair_kind((a.encoder, a.area), (b.encoder, b.area)) is not None
        ]

    @property
    def stage5_skipped(self) -> str | None:
        """
        Why Stage 5 and the figure are left out of the run (None when they are not):
        no two configurations make a cross-model or cross-area comparison.
        """
        if self.comparable_pairs:
            return None
        names = ", ".join(f"{c.encoder}/{c.area}" for c in self.configurations)
        return (
            f"note: config key 'configs' = [{names}]: no two configurations share an "
            "area (cross-model) or an encoder (cross-area), so Stage 5 and the figure "
            "are left out; this run computes the per-image files only"
        )

    @property
    def draws_control_pairs(self) -> list[tuple[str, str]]:
        """
        The compared pairs (``"<enc>/<area>"`` labels) whose shared-draws control
        is computed (`multigeom_workflow.results.science.draws_control`): every
        comparable pair with ``monte_carlo_seeds: shared``, a noise ceiling and
        config key ``shared_draws_control`` true; else none.
        """
        if not (
            self.draws_control
            and self.monte_carlo_seeds == "shared"
            and self.ceiling_images
        ):
            return []
        return [(a.label, b.label) for a, b in self.comparable_pairs]

    @property
    def draws_control_line(self) -> str | None:
        """
        The run's line on the shared-draws control (every run and dry run says it):
        what Fig. 4D draws beside the shared curves, or that nothing controls for
        the shared draws; None without shared draws or a comparison.
        """
        if self.monte_carlo_seeds != "shared" or not self.comparable_pairs:
            return None
        n = self.ceiling_images
        if self.draws_control_pairs:
            return (
                f"shared-draws control: Fig. 4D draws, beside each compared pair's G "
                f"curve, its curve on the noise ceiling's {n} image(s) with "
                "independent draws (one configuration's first estimate against the "
                "other's second), in noise_ceiling.json too (config key "
                "shared_draws_control)"
            )
        why = (
            "config key 'shared_draws_control' = false"
            if self.ceiling_images
            else "config key 'noise_ceiling_images' = 0"
        )
        return (
            f"note: no shared-draws control ({why}): with monte_carlo_seeds shared, "
            "the G curves include the agreement of the draws the configurations "
            "share (docs/interpretation.md)"
        )

    def configuration(self, encoder: str, area: str) -> Configuration:
        """The configuration named (encoder, area); KeyError if it is not in the run."""
        for c in self.configurations:
            if (c.encoder, c.area) == (encoder, area):
                return c
        raise KeyError(f"({encoder!r}, {area!r}) is not a configuration of this run")

    @cached_property
    def layout(self) -> RunLayout:
        """
        Where the run's files live (`multigeom_workflow.settings.layout`), made once
        (the rules ask it for every per-image file).
        """
        return RunLayout(self.runs_dir, self.results_dir)

    def per_image_file(self, encoder: str, area: str, index: int) -> str:
        """The per-image file ``<runs_dir>/per_image/<enc>/<area>/img0003.pt``."""
        return self.layout.per_image_file(encoder, area, index)

    def per_image_files(self, configuration: Configuration | None = None) -> list[str]:
        """Per-image files of one configuration (or of all), first `n_images` images."""
        configs = self.configurations if configuration is None else (configuration,)
        return [
            self.per_image_file(c.encoder, c.area, i)
            for c in configs
            for i in range(self.n_images)
        ]

    def ceiling_file(self, encoder: str, area: str, index: int) -> str:
        """The noise ceiling's second estimate of an image (rules/science.smk)."""
        return self.layout.ceiling_file(encoder, area, index)

    def computations(self) -> list[Computation]:
        """
        Every per-image computation of the run, in the run's order: the first
        estimates of each configuration's first `n_images` images, then the noise
        ceiling's second estimates of their first `ceiling_images`.
        """
        return [
            Computation(c.encoder, c.area, i, ceiling)
            for ceiling, n in ((False, self.n_images), (True, self.ceiling_images))
            for c in self.configurations
            for i in range(n)
        ]

    def ceiling_files(self, configuration: Configuration | None = None) -> list[str]:
        """Second estimates of one configuration (or of all), first `ceiling_images`."""
        configs = self.configurations if configuration is None else (configuration,)
        return [
            self.ceiling_file(c.encoder, c.area, i)
            for c in configs
            for i in range(self.ceiling_images)
        ]
