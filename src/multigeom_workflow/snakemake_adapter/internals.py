"""
What the adapter checks of a Snakemake internal before it uses one, and what it says
when one is not what it was written for.

A patch (a method of Snakemake's replaced or wrapped) is made only after its target
has been checked: it exists, it is or is not a coroutine function, and its leading
parameters are those it was written for (`method_problem`). A target that changed is
left as Snakemake has it: the use is switched off (`switched_off`) with one line
naming it, the installed Snakemake and the releases tested (`TESTED`), and Snakemake's
own behaviour applies. A use that cannot be switched off without a wrong answer stops
the run before any job (`InternalChanged`, one line). `switched_off_lines` gives the
lines once each, for the Snakefile to print before any job.
"""

from __future__ import annotations

import inspect

__all__ = [
    "TESTED",
    "TESTED_OTHERS",
    "InternalChanged",
    "changed_line",
    "method_problem",
    "snakemake_version",
    "switched_off",
    "switched_off_lines",
]

#: The oldest and the newest Snakemake CI tests the workflow with (pyproject.toml's
#: range; .ci/oldest-snakemake, .ci/snakemake-releases).
TESTED = ("9.27.0", "9.27.1")

_SWITCHED_OFF: dict[str, str] = {}
_SAID: set[str] = set()


class InternalChanged(RuntimeError):
    """A Snakemake internal the workflow cannot do without is not what it was written
    for: the message is one line naming it, the Snakemake version and `TESTED`.
    """


def snakemake_version(distribution: str = "snakemake") -> str:
    """The installed version of `distribution` (Snakemake by default), from its
    metadata.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:  # pragma: no cover (the workflow needs it)
        return "?"


def method_problem(
    owner, name: str, params: tuple[str, ...], coroutine: bool, exact: bool = False
) -> str | None:
    """
    What is wrong with ``owner.<name>`` for a use written for a function whose leading
    parameters (with `exact`, all its parameters) are `params` and which is
    (`coroutine`) or is not a coroutine function; None when nothing is.

    Returns
    -------
    str or None
        A few words ("is missing", "is not a coroutine function", "takes (self,
        file), not (self, path)").
    """
    method = getattr(owner, name, None)
    if method is None or not callable(method):
        return "is missing"
    method = getattr(method, "_original", method)  # a wrapper of ours: its target
    if inspect.iscoroutinefunction(method) != coroutine:
        return f"is {'not ' if coroutine else ''}a coroutine function"
    try:
        names = tuple(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return "has no signature to read"
    if (names if exact else names[: len(params)]) != params:
        return f"takes ({', '.join(names)}), not ({', '.join(params)})"
    return None


#: Other packages whose internals the adapter uses, with the releases tested
#: (pyproject.toml's range): the SLURM executor plugin's parts under the workflow's
#: layers (`acting.SLURM_PLUGIN_PARTS`).
TESTED_OTHERS = {"snakemake-executor-plugin-slurm": ("2.8.0", "2.8.0")}


def switched_off(
    name: str, problem: str, consequence: str, distribution: str = "snakemake"
) -> str:
    """
    Record that the use of internal `name` (of `distribution`: Snakemake, or one of
    `TESTED_OTHERS`) is off because of `problem`, with its `consequence` (what the
    user meets instead), and return its line.
    """
    low, high = TESTED if distribution == "snakemake" else TESTED_OTHERS[distribution]
    label = "Snakemake" if distribution == "snakemake" else distribution
    line = (
        f"{label} {snakemake_version(distribution)}: {name} {problem}, so the "
        f"workflow leaves it as it is ({consequence}; tested with {label} {low} to "
        f"{high})"
    )
    _SWITCHED_OFF[name] = line
    return line


def changed_line(name: str, problem: str) -> str:
    """The line of an `InternalChanged`: the run stops before any job."""
    low, high = TESTED
    return (
        f"Snakemake {snakemake_version()}: {name} {problem}; the workflow cannot run "
        f"with it (tested with Snakemake {low} to {high}: install one of those)"
    )


def switched_off_lines() -> list[str]:
    """The lines of `switched_off` not yet handed out, each once per process."""
    new = [line for line in _SWITCHED_OFF.values() if line not in _SAID]
    _SAID.update(new)
    return new
