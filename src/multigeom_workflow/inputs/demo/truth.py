"""
The ground truth of each demo area: `area_fisher`, the Fisher information J_area(x) of
its `GaborTeacher`, per test image.
"""

from __future__ import annotations

import torch

from .data import load_teacher

__all__ = ["area_fisher"]


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
