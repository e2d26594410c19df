"""
The container image: Debian slim with the local Python version, Snakemake and the
workflow's requirements pinned to the versions installed here, and this plugin (plus any
local packages named) added as local Python source.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from snakemake_interface_common.exceptions import WorkflowError

__all__ = ["container_image", "pinned_requirements"]

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def pinned_requirements(requirements: list[str]) -> list[str]:
    """
    Pin requirements to the versions installed locally.

    ``snakemake`` is always included. A requirement without a version specifier
    (``pandas``, ``multigeom[paper]``) becomes ``name[extras]==<local version>``; one
    with a specifier (``numpy>=2``) or a URL is kept as written.

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
        to).
    """
    pinned = set()
    for req in ["snakemake", *requirements]:
        m = _NAME.match(req)
        if m is None or m.group(3):
            pinned.add(req.strip())
            continue
        name, extras = m.group(1), m.group(2) or ""
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise WorkflowError(
                f"--modal-pip: {name!r} is not installed locally, so there is no "
                "version to pin it to; install it, or give a version (e.g. "
                f"'{name}==1.2.3')"
            ) from None
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
