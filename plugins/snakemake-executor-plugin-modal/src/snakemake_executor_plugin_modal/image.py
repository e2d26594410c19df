"""
The container image: Debian slim with the local Python version, Snakemake and the
workflow's requirements pinned to the versions installed here, and this plugin (plus any
local packages named) added as local Python source.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata

from snakemake_interface_common.exceptions import WorkflowError

__all__ = [
    "PYTHON_SERIES",
    "check_python_version",
    "container_image",
    "installable_version",
    "pinned_requirements",
]

#: Python series that Modal 1.6's image builders "2025.06" and "2026.10" (the current
#: one) both support (``modal._image.SUPPORTED_PYTHON_SERIES``; 3.10 is deprecated).
PYTHON_SERIES = ("3.11", "3.12", "3.13", "3.14")
#: Local version labels of builds whose public version is on the package index
#: (PyTorch's ``+cpu``/``+cu128``/``+rocm6.3`` wheels): the pin drops the label.
_INDEX_LABEL = re.compile(r"^(cpu|cu\d+|rocm[\d.]+|xpu)$")


def check_python_version(version_info=sys.version_info) -> str:
    """
    The container's Python series (this machine's), checked against
    :data:`PYTHON_SERIES`.

    Raises
    ------
    WorkflowError
        If Modal's image builder cannot give the container this Python.
    """
    series = f"{version_info[0]}.{version_info[1]}"
    if series not in PYTHON_SERIES:
        raise WorkflowError(
            f"Python {series}: Modal's image builder supports Python "
            f"{', '.join(PYTHON_SERIES)}; the container runs this machine's Python "
            "(pickled job data must match), so run Snakemake from one of those"
        )
    return series


def installable_version(name: str) -> str:
    """
    The version of a locally installed distribution that pip can install from the
    package index: the local version, without a PyTorch-style local label
    (``2.8.0+cpu`` -> ``2.8.0``, the index's CUDA build).

    Raises
    ------
    WorkflowError
        If the package is not installed, is installed from a folder or a URL
        (editable or not), or has another local label (``+g1a2b3c``): no such
        version is on the index.
    """
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise WorkflowError(
            f"--modal-pip: {name!r} is not installed locally, so there is no "
            "version to pin it to; install it, or give a version (e.g. "
            f"'{name}==1.2.3')"
        ) from None
    version = dist.version
    direct = dist.read_text("direct_url.json")
    if direct:
        info = json.loads(direct)
        how = (
            "editable"
            if info.get("dir_info", {}).get("editable")
            else "from " + info.get("url", "a URL")
        )
        raise WorkflowError(
            f"--modal-pip: {name} {version} is installed {how}, not from the "
            f"package index; give an installable version (e.g. '{name}==1.2.3') or "
            "copy its source with --modal-local-packages"
        )
    public, _, label = version.partition("+")
    if label and not _INDEX_LABEL.match(label):
        raise WorkflowError(
            f"--modal-pip: {name} {version} is a local build (label '+{label}') not "
            f"on the package index; give an installable version (e.g. "
            f"'{name}=={public}') or copy its source with --modal-local-packages"
        )
    return public


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def pinned_requirements(requirements: list[str]) -> list[str]:
    """
    Pin requirements to the versions installed locally.

    ``snakemake`` is always included. A requirement without a version specifier
    (``pandas``, ``multigeom[paper]``) becomes ``name[extras]==<local version>``
    (:func:`installable_version`: a ``+cpu`` label dropped, other local builds
    refused); one with a specifier (``numpy>=2``) or a URL is kept as written.

    Parameters
    ----------
    requirements : list of str
        PEP 508 requirement strings.

    Returns
    -------
    list of str
        Sorted, without duplicates.

    Raises
    ------
    WorkflowError
        If a requirement without a version is not installed locally (nothing to pin it
        to) or not from the package index.
    """
    pinned = set()
    for req in ["snakemake", *requirements]:
        m = _NAME.match(req)
        if m is None or m.group(3):
            pinned.add(req.strip())
            continue
        name, extras = m.group(1), m.group(2) or ""
        version = installable_version(name)
        pinned.add(f"{name}{extras}=={version}")
    return sorted(pinned)


def container_image(
    requirements: list[str], local_packages: list[str], commands: list[str] = ()
):
    """
    The ``modal.Image`` every job of the run uses.

    Parameters
    ----------
    requirements : list of str
        Extra pip requirements (``--modal-pip``), pinned by :func:`pinned_requirements`.
    local_packages : list of str
        Importable names of local packages to copy into the image
        (``--modal-local-packages``), e.g. a workflow's own package.
    commands : list of str
        Shell commands run when the image is built, after the pip installs
        (``--modal-image-commands``), e.g. to cache model weights in the image.

    Returns
    -------
    modal.Image
        Built by Modal on first use and cached by Modal while its definition is
        unchanged.
    """
    import modal

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    image = modal.Image.debian_slim(python_version=python).pip_install(
        *pinned_requirements(requirements)
    )
    if commands:
        image = image.run_commands(*commands)
    return image.add_local_python_source(
        "snakemake_executor_plugin_modal", *local_packages
    )
