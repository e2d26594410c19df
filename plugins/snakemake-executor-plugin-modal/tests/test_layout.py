"""
The plugin by concern (issue 47): every module of the package within 600 lines, and
no import circle among its modules, read from their imports with ``ast`` (those
inside functions too: a circle there is still a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import snakemake_executor_plugin_modal

PACKAGE = Path(snakemake_executor_plugin_modal.__file__).parent
#: The most lines a module of the plugin may have.
MAX_LINES = 600


def import_graph(package: Path) -> dict[str, set[str]]:
    """
    The modules of the flat package in the folder `package` (by name, ``__init__``
    for the package itself) -> the modules of the package each imports, read from
    its source with ``ast``: relative imports, and absolute ones by the package's
    name, anywhere in the module (Python importing a module's package first is not
    counted).
    """
    name = package.name
    modules = {p.stem for p in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for module in modules:
        found = set()
        for node in ast.walk(ast.parse((package / f"{module}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    parts = (node.module or "").split(".")
                elif node.level == 0 and (node.module or "").split(".")[0] == name:
                    parts = node.module.split(".")[1:]
                else:
                    continue
                if parts and parts[0]:
                    found.add(parts[0])
                else:  # from . import a, b: modules, or names of __init__
                    found |= {
                        a.name if a.name in modules else "__init__" for a in node.names
                    }
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == name:
                        found.add(parts[1] if len(parts) > 1 else "__init__")
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first circle of imports in `graph` (its modules in order, the first
    again at the end), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for other in sorted(graph[module]):
            cycle = visit(other, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_every_module_is_within_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert len(sizes) > 10, sizes  # the package was found
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


def test_the_modules_import_no_circle():
    graph = import_graph(PACKAGE)
    assert "calls" in graph["status"] and "ledger" in graph["preflight"]  # read
    assert import_cycle(graph) is None


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        ({"a": "from . import b\n", "b": "x = 1\n"}, None),
        ({"a": "from .b import x\n", "b": "from .a import y\n"}, ["a", "b", "a"]),
        (  # an import inside a function, by the package's name
            {
                "a": "from .b import x\n",
                "b": "def f():\n    from pkg.c import z\n",
                "c": "import pkg.a\n",
            },
            ["a", "b", "c", "a"],
        ),
        (  # from . import: a module of the package, or a name of its __init__
            {"__init__": "from .a import x\n", "a": "from . import b\n", "b": ""},
            None,
        ),
        (
            {"__init__": "from .a import x\n", "a": "from . import y\n"},
            ["__init__", "a", "__init__"],
        ),
    ],
)
def test_an_import_circle_is_found(tmp_path, files, cycle):
    """The check itself: a circle is found (named from where it starts), none
    where there is none."""
    package = tmp_path / "pkg"
    package.mkdir()
    for name, text in files.items():
        (package / f"{name}.py").write_text(text)
    assert import_cycle(import_graph(package)) == cycle
