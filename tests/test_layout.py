"""
The package's layers (docs/development.md, "Layout"): a module imports only from its
own part or from the parts below it, so that following a value (`device`, `n_images`,
a configuration pair) through the code goes down the layers, never back up.
"""

from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = REPO / "src" / "multigeom_workflow"
#: From the bottom up; one layer may hold several parts.
LAYERS = [
    {"settings", "atomic", "processes", "script_log", "snakemake_adapter"},
    {"inputs"},
    {"compute"},
    {"scenario"},
    {"results"},
    {"planning"},
    {"on_modal", "on_slurm"},
    {"on_snakemake"},
    {"cli"},
]


def part_of(module: str) -> str:
    """``multigeom_workflow.compute.gpus`` -> ``compute``."""
    return module.split(".")[1]


def layer_of(part: str) -> int:
    return next(i for i, parts in enumerate(LAYERS) if part in parts)


def imports(path, package_dir=PACKAGE):
    """The package's modules that `path` imports, as absolute names."""
    package = list(path.relative_to(package_dir.parent).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("multigeom_workflow."):
                yield target


def test_every_part_has_a_layer():
    parts = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    parts |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert parts == set().union(*LAYERS)


def test_imports_go_down_the_layers():
    upward = [
        f"{path.relative_to(PACKAGE)} imports {target}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" or path.parent != PACKAGE
        for target in imports(path)
        if layer_of(part_of(target))
        > layer_of(path.relative_to(PACKAGE).parts[0].removesuffix(".py"))
    ]
    assert upward == []


def test_an_upward_import_is_seen(tmp_path):
    """The check above can fail: a settings module importing the scenario is caught."""
    package_dir = tmp_path / "multigeom_workflow"
    probe = package_dir / "settings" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from ..scenario import Scenario\nfrom .names import N_PIXELS\n")
    found = list(imports(probe, package_dir))
    assert found == ["multigeom_workflow.scenario", "multigeom_workflow.settings.names"]
    assert layer_of(part_of(found[0])) > layer_of("settings")


def test_modal_image_caches_the_backbone_weights_the_workflow_checks():
    """
    The Modal profile's image commands (a file Snakemake reads) cache exactly the
    torchvision weights whose absence `inputs.fetch.missing_backbone_weights` names.
    """
    import yaml

    from multigeom_workflow.inputs.fetch import BACKBONE_WEIGHTS

    profile = yaml.safe_load((REPO / "profiles/modal/profile.yaml").read_text())
    assert profile["modal-image-commands"] == [
        command for _, command in BACKBONE_WEIGHTS.values()
    ]


def test_snakemakes_benchmark_files_go_beside_the_logs():
    """
    Per-job benchmark files under logs/benchmarks/, never in the scripts' folder:
    every rule's ``benchmark:`` path. The per-image rules have none: their seconds are
    the per-image files' elapsed_seconds, and a benchmark costs the planning of
    every per-image job a file.
    """
    import re

    texts = [(f.name, f.read_text()) for f in (REPO / "rules").glob("*.smk")]
    sections = sum(text.count("benchmark:") for _, text in texts)
    paths = [
        (name, path)
        for name, text in texts
        for path in re.findall(r"benchmark:\s*\n\s*(?:f?)\"([^\"]+)\"", text)
    ]
    assert len(paths) == sections >= 11
    assert [p for p in paths if not p[1].startswith("logs/benchmarks/")] == []


def test_the_production_path_never_imports_the_stand_in():
    """
    The stand-in estimator (compute/standin.py) is reached only from tests and
    benchmarks, through `compute.hook`'s environment variable: no module of the
    package imports it.
    """
    importers = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "multigeom_workflow.compute.standin" in set(imports(path))
    ]
    assert importers == []
    # `imports` reads the compute modules' imports (the check above can fail).
    probe = PACKAGE / "compute" / "client.py"
    assert "multigeom_workflow.compute.hook" in set(imports(probe))
