"""
The scenario of a run: which (encoder, area) configurations, which test images, which
estimator settings, and where every file lives, read from the workflow's configuration.

`load_scenario` checks everything that the JSON schema cannot (files that must exist,
the size of the test set, settings that must agree between the estimator and the
diffusion model: `multigeom_workflow.settings.checks`) before any job runs. Every
problem is one `ConfigError` whose message is a single line naming the key, the value
and what is allowed.

Nothing here imports torch: the Snakefile calls this module at parse time, which must
stay fast for `snakemake -n`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from .compute.gpus import resolve_device
from .inputs.fetch import missing_backbone_weights
from .inputs.images import (
    DEMO_TEST_PHOTOS,
    list_folder_images,
    list_tinyimagenet_val,
    tinyimagenet_val_files,
)
from .settings.checks import check_engine, check_estimator, check_seed, check_writable
from .settings.errors import ConfigError, schema_error_line
from .settings.files import load_settings_yaml, resolve_settings_file
from .settings.layout import RunLayout
from .settings.names import DEMO_AREAS, DEMO_ENCODERS, PAPER_ENCODERS, TINYIMAGENET_DIR
from .settings.pairs import pair_kind

__all__ = [
    "ConfigError",
    "Configuration",
    "Scenario",
    "load_scenario",
    "validated_scenario",
]


@dataclass(frozen=True)
class Configuration:
    """
    One (encoder, area) configuration and its two checkpoints.

    Attributes
    ----------
    encoder, area : str
        Names, e.g. ``("inception", "V1")``.
    encoder_ckpt, diffusion_ckpt : str
        Paths of the fitted encoder and of its conditional diffusion model, relative to
        the working directory or absolute.
    """

    encoder: str
    area: str
    encoder_ckpt: str
    diffusion_ckpt: str

    @property
    def is_demo(self) -> bool:
        """True when the workflow builds the checkpoints itself (a demo area)."""
        return self.area in DEMO_AREAS


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
    warm_workers: bool = True
    blockers: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    engine: str = "fast"
    precision: str = "fp32"
    monte_carlo_seeds: str = "shared"
    ceiling_images: int = 0
    results_dir: str = "results"

    def estimator_of(self, encoder: str, area: str) -> dict:
        """A configuration's estimator settings: its seed (monte_carlo_seeds)."""
        from .settings.seeds import configuration_estimator

        return configuration_estimator(
            self.estimator, encoder, area, self.monte_carlo_seeds
        )

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
            f"no GPU found (config key 'device' = {self.device_asked!r}): the "
            "per-image jobs run on the CPU here (on Modal, on its GPUs)"
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

    def configuration(self, encoder: str, area: str) -> Configuration:
        """The configuration named (encoder, area); KeyError if it is not in the run."""
        for c in self.configurations:
            if (c.encoder, c.area) == (encoder, area):
                return c
        raise KeyError(f"({encoder!r}, {area!r}) is not a configuration of this run")

    @property
    def layout(self) -> RunLayout:
        """Where the run's files live (`multigeom_workflow.settings.layout`)."""
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

    def ceiling_files(self, configuration: Configuration | None = None) -> list[str]:
        """Second estimates of one configuration (or of all), first `ceiling_images`."""
        configs = self.configurations if configuration is None else (configuration,)
        return [
            self.ceiling_file(c.encoder, c.area, i)
            for c in configs
            for i in range(self.ceiling_images)
        ]


def _test_images(
    config: dict, runs_dir: str, remote: bool = False
) -> tuple[str, tuple[str, ...]]:
    settings = config["test_images"]
    source, path = settings["source"], settings.get("path")
    if source == "demo":
        layout = RunLayout(runs_dir)
        files = [layout.demo_test_image(i) for i in range(len(DEMO_TEST_PHOTOS))]
        return source, tuple(files)
    if not path:
        raise ConfigError(
            f"config key 'test_images.path' = {path!r}: a folder is required when "
            f"test_images.source is {source!r}"
        )
    if source == "tinyimagenet" and (settings.get("download") or remote):
        # Known before the download; the workflow's rules fetch what is needed. A
        # remote job (a Modal container) holds only its own images: known names too.
        return source, tuple(tinyimagenet_val_files(path))
    if remote:
        raise ConfigError(
            f"config key 'test_images.source' = {source!r}: not supported with a "
            "remote executor (a container holds only its shard's images, so the "
            "folder's order cannot be read there); use source tinyimagenet or demo, "
            "or run locally"
        )
    folder = Path(path)
    lister = list_tinyimagenet_val if source == "tinyimagenet" else list_folder_images
    if not folder.is_dir():
        what = (
            "the folder that holds tiny-imagenet-200/val (or set "
            "test_images.download: true)"
            if source == "tinyimagenet"
            else "a folder of image files"
        )
        raise ConfigError(
            f"config key 'test_images.path' = {path!r}: no such folder; give {what}"
        )
    files = lister(folder)
    if not files:
        raise ConfigError(
            f"config key 'test_images.path' = {path!r}: no test images found there "
            f"for source {source!r}"
        )
    return source, tuple(str(f) for f in files)


