"""
A result's identity: the settings that change what a rule computes, in one canonical
form, so that Snakemake's record of a job's params follows the result and never the
text or order of a settings file.

Snakemake records each param as its ``repr`` and plans a job again when the set of
reprs differs from the one recorded with its output (``--rerun-triggers params``;
`snakemake.persistence.PersistenceBase._params` and ``params_changed``, Snakemake 9.19
to 9.27). A dict's repr follows its keys' order, so the same estimator file with its
keys in another order, or ``3.0e-3`` written ``0.003`` next to ``1`` written ``1.0``,
used to plan every per-image computation again. The workflow therefore hands Snakemake
every settings mapping in its `canonical` form, and reads what older runs recorded
in the same form (`recorded_in_canonical_form`, through
`multigeom_workflow.snakemake_adapter.read_recorded_params_as`), so that a run made
before this form existed is not recomputed because of it.

What each key recomputes: docs/estimates.md ("What a change of settings recomputes").

Nothing here imports torch.
"""

from __future__ import annotations

import ast
import functools
import math
import re

__all__ = [
    "NOT_RESULT_KEYS",
    "canonical",
    "is_estimator_settings",
    "recorded_in_canonical_form",
]

#: Top-level keys of an estimator file that change no result, with why. ``device``: the
#: workflow's config key ``device`` chooses where a job runs, and the file's is never
#: read (`multigeom_workflow.scenario.load`); ``n_test_images``: upstream's own command
#: line reads it for its image count, the workflow's is config key ``n_images``.
NOT_RESULT_KEYS = {
    "device": "where a job runs is config key 'device'; the file's is not read",
    "n_test_images": "the number of images is config key 'n_images'",
}

#: Defaults of the estimator settings, as upstream reads them when a key is missing:
#: ``estimator`` (Algorithm 1 is the only estimator upstream's `estimate_image` runs,
#: multigeom 0.1.0.dev3 `pipeline/per_image.py`) and ``fisher_baseline.enabled`` (the
#: workflow fills it in, `multigeom_workflow.scenario.load`). Written out or left
#: out, the result is the same.
ESTIMATOR_DEFAULTS = {"estimator": "conditional_pair", "fisher_baseline.enabled": True}

# A number as YAML 1.2 writes it: PyYAML (YAML 1.1) reads "1e-4" as a string.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def canonical(value):
    """
    `value` in one canonical form: mappings with their keys sorted (recursively), lists
    and tuples as lists, an integral float as an int (``1.0`` is ``1``), a string that
    is a number written as YAML 1.2 reads it as a number (``"1e-4"`` is ``0.0001``),
    and estimator settings (a mapping holding ``monte_carlo``, wherever it is) less
    `NOT_RESULT_KEYS` and with `ESTIMATOR_DEFAULTS` filled in. Two values that settings
    files could write in different ways for the same result have the same canonical
    form, and the same ``repr``.

    Parameters
    ----------
    value : dict, list, tuple, int, float, str, bool or None

    Returns
    -------
    The same kinds, rebuilt; the argument is not changed.

    Examples
    --------
    >>> canonical({"b": 1.0, "a": ["1e-4", 0.5]})
    {'a': [0.0001, 0.5], 'b': 1}
    """
    if isinstance(value, dict):
        if is_estimator_settings(value):
            value = _estimator_identity(value)
        return {str(k): canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        text = value.strip()
        return canonical(int(text) if text.lstrip("+-").isdigit() else float(text))
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def is_estimator_settings(settings) -> bool:
    """Whether `settings` (a dict) are an estimator's: they hold ``monte_carlo``."""
    return isinstance(settings, dict) and isinstance(settings.get("monte_carlo"), dict)


def _estimator_identity(estimator: dict) -> dict:
    """The estimator settings less `NOT_RESULT_KEYS`, `ESTIMATOR_DEFAULTS` filled in
    (not yet canonical: `canonical` calls this).
    """
    out = {k: v for k, v in estimator.items() if k not in NOT_RESULT_KEYS}
    out.setdefault("estimator", ESTIMATOR_DEFAULTS["estimator"])
    if isinstance(out.get("fisher_baseline", {}), dict):
        baseline = dict(out.get("fisher_baseline") or {})
        baseline.setdefault("enabled", ESTIMATOR_DEFAULTS["fisher_baseline.enabled"])
        out["fisher_baseline"] = baseline
    return out


def recorded_in_canonical_form(recorded):
    """
    What Snakemake recorded as a job's params (a list of reprs, or None), with every
    recorded settings mapping read as the workflow now records it: a dict repr becomes
    the repr of its `canonical` form.
    Records made before the canonical form (dicts in the file's order, ``device``
    included) then compare equal to today's params exactly when the settings that
    change a result are the same. Reprs that are not dicts are returned as they are.

    Parameters
    ----------
    recorded : list of str or None
        `snakemake.persistence.PersistenceBase.params` of an output file.

    Returns
    -------
    list of str or None
        Of the same length and order; None stays None.
    """
    if not recorded:
        return recorded
    return [_canonical_repr(x) if isinstance(x, str) else x for x in recorded]


@functools.lru_cache(maxsize=256)
def _canonical_repr(text: str) -> str:
    """A recorded repr in canonical form (cached: every per-image file of a run
    records the same few settings).
    """
    if not text.startswith("{"):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    if not isinstance(value, dict):
        return text
    return repr(canonical(value))
