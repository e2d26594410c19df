"""
A Python whose environment has no Modal executor plugin and no Modal client, as a
local or SLURM-only install (`pip install -e .` alone): put this folder first on
PYTHONPATH (Python imports `sitecustomize` at start). Importing either package then
fails as for a package that is not installed (ModuleNotFoundError), and Snakemake's
plugin registry, which imports every top-level module named
``snakemake_executor_plugin_*`` that `pkgutil.iter_modules` lists
(snakemake_interface_common/plugin_registry, `collect_plugins`), does not see the
plugin.
"""

import importlib.abc
import pkgutil
import sys

HIDDEN = ("snakemake_executor_plugin_modal", "modal", "modal_proto", "modal_version")


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
_iter_modules = pkgutil.iter_modules


def _listed(path=None, prefix=""):
    return (m for m in _iter_modules(path, prefix) if m.name not in HIDDEN)


pkgutil.iter_modules = _listed
