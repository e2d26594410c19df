"""
Acting on the running Snakemake: shard groups, the local GPU limit, shared
resources, a dry run's view of the files a real run changes, and older runs' params
records read in canonical form (the functions `multigeom_workflow.snakemake_adapter`
lists as acting on the run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from .internals import method_problem, switched_off


def share_group_name(workflow, groups: Iterable[str], parent: str) -> None:
    """
    Make every group of `groups` count as the one group name `parent`, so that a
    profile's ``group-components: [parent=N]`` applies to each: Snakemake keys
    --group-components by that parent name, as for groups written with wildcards
    (the mapping ``workflow.parent_groupids`` it fills for those).
    """
    for group in groups:
        workflow.parent_groupids[group] = parent


def limit_local_gpus(workflow, n: int) -> bool:
    """On this machine, start no more jobs asking ``gpu`` than `n` at once (the
    scheduler's limit, as ``--resources gpu=n`` would set it). Returns whether it
    could (the scheduler exists once the run starts).
    """
    scheduler = getattr(workflow, "scheduler", None)
    if scheduler is None:
        return False
    scheduler.global_resources["gpu"] = n
    scheduler.resources["gpu"] = n
    return True


def share_resources(
    workflow, target: str, source: str, drop: Iterable[str] = ()
) -> None:
    """
    Give rule `target` the resources a profile or the command line set for rule
    `source` (``set-resources``), except those set for `target` itself; then drop the
    resources named in `drop` from both rules (settings of the workflow's own, not
    resources a job asks its executor for).
    """
    from snakemake.resources import Resources

    rule = workflow.get_rule(target)
    given = workflow.resource_settings.overwrite_resources
    own = Resources(dict(given.get(target, {})))
    shared = Resources(dict(given.get(source, {})))
    rule.resources.update(
        Resources({name: r for name, r in shared.items() if name not in own})
    )
    drop = set(drop)
    for name in (source, target):
        r = workflow.get_rule(name)
        r.resources = Resources({k: v for k, v in r.resources.items() if k not in drop})


#: The file class's methods `show_snakemake` wraps, each with the leading parameters
#: and the kind (coroutine function or not) it was written for
#: (snakemake/io/__init__.py, Snakemake 9.24.0 to 9.27.1): a wrapper of a method
#: that stopped being a coroutine would hand Snakemake a coroutine object, which is
#: always true.
FILE_METHODS = {
    "exists_local": (("self",), True),
    "mtime_uncached": (("self", "skip_storage"), True),
    "size_local": (("self",), True),
    "is_fifo": (("self",), False),
    "checksum": (("self",), True),
}

#: The file class's methods `show_snakemake` wraps, each with its original.
_ORIGINAL_FILE_METHODS: dict[str, Callable] = {}


def show_snakemake(view) -> bool:
    """
    Make this process's Snakemake see the files of `view` as given, from now on;
    nothing when the view is empty, or when a method of `FILE_METHODS` is not what it
    was written for (one `internals.switched_off` line). Returns whether it wrapped
    Snakemake's methods.

    `view` is a `multigeom_workflow.planning.before_planning.PlanningView`: absolute
    paths seen missing (``missing``), seen with another date (``dates``, ns) and seen
    present in place of another file (``present``).

    A dry run changes no file (Snakemake's promise for ``-n``), yet its plan must be
    the one a real run builds after what it changes before planning
    (`multigeom_workflow.planning.before_planning`). Snakemake's planning reads a
    local file through methods of its file class (snakemake/dag.py and snakemake/io:
    ``_IOFile.exists_local``, ``mtime_uncached`` and ``size_local``, and for a file
    of 1 MB or less newer than an output ``is_fifo`` and ``checksum``; its IO cache
    stores what they return): they are wrapped so that the files of `view` read as
    the real run leaves them (a file put back is read from where it comes from),
    every other file as before. Call it before Snakemake builds its plan (at parse
    time).
    """
    if not view:
        return False
    from snakemake.io import _IOFile
    from snakemake_interface_storage_plugins.io import Mtime

    for name, (params, coroutine) in FILE_METHODS.items():
        problem = method_problem(_IOFile, name, params, coroutine)
        if problem:
            switched_off(
                f"snakemake.io._IOFile.{name}",
                problem,
                "this dry run plans the files as they are on disk, not as the real "
                "run leaves them: its count may differ from the real run's",
            )
            return False
    for name in FILE_METHODS:
        _ORIGINAL_FILE_METHODS.setdefault(name, getattr(_IOFile, name))
    exists_local = _ORIGINAL_FILE_METHODS["exists_local"]
    mtime_uncached = _ORIGINAL_FILE_METHODS["mtime_uncached"]
    size_local = _ORIGINAL_FILE_METHODS["size_local"]
    is_fifo = _ORIGINAL_FILE_METHODS["is_fifo"]
    checksum = _ORIGINAL_FILE_METHODS["checksum"]
    missing, dates, present = view.missing, view.dates, view.present

    async def seen_exists_local(self):
        path = os.path.abspath(self.file)
        if path in missing:
            return False
        if path in present:
            return True
        return await exists_local(self)

    async def seen_mtime_uncached(self, skip_storage: bool = False):
        path = os.path.abspath(self.file)
        if path in present:
            return Mtime(local=os.stat(present[path]).st_mtime)
        if path in dates:
            return Mtime(local=dates[path] / 1e9)
        return await mtime_uncached(self, skip_storage=skip_storage)

    async def seen_size_local(self):
        path = os.path.abspath(self.file)
        if path in present:
            return os.path.getsize(present[path])
        return await size_local(self)

    def seen_is_fifo(self):
        path = os.path.abspath(self.file)
        if path in present:
            return is_fifo(_IOFile(present[path], rule=self.rule))
        return is_fifo(self)

    async def seen_checksum(self, *args, **kwargs):
        path = os.path.abspath(self.file)
        if path in present:  # the bytes a real run puts back
            return await checksum(
                _IOFile(present[path], rule=self.rule), *args, **kwargs
            )
        return await checksum(self, *args, **kwargs)

    _IOFile.exists_local = seen_exists_local
    _IOFile.mtime_uncached = seen_mtime_uncached
    _IOFile.size_local = seen_size_local
    _IOFile.is_fifo = seen_is_fifo
    _IOFile.checksum = seen_checksum
    return True


#: The internal `read_recorded_params_as` wraps.
RECORDED_PARAMS = "snakemake.persistence.PersistenceBase.params"


def read_recorded_params_as(translate: Callable) -> str | None:
    """
    Have Snakemake read what it recorded as an output's params through `translate`:
    `snakemake.persistence.PersistenceBase.params` (``params(self, path) -> list of
    reprs or None``, read by ``params_changed`` when it compares a job's params with
    its outputs' records; Snakemake 9.19.0 and 9.27.1, ``persistence/__init__.py``)
    returns ``translate(recorded)``. What Snakemake records, and how it compares, is
    unchanged. Installed once per process; safe to call again.

    Returns
    -------
    str or None
        None when in place; else the `internals.switched_off` line (the internal is
        not what this was written for; nothing is wrapped, Snakemake's own reading of
        its records applies).
    """
    try:
        from snakemake.persistence import PersistenceBase
    except ImportError as err:  # pragma: no cover (moved in a later Snakemake)
        return switched_off(RECORDED_PARAMS, f"cannot be imported ({err})", _PARAMS_OFF)
    problem = method_problem(
        PersistenceBase, "params", ("self", "path"), False, exact=True
    )
    if problem:
        return switched_off(RECORDED_PARAMS, problem, _PARAMS_OFF)
    current = PersistenceBase.params
    if getattr(current, "_translate", None) is translate:
        return None
    original = getattr(current, "_original", current)

    def params(self, path):
        return translate(original(self, path))

    params._translate, params._original = translate, original
    PersistenceBase.params = params
    return None


_PARAMS_OFF = (
    "outputs recorded before 2026-12-02 are compared as Snakemake recorded them, so a "
    "settings file written differently from then plans them again"
)


def warn(line: str) -> None:
    """Write `line` as a warning through Snakemake's logger
    (``snakemake.logging.logger``), to its handlers and logger plugins as Snakemake's
    own warnings go (a layer over an executor plugin writes there).
    """
    from snakemake.logging import logger

    logger.warning(line)


#: The SLURM executor plugin's parts the workflow lays its layers over
#: (`multigeom_workflow.on_slurm.status`, `.submit`), each with what it was written
#: for (snakemake-executor-plugin-slurm 2.8.0, ``__init__.py`` and
#: ``job_status_query.py``): the status query ``Executor.check_active_jobs`` calls by
#: its module name, that method itself (an async generator), and the ``subprocess``
#: module ``Executor.run_job`` submits with (``subprocess.Popen``).
SLURM_PLUGIN_PARTS = {
    "query_job_status": (("command", "logger"), "coroutine function"),
    "Executor.check_active_jobs": (("self", "active_jobs"), "async generator"),
    "subprocess": ((), "module with Popen"),
}


def slurm_plugin_part_problem(part: str) -> str | None:
    """What is wrong with `part` of the installed SLURM plugin's module for the layer
    written over it (`SLURM_PLUGIN_PARTS`), or None; a wrapper of ours is judged by
    what it wraps (``__wrapped__``, a layer's ``original``).
    """
    import inspect

    import snakemake_executor_plugin_slurm as plugin

    params, kind = SLURM_PLUGIN_PARTS[part]
    owner, _, name = part.rpartition(".")
    target = getattr(plugin, owner, None) if owner else plugin
    current = getattr(target, name, None)
    if current is None:
        return "is missing"
    if kind == "module with Popen":
        return None if callable(getattr(current, "Popen", None)) else "has no Popen"
    layer = getattr(current, "__self__", None)
    current = (
        getattr(current, "__wrapped__", None)
        or getattr(layer, "original", None)
        or current
    )
    is_kind = (
        inspect.isasyncgenfunction(current)
        if kind == "async generator"
        else inspect.iscoroutinefunction(current)
    )
    if not is_kind:
        return f"is not an {kind}" if kind[0] in "aeiou" else f"is not a {kind}"
    names = tuple(inspect.signature(current).parameters)[: len(params)]
    if names != params:
        return f"takes ({', '.join(names)}), not ({', '.join(params)})"
    return None


def replace_in_slurm_plugin(part: str, make: Callable, consequence: str):
    """
    Put ``make(current)`` in place of `part` of the SLURM plugin's module
    (`SLURM_PLUGIN_PARTS`) once it is checked (`slurm_plugin_part_problem`); returns
    what was put there, or None when the part is not what the layer was written for:
    nothing is replaced, the plugin's own behaviour applies, and one
    `internals.switched_off` line names it with its `consequence`.
    """
    import snakemake_executor_plugin_slurm as plugin

    problem = slurm_plugin_part_problem(part)
    if problem:
        switched_off(
            f"snakemake_executor_plugin_slurm.{part}",
            problem,
            consequence,
            "snakemake-executor-plugin-slurm",
        )
        return None
    owner, _, name = part.rpartition(".")
    target = getattr(plugin, owner) if owner else plugin
    new = make(getattr(target, name))
    setattr(target, name, new)
    return new
