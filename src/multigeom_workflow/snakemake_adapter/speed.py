"""
The speed patches: each saves seconds at 40,000 jobs and none changes what Snakemake
computes, all behind one switch (`SPEED_ENV`; `speed_patches_on`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

#: The switch of every speed patch: ``MULTIGEOM_SPEED_PATCHES=off`` (or ``0``,
#: ``no``, ``false``) runs Snakemake exactly as it comes, for a new Snakemake release
#: or to rule the patches out of a problem. The dry run's output is the same either
#: way (tests/test_snakemake_hooks.py); only its time differs (docs/estimates.md).
SPEED_ENV = "MULTIGEOM_SPEED_PATCHES"


def speed_patches_on() -> bool:
    """Whether the speed patches are on (`SPEED_ENV`; on unless turned off)."""
    return os.environ.get(SPEED_ENV, "on").strip().lower() not in (
        "off",
        "0",
        "no",
        "false",
    )


#: The garbage collector's thresholds in a Snakemake process of the workflow
#: (`gc.set_threshold`; CPython 3.11's default is (700, 10, 10)): see
#: `fewer_collections`.
GC_THRESHOLDS = (50_000, 20, 20)


def fewer_collections() -> bool:
    """
    Let Python's cyclic garbage collector run less often in this Snakemake process
    (`GC_THRESHOLDS`, or the thresholds already set where higher); nothing with the
    speed patches off. Returns whether it did.

    Snakemake builds tens of objects per job and keeps them for the whole run: at
    CPython's default a collection starts every 700 new objects and scans the young
    ones again and again, and the older generations' collections scan every job.
    Measured with `gc.callbacks` on a dry run of 4 x 10,000 images with the slurm
    profile (2-core machine, 2026-12-01): 6.6 s of 47 CPU-seconds in 10,938
    collections at the default, 1.6 s in 145 at these thresholds, the peak memory the
    same (955 MB); docs/estimates.md has the benchmark's figures. Objects freed by
    their reference count (nearly all) are freed at once either way; only garbage in
    reference cycles waits longer.
    """
    import gc

    if not speed_patches_on():
        return False
    current = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(current, GC_THRESHOLDS, strict=True)))
    return True


def idle_logger_plugin_off(workflow, plugin_class: type) -> bool:
    """
    In a dry run, take Snakemake's queue to its logger plugins off its logger when the
    only plugins are idle ones of `plugin_class` (the workflow's own, ``--logger
    multigeom``, in every profile: it has no view to draw in a dry run and writes
    nothing, Snakemake's own handler writing the messages), yet each record handed
    to its thread costs tens of microseconds, and a dry run logs two per job (3 s of
    48 at 40,000 jobs). Returns whether it did; other plugins keep their queue, and
    nothing is done with the speed patches off.
    """
    from logging.handlers import QueueHandler

    if not speed_patches_on():
        return False
    manager = getattr(workflow, "logger_manager", None)
    listener = getattr(manager, "queue_listener", None)
    plugins = list(getattr(manager, "plugin_handlers", None) or [])
    if listener is None or not plugins:
        return False
    if not all(isinstance(h, plugin_class) and h.idle for h in plugins):
        return False
    for handler in list(manager.logger.handlers):
        if isinstance(handler, QueueHandler) and handler.queue is listener.queue:
            manager.logger.removeHandler(handler)
            return True
    return False


def record_signature(func, of=None) -> bool:
    """
    Record on `func` the parameters Snakemake reads of `of` (default: `func` itself;
    `snakemake.common.get_function_params`), as Snakemake's own ioutils do
    (`snakemake.common.overwrite_function_params`): Snakemake then reads them from
    there instead of calling `inspect.signature` at each call. Nothing with the speed
    patches off; returns whether it did.
    """
    if not speed_patches_on():
        return False
    from snakemake.common import get_function_params, overwrite_function_params

    overwrite_function_params(func, get_function_params(func if of is None else of))
    return True


def settle_rules(workflow, rules: Iterable[str]) -> bool:
    """
    For each rule of `rules`, what Snakemake would otherwise work out again for each
    of its 40,000 jobs, to the same value: the resources that read nothing of the job
    (`_settle_constant_resources`), its input functions' signatures
    (`_settle_input_functions`), and once the signature of `Resource.evaluate`
    (`_settle_resource_evaluation`). Nothing with the speed patches off; returns
    whether it did.
    """
    if not speed_patches_on():
        return False
    for rule in map(workflow.get_rule, rules):
        _settle_constant_resources(rule)
        _settle_input_functions(rule)
    _settle_resource_evaluation()
    return True


def _settle_resource_evaluation() -> None:
    """
    Record the signature of Snakemake's `Resource.evaluate` on it
    (`snakemake.common.overwrite_function_params`, the value `get_function_params`
    gives a bound ``Resource(...).evaluate``: ``*args, **kwargs``). Snakemake evaluates
    each job's evaluable resources (its threads, a function such as SLURM's runtime)
    through `Rule.apply_input_function(resource.evaluate, ...)`, which reads that
    signature with `inspect.signature` twice per resource and job (a bound method
    reads its function's attributes, so the recorded one serves every resource).
    What is passed on is unchanged: the same parameters, read once.
    """
    from snakemake.resources import Resource

    record_signature(Resource.evaluate, Resource("_cores", 1).evaluate)


def _settle_input_functions(rule) -> None:
    """
    Record the signature of each input function of `rule` on the function
    (`snakemake.common.overwrite_function_params`, as Snakemake's own ioutils do with
    `get_function_params`' value: `record_signature`): Snakemake reads a function's
    parameters at each call to know what to pass it, with `inspect.signature`, twice
    per job.
    """
    for item in rule.input:
        func = getattr(getattr(item, "_file", item), "callable", None)
        if callable(func):
            record_signature(func)


#: What a resource expression of the command line or a profile (`set-resources`,
#: `default-resources`) may read of its job, besides snakemake.ioutils' functions
#: (`snakemake.resources.Resource.cli_evaluator`'s parameters and namespace:
#: Snakemake 9.19 has no ``wildcards``, 9.27 has).
JOB_NAMES = {"wildcards", "input", "attempt", "threads", "async_run"}


def _cli_evaluator_arguments() -> dict | None:
    """
    The job-independent arguments `Resource.cli_evaluator` takes in the installed
    Snakemake (its keyword parameters among `JOB_NAMES`), or None where it takes one
    this module does not know: a new parameter, defaulted or not, could make a value
    depend on the job, and settling it once would freeze a wrong constant.
    """
    import inspect

    from snakemake.resources import Resource

    known = {"wildcards": None, "input": (), "attempt": 1, "async_run": None}
    params = list(inspect.signature(Resource.cli_evaluator).parameters.values())
    out = {}
    for p in params[2:]:  # after (name, val)
        if p.name == "threads" and p.default is None:
            continue  # left out: as Snakemake itself evaluates a job's resources
        if p.name not in known:
            return None
        out[p.name] = known[p.name]
    return out


def _settle_constant_resources(rule) -> None:
    """
    Evaluate once, at parse time, each resource of `rule` that a profile or the command
    line gave as an expression reading nothing of its job (``mem_mb=16000``,
    ``slurm_partition=gpu``, ``mpi=""``, Snakemake's default
    ``tmpdir=system_tmpdir``; not ``mem_mb=8000*attempt``): Snakemake would evaluate
    it again for every job (for 40,000 per-image jobs, seconds of a dry run), to the
    same value. The value is the one Snakemake's own evaluation
    (`Resource.cli_evaluator`) gives in this process (every Snakemake process of a
    run, a job's own in an allocation or a container too, parses the workflow and
    evaluates its own: ``system_tmpdir`` is that machine's); expressions that read the
    job or an ioutils function stay as they are, and nothing is settled where the
    evaluator's parameters are not the known ones (`_cli_evaluator_arguments`).
    """
    import ast

    import snakemake.ioutils
    from snakemake.resources import Resource

    arguments = _cli_evaluator_arguments()
    if arguments is None:
        return
    namespace = {}
    snakemake.ioutils.register_in_globals(namespace)
    reads_job = JOB_NAMES | set(namespace) | {"shutil"}
    for name, res in list(rule.resources.items()):
        raw = res.raw
        if name.startswith("_") or not res.is_evaluable() or not isinstance(raw, str):
            continue
        expr = os.path.expanduser(os.path.expandvars(raw))
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            tree = None  # Snakemake takes such a value as the string itself
        if tree is not None and any(
            isinstance(node, ast.Name) and node.id in reads_job
            for node in ast.walk(tree)
        ):
            continue
        try:
            value = Resource.cli_evaluator(name, raw, **arguments)
            settled = Resource(name, value, raw=raw)
        except Exception:  # Snakemake names the error at the job, as it would
            continue
        rule.resources[name] = settled
