"""environment.yml and pyproject.toml list the same packages."""

from __future__ import annotations

import tomllib

import yaml
from conftest import REPO
from packaging.requirements import Requirement


def normalized(specs) -> set[str]:
    out = set()
    for spec in specs:
        r = Requirement(spec)
        extras = ",".join(sorted(r.extras))
        out.add(f"{r.name.lower()}[{extras}]{r.specifier}")
    return out


PLUGIN = "plugins/snakemake-executor-plugin-modal"


def test_environment_and_pyproject_agree():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    local = ["-e .", f"./{PLUGIN}"]
    assert all(p in pip for p in local)  # the workflow's package, the Modal plugin
    listed = [p for p in pip if p not in local]
    # the Modal plugin is the extra `modal`, installed from its folder (not on PyPI);
    # a local or SLURM-only install needs none of it
    plugin = tomllib.loads((REPO / PLUGIN / "pyproject.toml").read_text())["project"]
    extra = [Requirement(d) for d in project["optional-dependencies"]["modal"]]
    assert [r.name for r in extra] == [plugin["name"]]
    assert extra[0].specifier.contains(plugin["version"])
    needed = [Requirement(d).name for d in project["dependencies"]]
    assert plugin["name"] not in needed and "modal" not in needed
    assert normalized(listed) == normalized(project["dependencies"])
    assert len(listed) == len(project["dependencies"])
    python = next(d for d in env["dependencies"] if str(d).startswith("python="))
    version = python.split("=", 1)[1]
    assert Requirement(f"x{project['requires-python']}").specifier.contains(version)


def test_config_readme_names_every_key_of_the_schema():
    """config/README.md (the snakemake-workflows catalog's place for what each key
    does) names every key of the schema, nested ones as ``parent.key``, and every
    file of config/."""
    import yaml

    schema = yaml.safe_load((REPO / "config/schemas/config.schema.yaml").read_text())
    readme = (REPO / "config/README.md").read_text()
    keys = []
    for key, spec in schema["properties"].items():
        keys.append(key)
        keys += [f"{key}.{sub}" for sub in spec.get("properties", {})]
    keys += list(schema["$defs"]["configuration"]["properties"])
    missing = [k for k in keys if f"`{k}`" not in readme]
    assert not missing, missing
    files = [p.name for p in (REPO / "config").glob("*.yaml")]
    assert all(f"`{name}`" in readme for name in files), files
