"""
What the workflow does to the running Snakemake, by concern.

- `multigeom_workflow.snakemake_adapter` (beside this package, in the lowest layer):
  the one module that touches Snakemake's internals (attributes and names outside its
  documented API), each named in its `INTERNALS` and checked against the installed
  Snakemake by tests/test_snakemake_hooks.py; the speed patches, behind one switch
  (`SPEED_ENV`).
- `start`: what runs when Snakemake parses the workflow (`start`), at ``onstart``
  (`on_start`) and at the end (`on_end`).
- `estimate`: the estimate of what is left, read from Snakemake's own plan.
- `resources`: the per-image jobs' resources.
- `groups`: the shard groups of a remote executor.
- `run`: the parsed run (`Run`) the rule files and these modules share.

The rule files (rules/*.smk) call the names this package exports, and nothing else.
"""

from ..snakemake_adapter import INTERNALS, SPEED_ENV, conda_env
from .estimate import PLAN_FILE_ENV
from .resources import estimate_resources, settle_per_image_rules
from .run import Run
from .start import on_end, on_start, say_encoder_warnings, start

__all__ = [
    "INTERNALS",
    "PLAN_FILE_ENV",
    "SPEED_ENV",
    "Run",
    "conda_env",
    "estimate_resources",
    "on_end",
    "on_start",
    "say_encoder_warnings",
    "settle_per_image_rules",
    "start",
]
