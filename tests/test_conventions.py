"""
The snakemake-workflows catalog's conventions: a LICENSE and a CITATION.cff that
agree with pyproject.toml, the rule files as snakefmt writes them, and the conda
environment the rules name (`snakemake --lint` itself: tests/test_workflow.py,
test_lint_is_clean).
"""

from __future__ import annotations

import difflib
import re
import tomllib
from io import StringIO

import pytest
import yaml
from conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def words(text: str) -> str:
    """`text` with its runs of white space made one space."""
    return " ".join(text.split())


def test_license_is_pyprojects():
    text = (REPO / "LICENSE").read_text()
    assert PROJECT["license"] == "MIT"
    assert text.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) 2026 \S", text, re.M), text[:200]


def test_citation_file_has_the_keys_of_cff_1_2_0_and_pyprojects_version():
    """
    The keys CFF 1.2.0 requires (cff-version, message, title, authors), and those of
    the preferred citation (type, title, authors); the version and license are
    pyproject.toml's, the paper's title is the one the package cites
    (settings/pairs.py). `cffconvert --validate` checks the whole schema (online).
    """
    from multigeom_workflow.settings import pairs

    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors"):
        assert cff[key], key
    assert all("name" in a or "family-names" in a for a in cff["authors"])
    assert cff["version"] == PROJECT["version"]
    assert cff["license"] == PROJECT["license"]
    paper = cff["preferred-citation"]
    assert paper["type"] == "article"
    assert paper["year"] == 2026
    families = [a["family-names"] for a in paper["authors"]]
    assert families == ["Azeglio", "Laquitaine", "Ferrari", "Chalk"]
    assert words(paper["title"]) in words(pairs.__doc__)
    assert "2605.06304" in paper["url"]


#: The files snakefmt formats (`snakefmt rules Snakefile`).
RULE_FILES = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]


def snakefmt(text: str) -> str:
    """
    `text` as ``snakefmt`` (its command's defaults: directives sorted, shell
    strings formatted, black's settings from pyproject.toml) writes it, in this
    process.
    """
    from snakefmt.formatter import Formatter
    from snakefmt.parser.parser import Snakefile

    formatter = Formatter(
        Snakefile(StringIO(text)),
        sort_directives=True,
        format_shell=True,
        black_config_file=REPO / "pyproject.toml",
    )
    return formatter.get_formatted()


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rule_files_are_formatted_by_snakefmt(path):
    """`snakefmt --check rules Snakefile` would change nothing."""
    text = path.read_text()
    diff = difflib.unified_diff(
        text.splitlines(), snakefmt(text).splitlines(), lineterm="", n=1
    )
    changes = "\n".join(diff)
    assert not changes, f"`snakefmt rules Snakefile` changes {path.name}:\n{changes}"


def test_snakefmt_check_sees_a_directive_out_of_order():
    """The check above can fail: ``localrule`` before ``input`` is moved."""
    rule = 'rule a:\n    localrule: True\n    input:\n        "x",\n'
    assert snakefmt(rule) == 'rule a:\n    input:\n        "x",\n    localrule: True\n'


def test_rules_name_the_environment_that_environment_yml_makes():
    """
    Every rule's ``conda`` is `CONDA_ENV` (rules/common.smk), environment.yml's name.
    """
    name = yaml.safe_load((REPO / "environment.yml").read_text())["name"]
    common = (REPO / "rules" / "common.smk").read_text()
    pattern = rf'^CONDA_ENV = hooks.conda_env\(workflow, "{re.escape(name)}"\)$'
    assert re.search(pattern, common, re.M)
    for path in RULE_FILES[1:]:
        text = path.read_text()
        rules = re.findall(r"^ *(?:rule|use rule) ", text, re.M)
        conda = re.findall(r"^ *conda:\n +CONDA_ENV\n", text, re.M)
        assert len(conda) == len(rules) - text.count("use rule "), path.name


def test_the_conda_directive_is_set_only_where_conda_deploys_or_lint_reads_it():
    """
    Without ``--sdm conda`` a job's ``conda`` is None: Snakemake records a rule's
    environment for every job, exporting a named one with ``conda env export``
    (snakemake/persistence, ``_conda_env``; snakemake/deployment/conda.py,
    ``_get_content``), which fails where conda is not installed and, when the record
    changes, reruns finished jobs.
    """
    from types import SimpleNamespace

    from snakemake_interface_executor_plugins.settings import DeploymentMethod

    from multigeom_workflow.snakemake_adapter import conda_env

    def workflow(*methods):
        return SimpleNamespace(
            deployment_settings=SimpleNamespace(deployment_method=set(methods))
        )

    assert conda_env(workflow(DeploymentMethod.CONDA), "env") == "env"
    assert conda_env(workflow(), "env") is None
    assert conda_env(workflow(DeploymentMethod.APPTAINER), "env") is None
