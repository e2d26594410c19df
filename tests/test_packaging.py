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


def test_environment_and_pyproject_agree():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    local = ["-e .", "./plugins/snakemake-executor-plugin-modal"]
    assert all(p in pip for p in local)  # the workflow's package, the Modal plugin
    listed = [p for p in pip if p not in local]
    assert normalized(listed) == normalized(project["dependencies"])
    assert len(listed) == len(project["dependencies"])
    python = next(d for d in env["dependencies"] if str(d).startswith("python="))
    version = python.split("=", 1)[1]
    assert Requirement(f"x{project['requires-python']}").specifier.contains(version)
