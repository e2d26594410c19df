"""
Checking per-image files before Stage 5 uses them.

A per-image file (upstream's ``img{i:04d}.pt``, written by
`multigeom.pipeline.per_image.estimate_images`) is good when it loads, holds every key
upstream writes with the right shapes (eigenvalues ``(top_k,)``, eigenvectors
``(top_k, 4096)``, finite floats), belongs to its configuration and image (its
``encoder_name``, ``area``, ``img_idx`` and ``image``), and was made with the run's
settings (seed, the configuration's with ``monte_carlo_seeds: per_configuration``,
observation noise sigma, the estimator's and the diffusion model's
settings recorded in its provenance, compared in canonical form:
`multigeom_workflow.settings.identity`). Provenance fields that do not change the
result (``engine``, ``precision``, the device, the time) are not compared.

A bad file is named with its problem; `set_aside` renames it to ``<name>.bad`` so that
the next run (Snakemake sees the file missing) recomputes it, and the bad bytes stay
for inspection.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..settings.identity import canonical
from ..settings.layout import Computation, is_ceiling_file, parse_image_file
from ..settings.names import N_PIXELS

__all__ = [
    "PER_IMAGE_KEYS",
    "Expected",
    "check_per_image_file",
    "bad_per_image_files",
    "changed_since_checked",
    "read_checked",
    "refresh_checked",
    "run_files",
    "set_aside",
    "verify_for_stage5",
]

#: The keys of upstream's per-image file (`multigeom.pipeline.per_image`).
PER_IMAGE_KEYS = (
    "img_idx",
    "image",
    "encoder_name",
    "area",
    "G_eigenvalues",
    "G_eigenvectors",
    "J_eigenvalues",
    "J_eigenvectors",
    "estimator",
    "sigma",
    "elapsed_seconds",
    "diffusion_epoch",
    "provenance",
)
#: Settings keys that choose how, not what, is computed (issue: a faster engine or
#: another precision gives the same estimator): not compared.
IGNORED_SETTINGS = ("engine", "precision")


@dataclass(frozen=True)
class Expected:
    """
    What the run's per-image files must hold.

    Attributes
    ----------
    top_k : int
        Eigenpairs of G(x) and J(x) per file.
    seed : int
        The run's seed (image i seeded with seed + i), as the provenance records it.
    sigma : float
        The estimator's observation noise sigma.
    estimator, diffusion : dict or None
        The run's settings files, parsed; compared with the text the provenance
        records (None: not compared).
    monte_carlo_seeds : str
        Config key ``monte_carlo_seeds``: with ``per_configuration``, the provenance of
        a configuration's files records its own seed (`seed_of`).
    configurations : dict
        ``"<encoder>/<area>"`` -> ``sigma``, ``estimator``, ``diffusion`` of a
        configuration with settings of its own (config keys ``configs[i].estimator``,
        ``.diffusion``, ``.sigma``), replacing the run's for its files
        (`settings_of`).
    """

    top_k: int
    seed: int
    sigma: float
    estimator: dict | None = None
    diffusion: dict | None = None
    monte_carlo_seeds: str = "shared"
    configurations: dict = field(default_factory=dict)

    def settings_of(
        self, encoder: str, area: str
    ) -> tuple[float, dict | None, dict | None]:
        """The (sigma, estimator, diffusion) a configuration's files must record."""
        own = self.configurations.get(f"{encoder}/{area}", {})
        return (
            float(own.get("sigma", self.sigma)),
            own.get("estimator", self.estimator),
            own.get("diffusion", self.diffusion),
        )

    def seed_of(self, encoder: str, area: str, ceiling: bool = False) -> int:
        """
        The seed a configuration's per-image files record (image i seeded with it + i):
        `multigeom_workflow.settings.seeds.configuration_seed`; with `ceiling`, the
        seed of the noise ceiling's second estimates (`ceiling_estimator`: the run's
        seed + 10**6, rules/science.smk).
        """
        from ..settings.seeds import CEILING_SEED_OFFSET, configuration_seed

        if ceiling:
            return self.seed + CEILING_SEED_OFFSET
        return configuration_seed(self.seed, encoder, area, self.monte_carlo_seeds)

    @classmethod
    def of_scenario(cls, scenario) -> Expected:
        """The expectations of a `multigeom_workflow.scenario.Scenario`."""
        sigma = float(scenario.estimator["monte_carlo"]["observation_noise_sigma"])
        files = (scenario.estimator_file, scenario.diffusion_file)
        own = {}
        for c in scenario.configurations:
            if c.own:
                own[c.label] = {
                    "sigma": c.sigma,
                    "estimator": _settings(Path(c.estimator_file).read_text()),
                    "diffusion": _settings(Path(c.diffusion_file).read_text()),
                }
        return cls(
            top_k=scenario.top_k,
            seed=scenario.seed,
            sigma=sigma,
            estimator=_settings(Path(files[0]).read_text()),
            diffusion=_settings(Path(files[1]).read_text()),
            monte_carlo_seeds=scenario.monte_carlo_seeds,
            configurations=own,
        )


