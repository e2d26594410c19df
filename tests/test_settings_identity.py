"""
Reruns follow what changes a result (multigeom_workflow.settings.identity): settings
in canonical form as rules record them, older runs' records read in that form through
the adapter, and on a finished reduced demo, dry runs that plan nothing for a settings
file written differently and exactly the per-image computations and what follows them
for a change of n_samples.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, planned_jobs, run_snakemake

from multigeom_workflow import snakemake_adapter as adapter
from multigeom_workflow.settings.identity import canonical, recorded_in_canonical_form

TINY_ESTIMATOR = REPO / "tests" / "data" / "estimator_tiny.yaml"
TINY_DIFFUSION = REPO / "tests" / "data" / "diffusion_tiny.yaml"


def _as_loaded(estimator: dict, seed=42, top_k=5) -> dict:
    """The estimator settings as `multigeom_workflow.scenario.load` makes them (in
    place: the file's key order kept), before the canonical form."""
    out = json.loads(json.dumps(estimator))
    out["seed"], out["top_k"] = seed, top_k
    out.setdefault("fisher_baseline", {"enabled": True})["top_k"] = top_k
    return out


def _reordered(value):
    """`value` with every mapping's keys in reverse order."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    return value


def _written_differently(estimator: dict) -> dict:
    """The same settings as another user writes them: keys reversed, another device,
    numbers written otherwise, defaults left out."""
    other = _reordered(estimator)
    other["device"] = "cuda:3"
    other["n_test_images"] = 200
    other["monte_carlo"]["observation_noise_sigma"] = "2.2e-1"  # PyYAML: a string
    other["monte_carlo"]["timestep_grid"]["stop"] = 700.0
    other.pop("estimator")  # upstream's only estimator: the default
    other["fisher_baseline"].pop("enabled")  # the workflow's default: true
    return other


def test_canonical_form_of_numbers_keys_and_lists():
    # closed cases: each value written two ways has one form
    assert canonical({"b": 1.0, "a": ("1e-4", 0.5, "+3", "x1")}) == {
        "a": [0.0001, 0.5, 3, "x1"],
        "b": 1,
    }
    assert repr(canonical({"z": {"y": 2, "x": 1}})) == "{'z': {'x': 1, 'y': 2}}"
    assert canonical(True) is True and canonical(None) is None
    assert canonical(float("inf")) == float("inf")


def test_the_same_estimator_written_differently_is_one_identity():
    est = yaml.safe_load(TINY_ESTIMATOR.read_text())
    same = _written_differently(est)
    assert repr(canonical(_as_loaded(same))) == repr(canonical(_as_loaded(est)))
    # the estimator's defaults only where it is an estimator's settings
    assert canonical({"device": "cpu"}) == {"device": "cpu"}


@pytest.mark.parametrize(
    "change",
    [
        ("monte_carlo", "n_samples", 8),
        ("monte_carlo", "batch_size", 2),
        ("monte_carlo", "observation_noise_sigma", 0.3),
        ("fisher_baseline", "top_k", 4),
        (None, "seed", 43),
        (None, "top_k", 4),
    ],
)
def test_a_change_of_a_result_changes_the_identity(change):
    est = _as_loaded(yaml.safe_load(TINY_ESTIMATOR.read_text()))
    section, key, value = change
    other = json.loads(json.dumps(est))
    (other[section] if section else other)[key] = value
    assert repr(canonical(other)) != repr(canonical(est))


def test_an_older_record_reads_as_todays_params():
    # What the workflow recorded before the canonical form: the settings' reprs as
    # loaded (the file's order, device and n_test_images included), sorted as
    # Snakemake's PersistenceBase._params sorts them.
    est = _as_loaded(yaml.safe_load(TINY_ESTIMATOR.read_text()))
    diff = yaml.safe_load(TINY_DIFFUSION.read_text())
    old = sorted([repr(est), repr(diff)])
    today = sorted([repr(canonical(est)), repr(canonical(diff))])
    assert old != today  # the text differs: Snakemake alone would plan again
    assert sorted(recorded_in_canonical_form(old)) == today
    # a record of other settings still differs from today's params
    est["monte_carlo"]["n_samples"] = 8
    changed = recorded_in_canonical_form(sorted([repr(est), repr(diff)]))
    assert sorted(changed) != today
    # what is not a mapping's repr is read as it is
    assert recorded_in_canonical_form(["5", "'a'", "{not python"]) == [
        "5",
        "'a'",
        "{not python",
    ]
    assert recorded_in_canonical_form(None) is None


def test_snakemake_reads_older_records_through_the_adapter():
    from snakemake.persistence import PersistenceBase

    assert adapter.read_recorded_params_as(recorded_in_canonical_form) is None
    est = _as_loaded(yaml.safe_load(TINY_ESTIMATOR.read_text()))
    record = SimpleNamespace(params=[repr(est)])
    persistence = SimpleNamespace(metadata=lambda path: record)
    # Snakemake's own method, called as params_changed calls it
    assert PersistenceBase.params(persistence, "out.pt") == [repr(canonical(est))]
    # installed once: a second call changes nothing
    assert adapter.read_recorded_params_as(recorded_in_canonical_form) is None
    assert PersistenceBase.params(persistence, "out.pt") == [repr(canonical(est))]


@pytest.mark.parametrize("kind", ["coroutine", "signature", "missing"])
def test_a_changed_internal_is_named_and_left_alone(monkeypatch, kind):
    from snakemake.persistence import PersistenceBase

    if kind == "coroutine":

        async def params(self, path):
            return None

        monkeypatch.setattr(PersistenceBase, "params", params)
    elif kind == "signature":
        monkeypatch.setattr(PersistenceBase, "params", lambda self, path, job: None)
    else:
        monkeypatch.delattr(PersistenceBase, "params")
    before = getattr(PersistenceBase, "params", None)
    line = adapter.read_recorded_params_as(recorded_in_canonical_form)
    assert line is not None
    assert "snakemake.persistence.PersistenceBase.params" in line
    assert "Snakemake 9." in line and "9.27.1" in line
    assert getattr(PersistenceBase, "params", None) is before  # nothing patched
    if kind == "coroutine":
        assert asyncio.run(before(None, "x")) is None


def _write_estimator(path: Path, settings: dict) -> Path:
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    return path


def test_a_finished_run_plans_only_what_a_change_of_result_recomputes(tiny_copy):
    # The run's estimator file at a path of its own (the report names it), then
    # rewritten in place.
    est = yaml.safe_load(TINY_ESTIMATOR.read_text())
    path = _write_estimator(tiny_copy / "estimator.yaml", est)
    use = ("--config", f"estimator={path}")
    first = run_snakemake(tiny_copy, *use)
    assert first.returncode == 0, first.stderr[-3000:]

    device = json.loads(json.dumps(est)) | {"device": "cuda:3"}
    defaults = json.loads(json.dumps(est))
    defaults.pop("estimator")  # upstream's only estimator: the default
    defaults["fisher_baseline"].pop("enabled")  # the workflow's default: true
    rewrites = {
        "keys reversed": _reordered(est),
        "another device": device,
        "defaults left to the workflow": defaults,
        "all of these, numbers written otherwise": _written_differently(est),
    }
    for what, settings in rewrites.items():
        _write_estimator(path, settings)
        again = run_snakemake(tiny_copy, "-n", *use)
        assert again.returncode == 0, (what, again.stderr[-3000:])
        said = again.stdout + again.stderr
        assert "Nothing to be done" in said, (what, again.stderr[-3000:])

    more = json.loads(json.dumps(est))
    more["monte_carlo"]["n_samples"] = 8
    _write_estimator(path, more)
    changed = run_snakemake(tiny_copy, "-n", *use)
    assert changed.returncode == 0, changed.stderr[-3000:]
    # exactly the per-image computations and what follows them, as Snakemake
    # itself reckons them for the unchanged settings
    _write_estimator(path, est)
    forced = run_snakemake(
        tiny_copy, "-n", *use, "--forcerun", "estimate_image", "estimate_image_ceiling"
    )
    planned = planned_jobs(changed)
    assert planned["estimate_image"] == 8 and planned["estimate_image_ceiling"] == 4
    assert planned == planned_jobs(forced)


def _metadata_file(workdir: Path, output: str) -> Path:
    """Snakemake's record of an output (file persistence: ``.snakemake/metadata/``,
    the path's urlsafe base64; snakemake/persistence/file.py, `_b64id`)."""
    name = base64.urlsafe_b64encode(output.encode()).decode()
    return workdir / ".snakemake" / "metadata" / name


def test_a_run_recorded_before_the_canonical_form_is_not_recomputed(tiny_copy):
    # The per-image records rewritten as the workflow wrote them before (settings
    # as loaded, in the file's order with its device): nothing is planned again.
    est = _as_loaded(yaml.safe_load(TINY_ESTIMATOR.read_text()))
    old = sorted([repr(est), repr(yaml.safe_load(TINY_DIFFUSION.read_text()))])
    outputs = sorted((tiny_copy / "runs" / "per_image").rglob("img*.pt"))
    assert len(outputs) == 8
    for output in outputs:
        meta = _metadata_file(tiny_copy, str(output.relative_to(tiny_copy)))
        record = json.loads(meta.read_text())
        assert sorted(recorded_in_canonical_form(old)) == record["params"]
        record["params"] = old
        meta.write_text(json.dumps(record))
    again = run_snakemake(tiny_copy, "-n")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]
