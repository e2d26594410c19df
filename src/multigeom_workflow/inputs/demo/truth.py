"""
The ground truth of each demo area: `area_fisher`, the Fisher information J_area(x) of
its `GaborTeacher`, per test image; `write_area_fisher`, an area's files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .data import load_teacher

__all__ = ["area_fisher", "write_area_fisher"]


def area_fisher(area: dict, image: torch.Tensor, top_k: int) -> dict:
    """
    The ground truth of a demo area at one image: the Fisher information
    J_area(x) = sigma^-2 J_f^T J_f of its `GaborTeacher` f (J_f the N x P Jacobian),
    by upstream's `multigeom.geometry.fisher.fisher_eigendecomposition`.

    Parameters
    ----------
    area : dict
        A demo area, as `simulate_area` returns it (its ``noise_sigma`` is sigma).
    image : torch.Tensor
        Of shape (1, 1, 64, 64), pixels in [-1, 1].
    top_k : int
        Eigenpairs kept.

    Returns
    -------
    dict
        ``area``, ``J_eigenvalues`` of shape (top_k,), in decreasing order, and
        ``J_eigenvectors`` of shape (top_k, 4096), orthonormal rows, ``sigma``.
    """
    from multigeom.geometry.fisher import fisher_eigendecomposition

    sigma = float(area["noise_sigma"])
    out = fisher_eigendecomposition(
        image, load_teacher(area), sigma=sigma, top_k=top_k, device=torch.device("cpu")
    )
    return {
        "area": area["area"],
        "J_eigenvalues": out.eigenvalues.detach().cpu(),
        "J_eigenvectors": out.eigenvectors.detach().cpu(),
        "sigma": sigma,
    }


def write_area_fisher(
    area_file: str | Path,
    image_files: Sequence[str | Path],
    out_files: Sequence[str | Path],
    top_k: int,
) -> None:
    """
    The ground truth of a demo area at each of its test images, one file per image
    (rule area_fisher): `area_fisher` of image i written to ``out_files[i]`` with its
    ``img_idx`` i, each file whole or not at all.

    One process for all the images of an area: an image takes a fraction of a second,
    starting a process that imports torch about three CPU seconds. Each image's result
    is computed alone, so it is the same whichever images share the process.

    Parameters
    ----------
    area_file : str or Path
        The area, as rule simulate_area writes it.
    image_files : sequence of str or Path
        Test images 0, 1, ... in their source's order.
    out_files : sequence of str or Path
        Where each image's ground truth goes, as many as `image_files`.
    top_k : int
        Eigenpairs kept.

    Raises
    ------
    ValueError
        When `image_files` and `out_files` differ in length.
    """
    from ...atomic import atomic_path
    from ..images import load_test_image

    if len(image_files) != len(out_files):
        raise ValueError(
            f"{len(image_files)} test images but {len(out_files)} ground-truth files"
        )
    area = torch.load(area_file, weights_only=False)
    for index, (image_file, out) in enumerate(zip(image_files, out_files, strict=True)):
        truth = area_fisher(area, load_test_image(image_file).unsqueeze(0), top_k)
        truth["img_idx"] = index
        with atomic_path(out) as tmp:
            torch.save(truth, tmp)