def _normalise_test_images_path(config: dict) -> tuple[str, ...]:
    """
    ``test_images.path`` of source tinyimagenet given as the ``tiny-imagenet-200``
    folder itself becomes the folder that holds it (in `config`, which the rules and a
    remote job's own parse then read alike), with one notice. A folder of another name
    that holds ``val`` directly is refused: a remote job, which lists no folder, knows
    the images only as ``<path>/tiny-imagenet-200/val/images/val_<i>.JPEG``.
    """
    settings = config["test_images"]
    path = settings.get("path")
    if settings["source"] != "tinyimagenet" or not path:
        return ()
    folder = Path(path)
    if (folder / TINYIMAGENET_DIR / "val").is_dir():
        return ()
    if folder.name == TINYIMAGENET_DIR:
        parent = str(folder.parent)
        settings["path"] = parent
        return (
            f"note: config key 'test_images.path' = {path!r} is TinyImageNet's folder "
            f"itself: read as the folder that holds it, {parent!r}",
        )
    if (folder / "val").is_dir():
        raise ConfigError(
            f"config key 'test_images.path' = {path!r}: holds val/ directly; name that "
            f"folder {TINYIMAGENET_DIR!r} and give the folder that holds it"
        )
    return ()


def _check_device(device: str):
    """``cuda:N`` must name a GPU this machine shows (when it shows any)."""
    from .compute.gpus import visible_gpu_ids

    if not device.startswith("cuda:"):
        return
    ids = visible_gpu_ids()
    if ids and int(device.split(":")[1]) >= len(ids):
        allowed = ", ".join(f"cuda:{i}" for i in range(len(ids)))
        raise ConfigError(
            f"config key 'device' = {device!r}: this machine shows {len(ids)} GPU(s); "
            f"allowed: {allowed}, cuda (any free GPU), auto or cpu"
        )


def _check_readable(files):
    """Every test image of the run opens as an image (named otherwise)."""
    from .inputs.images import check_test_image

    for i, f in enumerate(files):
        problem = check_test_image(f)
        if problem:
            raise ConfigError(
                f"config key 'test_images.path': test image {i} {str(f)!r} {problem}; "
                "replace or remove it (images are taken in name order)"
            )


def _configurations(
    config: dict, runs_dir: str, check_files: bool = True
) -> tuple[Configuration, ...]:
    entries = config["configs"]
    if isinstance(entries, dict):  # a single pair is accepted
        entries = [entries]
    out, seen = [], set()
    for i, entry in enumerate(entries):
        enc, area = entry["encoder"], entry["area"]
        key = f"configs[{i}]"
        if (enc, area) in seen:
            raise ConfigError(
                f"config key {key!r} = {enc}/{area}: listed twice; each (encoder, "
                "area) configuration is allowed once"
            )
        seen.add((enc, area))
        demo = area in DEMO_AREAS
        if demo and enc not in DEMO_ENCODERS:
            raise ConfigError(
                f"config key '{key}.encoder' = {enc!r}: the demo area {area!r} is "
                f"built for the demo encoders only; allowed: {', '.join(DEMO_ENCODERS)}"
            )
        if not demo and enc not in PAPER_ENCODERS:
            raise ConfigError(
                f"config key '{key}.encoder' = {enc!r}: no checkpoints of it exist for "
                f"area {area!r}; allowed: {', '.join(PAPER_ENCODERS)}"
            )
        enc_ckpt = entry.get("encoder_ckpt") or RunLayout(runs_dir).encoder_ckpt(
            enc, area
        )
        diff_ckpt = entry.get("diffusion_ckpt") or RunLayout(runs_dir).diffusion_ckpt(
            enc, area
        )
        # The workflow's rules build the demo's checkpoints and fetch the paper's
        # from the Hub; any other file must exist (bring your own encoder).
        built = demo or config["checkpoints"]["source"] == "hub"
        for name, value in (("encoder_ckpt", enc_ckpt), ("diffusion_ckpt", diff_ckpt)):
            must_exist = check_files and (entry.get(name) or not built)
            if must_exist and not Path(value).is_file():
                hint = "" if demo else ", or set checkpoints.source: hub"
                raise ConfigError(
                    f"config key '{key}.{name}' = {value!r}: no such checkpoint "
                    f"file; give the path of the {enc}/{area} checkpoint{hint}"
                )
        out.append(Configuration(enc, area, enc_ckpt, diff_ckpt))
    return tuple(out)


