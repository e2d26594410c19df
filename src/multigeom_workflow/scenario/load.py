"""
Reading a run's scenario from the workflow's configuration: `validated_scenario`
(the JSON schema, then `load_scenario`) and `load_scenario`, which checks everything
the schema cannot (files that must exist, the size of the test set, settings that must
agree between the estimator and the diffusion model:
`multigeom_workflow.settings.checks`) before any job runs. Every problem is one
`ConfigError` whose message is a single line naming the key, the value and what is
allowed.

Nothing here imports torch: the Snakefile calls this module at parse time, which must
stay fast for `snakemake -n`.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

from ..compute import gpus
from ..compute.gpus import gpu_index, resolve_device
from ..inputs.fetch import missing_backbone_weights
from ..inputs.images import (
    DEMO_TEST_PHOTOS,
    list_folder_images,
    list_tinyimagenet_val,
    tinyimagenet_val_files,
)
from ..settings.checks import check_engine, check_estimator, check_seed, check_writable
from ..settings.errors import ConfigError, schema_error_line
from ..settings.files import load_settings_yaml, resolve_settings_file
from ..settings.layout import RunLayout
from ..settings.names import (
    ARCHITECTURES,
    DEMO_AREAS,
    DEMO_ENCODERS,
    PAPER_AREAS,
    PAPER_ENCODERS,
    TINYIMAGENET_DIR,
    configuration_label,
    default_architecture,
)
from .model import Configuration, Scenario

__all__ = ["ConfigError", "load_scenario", "validated_scenario"]


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


def _check_device(device: str, ids: list[str]):
    """``cuda:N`` must name a GPU this machine shows (`ids`, when it shows any)."""
    index = gpu_index(device)
    if index is not None and ids and index >= len(ids):
        allowed = ", ".join(f"cuda:{i}" for i in range(len(ids)))
        raise ConfigError(
            f"config key 'device' = {device!r}: this machine shows {len(ids)} GPU(s); "
            f"allowed: {allowed}, cuda (any free GPU), auto or cpu"
        )


def _checked_test_images(files) -> str | None:
    """
    The notice for the test images of the run that are not 64 x 64, or None, once
    every one of them opens as an image (`check_test_images`: both in one pass).

    Raises
    ------
    ConfigError
        Naming the first image that does not open, and why.
    """
    from ..inputs.images import check_test_images

    bad, notice = check_test_images(files)
    if bad:
        i, problem = bad
        raise ConfigError(
            f"config key 'test_images.path': test image {i} {str(files[i])!r} "
            f"{problem}; replace or remove it (images are taken in name order)"
        )
    return notice


def _configurations(
    config: dict, runs_dir: str, check_files: bool = True
) -> tuple[Configuration, ...]:
    """
    The run's configurations, checked: each (encoder, area) listed once, its
    architecture named (`_architecture`), its checkpoints there unless the workflow
    makes them (`_checkpoints`). Their settings are resolved later
    (`_configuration_settings`).
    """
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
        if area in DEMO_AREAS and enc not in DEMO_ENCODERS:
            raise ConfigError(
                f"config key '{key}.encoder' = {enc!r}: the demo area {area!r} is "
                "built for the demo encoders only; allowed: "
                f"{', '.join(DEMO_ENCODERS)} (or give your own area another name)"
            )
        architecture = _architecture(entry, key)
        enc_ckpt, diff_ckpt = _checkpoints(config, entry, key, runs_dir, check_files)
        out.append(Configuration(enc, area, enc_ckpt, diff_ckpt, architecture))
    return tuple(out)


def _architecture(entry: dict, key: str) -> str:
    """
    What upstream builds the configuration's encoder from: config key
    ``configs[i].architecture``, required for an encoder label of the user's; for the
    paper's and the demo's labels the known one, which a given one must equal.
    """
    enc, given = entry["encoder"], entry.get("architecture")
    known = default_architecture(enc)
    if given is None and known is None:
        raise ConfigError(
            f"config key '{key}.architecture' is missing: {enc!r} is an encoder label "
            "of your own, so name what upstream builds it from; allowed: "
            f"{', '.join(ARCHITECTURES)} (docs/own-data.md)"
        )
    if given is not None and known is not None and given != known:
        raise ConfigError(
            f"config key '{key}.architecture' = {given!r}: the encoder {enc!r} is "
            f"built as {known!r}; allowed: {known!r}, or give your encoder a label of "
            "its own"
        )
    return given or known


def _checkpoints(
    config: dict, entry: dict, key: str, runs_dir: str, check_files: bool
) -> tuple[str, str]:
    """
    The configuration's encoder and diffusion checkpoints: given, or the run layout's
    default paths. The workflow builds the demo areas' and fetches the paper's from
    the Hub (``checkpoints.source: hub``); any other must exist (bring your own).
    """
    enc, area = entry["encoder"], entry["area"]
    label = configuration_label(enc, area)
    layout = RunLayout(runs_dir)
    paths = {
        "encoder_ckpt": entry.get("encoder_ckpt") or layout.encoder_ckpt(enc, area),
        "diffusion_ckpt": entry.get("diffusion_ckpt")
        or layout.diffusion_ckpt(enc, area),
    }
    on_hub = enc in PAPER_ENCODERS and area in PAPER_AREAS
    built = area in DEMO_AREAS or (config["checkpoints"]["source"] == "hub" and on_hub)
    for name, value in paths.items():
        given = bool(entry.get(name))
        if not check_files or not (given or not built) or Path(value).is_file():
            continue
        what = "encoder" if name == "encoder_ckpt" else "diffusion-model"
        if given:
            raise ConfigError(
                f"config key '{key}.{name}' = {value!r}: no such checkpoint file; "
                f"give the path of the {label} {what} checkpoint"
            )
        hint = (
            ", or set checkpoints.source: hub (the paper's)"
            if on_hub
            else " (the workflow makes checkpoints for the demo's areas and fetches "
            "the paper's only; docs/own-data.md)"
        )
        raise ConfigError(
            f"config key '{key}.{name}' is not given and its default {value!r} does "
            f"not exist: give the path of the {label} {what} checkpoint{hint}"
        )
    return paths["encoder_ckpt"], paths["diffusion_ckpt"]


def _run_estimator(estimator: dict, seed: int, top_k: int) -> dict:
    """Estimator settings with the run's seed and top_k (also fisher_baseline's)."""
    estimator = copy.deepcopy(estimator)
    estimator["seed"] = seed
    estimator["top_k"] = top_k
    estimator.setdefault("fisher_baseline", {"enabled": True})["top_k"] = top_k
    return estimator


def _with_sigma(estimator: dict, diffusion: dict, sigma: float) -> tuple[dict, dict]:
    """
    Both settings with the observation noise sigma replaced: the estimator's
    ``monte_carlo.observation_noise_sigma`` and the diffusion model's training
    ``conditioning.observation_noise_sigma`` (upstream checks they are equal).
    """
    estimator, diffusion = copy.deepcopy(estimator), copy.deepcopy(diffusion)
    estimator.setdefault("monte_carlo", {})["observation_noise_sigma"] = sigma
    diffusion.setdefault("conditioning", {})["observation_noise_sigma"] = sigma
    return estimator, diffusion


def _configuration_settings(
    config: dict,
    configurations: tuple[Configuration, ...],
    run: tuple[dict, Path, dict, Path],
    workflow_dir: Path,
) -> tuple[Configuration, ...]:
    """
    Each configuration with its settings: its own ``estimator``, ``diffusion`` and
    ``sigma`` (config keys ``configs[i].…``) where given, the run's otherwise
    (`run`: the estimator, its file, the diffusion settings, its file, raw as read),
    the run's seed and top_k applied, checked as the run's are
    (`multigeom_workflow.settings.checks.check_estimator`, naming the
    configuration's keys).
    """
    entries = config["configs"]
    entries = [entries] if isinstance(entries, dict) else entries
    top_k, seed = int(config["top_k"]), int(config["seed"])
    run_est, run_est_file, run_diff, run_diff_file = run
    out = []
    for i, (entry, c) in enumerate(zip(entries, configurations, strict=True)):
        own = tuple(k for k in ("estimator", "diffusion", "sigma") if k in entry)
        if not own:
            est, diff = run_est, run_diff
            est_file, diff_file = run_est_file, run_diff_file
        else:
            key = f"configs[{i}]"
            est, est_file, est_key = run_est, run_est_file, "estimator"
            diff, diff_file, diff_key = run_diff, run_diff_file, "diffusion"
            if "estimator" in entry:
                est_key = f"{key}.estimator"
                est_file = resolve_settings_file(
                    str(entry["estimator"]), est_key, workflow_dir
                )
                est = load_settings_yaml(est_file, est_key)
            if "diffusion" in entry:
                diff_key = f"{key}.diffusion"
                diff_file = resolve_settings_file(
                    str(entry["diffusion"]), diff_key, workflow_dir
                )
                diff = load_settings_yaml(diff_file, diff_key)
            if "sigma" in entry:
                est, diff = _with_sigma(est, diff, float(entry["sigma"]))
            check_estimator(
                est, diff, top_k, est_file, diff_file, keys=(est_key, diff_key)
            )
        out.append(
            replace(
                c,
                estimator=_run_estimator(est, seed, top_k),
                estimator_file=est_file,
                diffusion=copy.deepcopy(diff),
                diffusion_file=diff_file,
                own=own,
            )
        )
    return tuple(out)


def _blockers(configurations) -> tuple[str, ...]:
    """Problems that stop a real run before any job but not a dry run (its plan)."""
    out, seen = [], set()
    for i, c in enumerate(configurations):
        missing = missing_backbone_weights(c.architecture)
        if missing and c.architecture not in seen:
            seen.add(c.architecture)
            built = (
                "" if c.architecture == c.encoder else f" (built as {c.architecture})"
            )
            out.append(
                f"config key 'configs[{i}].encoder' = {c.encoder!r}{built}: "
                f"torchvision's backbone weights {missing[0]} are missing; with "
                f"network, cache them with {missing[1]} (or set TORCH_HOME to a folder "
                "that has them)"
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
    read_as_yaml: set[tuple] = set()
    while True:
        try:
            validate(config, str(schema))
            break
        except WorkflowError as err:
            cause = err.__context__  # what Snakemake's validate raised from
            if not isinstance(cause, jsonschema.ValidationError):
                raise
            path = tuple(cause.absolute_path)
            if path not in read_as_yaml and _read_nested_text(config, cause):
                read_as_yaml.add(path)  # once: refused again, the error says why
                continue
            raise ConfigError(schema_error_line(cause)) from None
    return load_scenario(config, workflow_dir, remote)


def _read_nested_text(config: dict, error) -> bool:
    """
    Read a nested value given as text in YAML, where the schema refused the text:
    Snakemake parses ``--config key=value`` values as int, float, bool, then with
    YAML's BaseLoader, which leaves every value inside a mapping a string
    (snakemake/cli.py, `parse_config`): ``--config 'modal={gpu: T4, max_cost_usd:
    5}'`` gives ``max_cost_usd: '5'``. Returns whether the value was replaced (by an
    int, float, bool or null that YAML reads from it).
    """
    import yaml

    path = list(error.absolute_path)
    if len(path) < 2 or not isinstance(error.instance, str):
        return False
    try:
        value = yaml.safe_load(error.instance)
    except yaml.YAMLError:
        return False
    if isinstance(value, str) or not isinstance(value, (int, float, bool, type(None))):
        return False
    parent = config
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return True


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
        resized = _checked_test_images(files[:n_images])
        # (TinyImageNet's and the demo's images are 64 x 64: a folder's may not be)
        notes = (*notes, resized) if resized and source == "folder" else notes
    ceiling_images = int(config.get("noise_ceiling_images") or 0)
    if ceiling_images > n_images:
        raise ConfigError(
            f"config key 'noise_ceiling_images' = {ceiling_images}: the ceiling "
            f"compares images of the run; allowed: 0 to n_images ({n_images})"
        )
    seeds = str(config.get("monte_carlo_seeds", "shared"))
    check_seed(int(config["seed"]), n_images, ceiling_images, configurations, seeds)
    # the GPUs this machine shows, listed once for the run
    gpu_ids = () if config["device"] == "cpu" else tuple(gpus.visible_gpu_ids())
    _check_device(str(config["device"]), list(gpu_ids))
    if not remote:
        check_writable(config, runs_dir, configurations)
    est_file = resolve_settings_file(
        str(config["estimator"]), "estimator", workflow_dir
    )
    diff_file = resolve_settings_file(
        str(config["diffusion"]), "diffusion", workflow_dir
    )
    raw_estimator = load_settings_yaml(est_file, "estimator")
    diffusion = load_settings_yaml(diff_file, "diffusion")
    top_k, seed = int(config["top_k"]), int(config["seed"])
    check_estimator(raw_estimator, diffusion, top_k, est_file, diff_file)
    estimator = _run_estimator(raw_estimator, seed, top_k)
    configurations = _configuration_settings(
        config,
        configurations,
        (raw_estimator, est_file, diffusion, diff_file),
        workflow_dir,
    )
    device = resolve_device(str(config["device"]), list(gpu_ids))
    engine, precision = check_engine(config, device, remote)
    return Scenario(
        configurations=configurations,
        n_images=n_images,
        runs_dir=runs_dir,
        seed=seed,
        top_k=top_k,
        device=device,
        device_asked=str(config["device"]),
        gpu_ids=gpu_ids if device != "cpu" else (),
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
        draws_control=bool(config.get("shared_draws_control", True)),
    )
