"""
An estimator put in place of the real one by a test or a benchmark of the
orchestration (such as `multigeom_workflow.compute.standin`), named by the environment
variable ``MULTIGEOM_ESTIMATOR_HOOK``, never by a configuration key.

The per-image job (`client`) and the warm workers (`workers`) know only this interface:
the production path imports no stand-in, and with the variable unset (every real run)
nothing but the real estimator is reached.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["HOOK_ENV", "estimator_hook", "record"]

#: The environment variable that names the hook's module.
HOOK_ENV = "MULTIGEOM_ESTIMATOR_HOOK"


def estimator_hook() -> ModuleType | None:
    """
    The module named by ``MULTIGEOM_ESTIMATOR_HOOK``, or None when it is unset (the
    real estimator runs).

    The module provides ``estimate(request, slot) -> Path`` (writes
    ``request.out``; `slot` names the GPU or CPU share, e.g. ``"gpu3"``) and
    ``record(**entry)`` (the events a test checks: jobs, computations, stops).

    Raises
    ------
    RuntimeError
        One line naming the variable, its value and what is allowed, when the module
        cannot be imported or lacks ``estimate`` or ``record``.
    """
    name = os.environ.get(HOOK_ENV, "").strip()
    if not name:
        return None
    allowed = (
        "allowed: unset (the real estimator) or a module with estimate(request, slot) "
        "and record(**entry), e.g. multigeom_workflow.compute.standin"
    )
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise RuntimeError(
            f"environment variable {HOOK_ENV} = {name!r}: cannot be imported ({err}); "
            f"{allowed}"
        ) from None
    missing = [f for f in ("estimate", "record") if not callable(getattr(module, f, 0))]
    if missing:
        raise RuntimeError(
            f"environment variable {HOOK_ENV} = {name!r}: the module has no "
            f"{' or '.join(missing)}; {allowed}"
        )
    return module


def record(**entry) -> None:
    """Hand `entry` to the hook's ``record`` when a hook is set; else do nothing."""
    hook = estimator_hook()
    if hook is not None:
        hook.record(**entry)