def _blockers(configurations) -> tuple[str, ...]:
    """Problems that stop a real run before any job but not a dry run (its plan)."""
    out, seen = [], set()
    for i, c in enumerate(configurations):
        missing = missing_backbone_weights(c.encoder)
        if missing and c.encoder not in seen:
            seen.add(c.encoder)
            out.append(
                f"config key 'configs[{i}].encoder' = {c.encoder!r}: torchvision's "
                f"backbone weights {missing[0]} are missing; with network, cache them "
                f"with {missing[1]} (or set TORCH_HOME to a folder that has them)"
            )
    return tuple(out)


def validated_scenario(
    config: dict, workflow_dir: str | Path, remote: bool = False
) -> Scenario:
    """
    Validate `config` against the workflow's schema (Snakemake's `validate`, which also
    fills the defaults in `config`), then `load_scenario` (`remote`: see there). A
    single ``configs`` mapping is turned into a list of one first.

    Raises
    ------
    ConfigError
        One line naming the key, the value and what is allowed.
    """
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if isinstance(config.get("configs"), dict):
        config["configs"] = [config["configs"]]
    schema = Path(workflow_dir) / "config" / "schemas" / "config.schema.yaml"
    try:
        validate(config, str(schema))
    except WorkflowError as err:
        cause = err.__context__  # what Snakemake's validate raised from
        if not isinstance(cause, jsonschema.ValidationError):
            raise
        raise ConfigError(schema_error_line(cause)) from None
    return load_scenario(config, workflow_dir, remote)


def load_scenario(
    config: dict, workflow_dir: str | Path, remote: bool = False
) -> Scenario:
    """
    Build and check the scenario of a configuration already validated by the schema
    (``config/schemas/config.schema.yaml``, which also fills the defaults).

    Parameters
    ----------
    config : dict
        Snakemake's ``config``.
    workflow_dir : str or Path
        The folder of the Snakefile: relative settings files are looked up there after
        the working directory.
    remote : bool
        The scenario of a job that Snakemake runs remotely (in a Modal container),
        which holds only that job's inputs: checkpoints are not checked, and test
        images are not listed from a folder.

    Returns
    -------
    Scenario

    Raises
    ------
    ConfigError
        One line naming the key, the value and what is allowed: a checkpoint or a test
        image folder that does not exist, `n_images` larger than the test set, settings
        of the estimator that the diffusion model or `top_k` contradict.
    """
    workflow_dir = Path(workflow_dir)
    runs_dir = RunLayout(str(config["runs_dir"])).runs_dir  # "runs/" is "runs"
    configurations = _configurations(config, runs_dir, check_files=not remote)
    notes = _normalise_test_images_path(config)
    source, files = _test_images(config, runs_dir, remote)
    n_images = int(config["n_images"])
    if n_images > len(files):
        raise ConfigError(
            f"config key 'n_images' = {n_images}: the test set of source {source!r} "
            f"has {len(files)} images; allowed: 1 to {len(files)}"
        )
    listed = source == "folder" or (
        source == "tinyimagenet" and not config["test_images"]["download"]
    )
    if listed and not remote:  # files already there: each must read as an image
        _check_readable(files[:n_images])
    ceiling_images = int(config.get("noise_ceiling_images") or 0)
    if ceiling_images > n_images:
        raise ConfigError(
            f"config key 'noise_ceiling_images' = {ceiling_images}: the ceiling "
            f"compares images of the run; allowed: 0 to n_images ({n_images})"
        )
    seeds = str(config.get("monte_carlo_seeds", "shared"))
    check_seed(int(config["seed"]), n_images, ceiling_images, configurations, seeds)
    _check_device(str(config["device"]))
    if not remote:
        check_writable(config, runs_dir, configurations)
    est_file = resolve_settings_file(
        str(config["estimator"]), "estimator", workflow_dir
    )
    diff_file = resolve_settings_file(
        str(config["diffusion"]), "diffusion", workflow_dir
    )
    estimator = copy.deepcopy(load_settings_yaml(est_file, "estimator"))
    diffusion = load_settings_yaml(diff_file, "diffusion")
    top_k, seed = int(config["top_k"]), int(config["seed"])
    check_estimator(estimator, diffusion, top_k, est_file, diff_file)
    estimator["seed"] = seed
    estimator["top_k"] = top_k
    estimator.setdefault("fisher_baseline", {"enabled": True})["top_k"] = top_k
    device = resolve_device(str(config["device"]))
    engine, precision = check_engine(config, device, remote)
    return Scenario(
        configurations=configurations,
        n_images=n_images,
        runs_dir=runs_dir,
        seed=seed,
        top_k=top_k,
        device=device,
        device_asked=str(config["device"]),
        warm_workers=config["workers"] == "warm",
        estimator=estimator,
        estimator_file=est_file,
        diffusion=diffusion,
        diffusion_file=diff_file,
        test_source=source,
        test_image_files=files,
        modal=dict(config["modal"]),
        blockers=_blockers(configurations),
        notes=notes,
        engine=engine,
        precision=precision,
        monte_carlo_seeds=seeds,
        ceiling_images=ceiling_images,
        results_dir=str(config["results_dir"]),
    )