def _settings(text: str) -> dict | None:
    """
    Settings YAML text, parsed, without the keys that do not change results, in
    canonical form (`multigeom_workflow.settings.identity.canonical`: key order,
    the way numbers are written, the estimator's defaults and its ``device`` do not
    count), as the rules record settings.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict):
        return None
    return canonical({k: v for k, v in data.items() if k not in IGNORED_SETTINGS})


def _tensor_problem(d: dict, key: str, shape: tuple[int, ...]) -> str | None:
    import torch

    value = d[key]
    if value is None:
        return f"{key} is None"
    if not isinstance(value, torch.Tensor):
        return f"{key} is a {type(value).__name__}, not a tensor"
    if tuple(value.shape) != shape:
        return f"{key} has shape {tuple(value.shape)}, expected {shape}"
    if not value.is_floating_point():
        return f"{key} has dtype {value.dtype}, expected a float"
    if not bool(torch.isfinite(value).all()):
        return f"{key} holds NaN or infinite values"
    return None


def inspect_per_image_file(
    path: str | Path,
    *,
    encoder: str,
    area: str,
    index: int,
    expected: Expected,
    image_file: str | Path | None = None,
    ceiling: bool = False,
) -> tuple[str | None, dict | None]:
    """
    The problem of a per-image file in a few words (None when it is good), and its
    dict when it loads (None when it does not): `check_per_image_file`'s check, for a
    reader that needs the file's values too (its ``elapsed_seconds``).

    Parameters
    ----------
    path : str or Path
        The file ``.../per_image/<encoder>/<area>/img{index:04d}.pt`` (or
        ``.../per_image_ceiling/...``, a noise ceiling's second estimate: `ceiling`).
    encoder, area : str
        Its configuration.
    index : int
        Its test image's index.
    expected : Expected
        The run's settings.
    image_file : str or Path, optional
        The test image: the file's ``image`` must be its canonical image
        (`multigeom_workflow.inputs.images.load_test_image`), to 1e-6.
    ceiling : bool
        The file is a noise ceiling's second estimate: its seed is the ceiling's
        (`Expected.seed_of`).

    Returns
    -------
    (str or None, dict or None)
    """
    import torch

    path = Path(path)
    if not path.is_file():
        return "is missing", None
    if path.stat().st_size == 0:
        return "is empty (0 bytes)", None
    try:
        d = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # truncated zip, pickle errors, ...
        reason = " ".join(str(err).split())[:120]
        return f"does not load ({type(err).__name__}: {reason})", None
    if not isinstance(d, dict):
        return f"holds a {type(d).__name__}, not upstream's per-image dict", None
    missing = [k for k in PER_IMAGE_KEYS if k not in d]
    if missing:
        return f"has no {', '.join(missing)}", d
    k = expected.top_k
    for key, shape in (
        ("G_eigenvalues", (k,)),
        ("G_eigenvectors", (k, N_PIXELS)),
        ("J_eigenvalues", (k,)),
        ("J_eigenvectors", (k, N_PIXELS)),
        ("image", (1, 1, 64, 64)),
    ):
        problem = _tensor_problem(d, key, shape)
        if problem:
            return problem, d
    own = (d["encoder_name"], d["area"], d["img_idx"])
    if own != (encoder, area, index):
        return (
            f"belongs to {own[0]}/{own[1]} image {own[2]}, not {encoder}/{area} "
            f"image {index}"
        ), d
    if image_file is not None:
        from ..inputs.images import load_test_image

        try:
            x = load_test_image(image_file)
        except Exception:  # the image's own problem: its job or the scenario names it
            x = None
        if x is not None and not torch.allclose(
            d["image"].reshape(x.shape), x, rtol=0, atol=1e-6
        ):
            return f"was made from another image than {str(image_file)!r}", d
    sigma, *settings = expected.settings_of(encoder, area)
    if not isinstance(d["sigma"], (int, float)) or not math.isclose(
        float(d["sigma"]), sigma, rel_tol=1e-9
    ):
        return f"was made with sigma = {d['sigma']}, the run's is {sigma}", d
    prov = d["provenance"] if isinstance(d["provenance"], dict) else {}
    seed = expected.seed_of(encoder, area, ceiling)
    if "seed" in prov and prov["seed"] != seed:
        return f"was made with seed {prov['seed']}, the run's is {seed}", d
    for name, want in zip(("estimator", "diffusion"), settings, strict=True):
        record = (prov.get("configs") or {}).get(name)
        if want is None or not isinstance(record, dict) or "text" not in record:
            continue
        if _settings(record["text"]) != want:
            return (
                f"was made with other {name} settings ({record.get('path', '?')}) "
                "than the run's"
            ), d
    return None, d


def check_per_image_file(path: str | Path, **where) -> str | None:
    """
    The problem of a per-image file in a few words, or None when it is good: the
    first half of `inspect_per_image_file`, whose keyword parameters (``encoder``,
    ``area``, ``index``, ``expected``, ``image_file``, ``ceiling``) it takes.
    """
    return inspect_per_image_file(path, **where)[0]


def run_files(scenario) -> list[tuple[str, Computation]]:
    """
    (path, computation) of every per-image file of `scenario`
    (`Scenario.computations`: the first estimates of its first n_images images, then
    the noise ceiling's second estimates of its first ceiling_images images), in the
    run's order.
    """
    return [(scenario.layout.file_of(c), c) for c in scenario.computations()]


def bad_per_image_files(
    scenario, *, check_images: bool = True, only: Iterable[str] | None = None
) -> list[tuple[str, str]]:
    """
    (file, problem) of every per-image file of `scenario` (first estimates and the
    noise ceiling's second ones) that exists and is bad, in the run's order. Missing
    files are not listed (the run computes them). With `only`, just those paths.
    """
    expected = Expected.of_scenario(scenario)
    only = None if only is None else set(map(str, only))
    out = []
    for f, c in run_files(scenario):
        if (only is not None and f not in only) or not os.path.exists(f):
            continue
        problem = check_per_image_file(
            f,
            encoder=c.encoder,
            area=c.area,
            index=c.index,
            expected=expected,
            image_file=scenario.test_image_files[c.index] if check_images else None,
            ceiling=c.ceiling,
        )
        if problem:
            out.append((f, problem))
    return out


#: The columns of the check's list (`verify_for_stage5`'s output), tab-separated; the
#: rule's params hold it, so that a list of another form is written again (the check
#: runs once more; a list of the older four columns reads, its seconds unknown).
CHECKED_LIST_COLUMNS = "path size mtime_ns ctime_ns elapsed_seconds"


def _seconds_text(d: dict | None) -> str:
    """A per-image dict's ``elapsed_seconds`` as the list writes it ("" if none)."""
    seconds = (d or {}).get("elapsed_seconds")
    return f"{float(seconds)!r}" if isinstance(seconds, (int, float)) else ""


def _file_seconds_text(path: str | Path) -> str:
    """`_seconds_text` of a per-image file, read now ("" if it does not load)."""
    import torch

    try:
        d = torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # a damaged file: the check names it, not this
        return ""
    return _seconds_text(d if isinstance(d, dict) else None)


def _checked_key(path: str | Path, st: os.stat_result | None = None) -> str:
    """
    A file's size, modification and status-change times (ns), tab-separated (`st`:
    its `os.stat` when already taken).
    """
    st = os.stat(path) if st is None else st
    return f"{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}"


def _checked_rows(checked: str | Path) -> dict[str, tuple[str, str]]:
    """
    The list `verify_for_stage5` wrote, {path: (its `_checked_key` when checked, its
    ``elapsed_seconds`` as written, "" when unknown)}; {} when there is none.
    """
    try:
        lines = Path(checked).read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        path, *fields = line.split("\t")
        if path:
            out[path] = ("\t".join(fields[:3]), (fields[3:] or [""])[0])
    return out


def read_checked(checked: str | Path) -> dict[str, str]:
    """The list `verify_for_stage5` wrote: {path: its `_checked_key` when checked}."""
    return {path: key for path, (key, _) in _checked_rows(checked).items()}


def checked_seconds(checked: str | Path) -> dict[str, float]:
    """
    {path: the estimator's ``elapsed_seconds`` (seconds of upstream's per-image
    estimate, as the file records it)} of the checked files that record it, from the
    check's list `checked` (the report's seconds per image: no file is read again).
    """
    out = {}
    for path, (_, seconds) in _checked_rows(checked).items():
        try:
            out[path] = float(seconds)
        except ValueError:
            continue  # a list of an older version, or a file without the record
    return out


def checked_files(checked: str | Path, ceiling: bool = False) -> list[str]:
    """
    The per-image files the check found good, from its list `checked` (the output of
    rule verify_per_image_files), in its order: the run's estimates, or with
    `ceiling` the noise ceiling's second estimates. Stage 5 and the report read these,
    so that nothing reaches them unchecked.

    Raises
    ------
    FileNotFoundError
        If `checked` does not exist (the check has not run).
    """
    if not Path(checked).is_file():
        raise FileNotFoundError(f"the check's list {str(checked)!r} does not exist")
    return [f for f in _checked_rows(checked) if is_ceiling_file(f) == ceiling]


def changed_since_checked(
    files: Iterable[str | Path], checked: str | Path
) -> list[str]:
    """
    The files of `files` that exist, are not newer than the check's list `checked`
    (Snakemake would run the check again for a newer one), and differ from what was
    checked (size, modification or status-change time): rewritten, truncated or
    replaced with their date kept (``cp -p``, a sync preserving times, a disk fault).
    Snakemake, which follows dates, would hand them to Stage 5 unchecked.
    """
    try:
        checked_at = os.stat(checked).st_mtime_ns
    except OSError:
        return []  # no check yet: the check runs before Stage 5
    known = read_checked(checked)
    out = []
    for f in map(str, files):
        try:
            st = os.stat(f)
        except OSError:
            continue
        if st.st_mtime_ns <= checked_at and known.get(f) != _checked_key(f, st):
            out.append(f)
    return out


def set_aside(files: Iterable[str | Path]) -> list[Path]:
    """
    Rename each file to ``<name>.bad`` (replacing an older one), so that Snakemake
    sees it missing and recomputes it; returns the new paths.
    """
    out = []
    for f in files:
        f = Path(f)
        aside = f.with_name(f.name + ".bad")
        f.replace(aside)
        out.append(aside)
    return out


def refresh_checked(checked: str | Path, good: Iterable[str | Path]) -> None:
    """
    Record the current `_checked_key` and ``elapsed_seconds`` of `good` files
    (checked again and found good, e.g. after a copy that kept their dates) in the
    check's list `checked`, keeping
    the list's own date, so that they are not checked again at every parse and
    Stage 5 does not run again for the same files.
    """
    from ..atomic import atomic_path

    good = {str(f) for f in good}
    if not good:
        return
    st = os.stat(checked)
    rows = _checked_rows(checked)
    for path in sorted(good):  # few: the files changed behind the check's back
        rows[path] = (_checked_key(path), _file_seconds_text(path))
    rows = [f"{path}\t{key}\t{seconds}" for path, (key, seconds) in rows.items()]
    with atomic_path(checked) as tmp:
        Path(tmp).write_text("\n".join(rows) + "\n")
    os.utime(checked, ns=(st.st_atime_ns, st.st_mtime_ns))


def verify_for_stage5(
    per_image_files: Iterable[str | Path],
    image_files: list[str],
    expected: Expected,
    out: str | Path,
) -> Path:
    """
    Check every per-image file Stage 5 will read, the noise ceiling's second estimates
    too (the job before Stage 5, so that a bad file stops the run before Snakemake
    deletes the previous metrics); write `out`, the list of the good files (path, then
    `_checked_key`: bytes, modification and status-change times, then the file's
    ``elapsed_seconds``: the report's seconds per image), when all are good.

    Parameters
    ----------
    per_image_files : iterable of path
        ``.../per_image/<encoder>/<area>/img{i:04d}.pt`` and
        ``.../per_image_ceiling/<encoder>/<area>/img{i:04d}.pt``: the folders name
        the kind and the configuration, the file name the image.
    image_files : list of str
        The test set: image i is ``image_files[i]``.
    expected : Expected
    out : str or Path
        The list, written atomically.

    Raises
    ------
    RuntimeError
        One line naming the bad files (set aside as ``<name>.bad``, so that the next
        run recomputes them), the first one's problem, and what to do.
    """
    from ..atomic import atomic_path

    rows, bad = [], []
    for f in map(Path, per_image_files):
        key = parse_image_file(f)
        problem, d = inspect_per_image_file(
            f,
            encoder=key.encoder,
            area=key.area,
            index=key.index,
            expected=expected,
            image_file=image_files[key.index],
            ceiling=is_ceiling_file(f),
        )
        if problem:
            print(f"bad per-image file {f}: {problem}")
            bad.append((f, problem))
        else:
            rows.append(f"{f}\t{_checked_key(f)}\t{_seconds_text(d)}")
    if bad:
        set_aside(f for f, _ in bad)
        first, problem = bad[0]
        raise RuntimeError(
            f"{len(bad)} per-image file(s) are bad and were set aside as <name>.bad "
            f"(first: {first} {problem}); run the workflow again to recompute them "
            "(`multigeom-workflow verify` lists bad files)"
        )
    with atomic_path(out) as tmp:
        Path(tmp).write_text("\n".join(rows) + "\n")
    return Path(out)
