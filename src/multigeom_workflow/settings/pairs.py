"""
The kinds of pairs of configurations that Fig. 4D-E compares (Azeglio et al. 2026):
cross-model (two encoders fitted to the same area) and cross-area (one encoder fitted to
two areas). A pair that differs in both, or in neither, is not compared.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026). A multi-scale information geometry reveals
the structure of mutual information in neural populations. arXiv 2605.06304, Fig. 4D-E.
"""

from __future__ import annotations

__all__ = ["PAIR_KINDS", "pair_kind"]

#: The compared kinds, in the figure's order.
PAIR_KINDS = ("cross-model", "cross-area")


def pair_kind(a: tuple[str, str], b: tuple[str, str]) -> str | None:
    """
    The kind of the pair of configurations `a` and `b`.

    Parameters
    ----------
    a, b : tuple of str
        ``(encoder, area)`` of each configuration.

    Returns
    -------
    str or None
        ``"cross-model"`` (same area, two encoders), ``"cross-area"`` (same encoder,
        two areas), or None (both differ, or the same configuration twice).
    """
    (enc_a, area_a), (enc_b, area_b) = a, b
    if area_a == area_b and enc_a != enc_b:
        return "cross-model"
    if enc_a == enc_b and area_a != area_b:
        return "cross-area"
    return None
