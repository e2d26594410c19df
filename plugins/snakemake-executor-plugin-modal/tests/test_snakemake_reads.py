"""
Every attribute of Snakemake's objects the plugin reads is in one table
(`snakemake_reads.SNAKEMAKE_READS`), checked when the executor starts: one missing
stops the run in one line naming it and the Snakemake version (issue 47: before,
``workflow.dag`` read with a default of ``[]`` skipped the preflight without a word).
"""

from __future__ import annotations

import re
import types

import pytest
from snakemake_interface_common.exceptions import WorkflowError

from snakemake_executor_plugin_modal import Executor
from snakemake_executor_plugin_modal.snakemake_reads import (
    SNAKEMAKE_READS,
    check_reads,
)


def _workflow(without: str | None = None):
    """A workflow with every ``workflow.*`` attribute of the table, but `without`."""
    root = types.SimpleNamespace()
    for path in SNAKEMAKE_READS:
        if not path.startswith("workflow.") or path == without:
            continue
        obj = root
        for part in path.split(".")[1:]:
            if not hasattr(obj, part):
                setattr(obj, part, types.SimpleNamespace())
            obj = getattr(obj, part)
    if without and without.startswith("workflow."):
        *parents, last = without.split(".")[1:]
        obj = root
        for part in parents:
            obj = getattr(obj, part)
        if hasattr(obj, last):
            delattr(obj, last)
    return root


def _classes(without: str | None = None) -> dict:
    """Stand-ins of Snakemake's job, group job and rule classes, with every
    attribute of the table but `without`."""
    attributes: dict[str, dict] = {"job": {}, "group": {}, "rule": {}}
    for path in SNAKEMAKE_READS:
        root, _, name = path.partition(".")
        if root in attributes and path != without:
            attributes[root][name] = property(lambda self: None)
    return {root: type(root, (), names) for root, names in attributes.items()}


def test_this_snakemake_has_every_attribute_the_plugin_reads():
    """Snakemake's own classes have every job, group and rule attribute."""
    check_reads(_workflow())


@pytest.mark.parametrize("path", SNAKEMAKE_READS)
def test_a_missing_attribute_stops_the_run_in_one_line(path):
    with pytest.raises(WorkflowError) as info:
        check_reads(_workflow(path), _classes(path), version="9.99.0")
    message = str(info.value)
    assert "\n" not in message
    assert re.search(rf"Snakemake \(9\.99\.0\) has no `{re.escape(path)}`", message)
    assert SNAKEMAKE_READS[path] in message


def test_the_executor_checks_before_anything_starts():
    """A workflow without ``dag``: the executor's start stops in one line naming
    it and the installed Snakemake's version, before its preflight."""
    from importlib import metadata

    executor = Executor.__new__(Executor)
    executor.workflow = _workflow("workflow.dag")
    version = re.escape(metadata.version("snakemake"))
    with pytest.raises(
        WorkflowError, match=rf"Snakemake \({version}\) has no `workflow\.dag`"
    ):
        executor.__post_init__()
