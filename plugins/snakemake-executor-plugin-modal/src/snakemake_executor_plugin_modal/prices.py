"""
GPU specifications and prices: what a job asks for, and what its seconds cost.

A GPU specification is Modal's string for the ``gpu=`` argument of ``App.function``:
a type (``"A100"``, ``"A100-80GB"``, ``"H100"``, ``"L4"``, ...) optionally followed by
``:<count>`` (``"H100:2"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PRICES_USD_PER_S", "GpuRequest", "parse_gpu", "price_per_second"]

#: Modal GPU prices in USD per second per GPU (third-party copy of Modal's price page,
#: https://modal.com/pricing, July 2026). ``A100`` alone is Modal's 40 GB model.
PRICES_USD_PER_S = {
    "B200": 0.001736,
    "H200": 0.001261,
    "H100": 0.001097,
    "A100-80GB": 0.000694,
    "A100-40GB": 0.000583,
    "L40S": 0.000542,
    "A10": 0.000306,
    "L4": 0.000222,
    "T4": 0.000164,
}
_ALIASES = {"A100": "A100-40GB", "A10G": "A10", "H100!": "H100"}


@dataclass(frozen=True)
class GpuRequest:
    """
    The GPUs of one container.

    Attributes
    ----------
    type : str
        Modal GPU type, upper case as Modal writes it (``"A100-80GB"``).
    count : int
        GPUs in the container, at least 1.
    """

    type: str
    count: int = 1

    @property
    def modal_spec(self) -> str:
        """The ``gpu=`` string for Modal: ``"H100"`` or ``"H100:2"``."""
        return self.type if self.count == 1 else f"{self.type}:{self.count}"

    @property
    def usd_per_second(self) -> float:
        """Price of the container's GPUs, USD per second (``nan`` if unknown)."""
        return self.count * price_per_second(self.type)


def parse_gpu(spec: str) -> GpuRequest:
    """
    Read a GPU specification such as ``"A100"``, ``"h100:2"``.

    Parameters
    ----------
    spec : str
        ``TYPE`` or ``TYPE:COUNT``; the type is case-insensitive.

    Returns
    -------
    GpuRequest

    Raises
    ------
    ValueError
        If the count is not a positive integer or the type is empty.
    """
    text = str(spec).strip()
    gpu_type, _, count = text.partition(":")
    gpu_type = gpu_type.strip().upper()
    if not gpu_type:
        raise ValueError(f"GPU specification {spec!r} has no GPU type (e.g. 'A100')")
    if count:
        try:
            n = int(count)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(
                f"GPU specification {spec!r}: the count after ':' must be a positive "
                "integer (e.g. 'H100:2')"
            )
    else:
        n = 1
    return GpuRequest(gpu_type, n)


def price_per_second(gpu_type: str) -> float:
    """
    Price of one GPU of a type, USD per second; ``nan`` for a type not in the table.

    Source: :data:`PRICES_USD_PER_S`.
    """
    key = gpu_type.upper()
    key = _ALIASES.get(key, key)
    return PRICES_USD_PER_S.get(key, math.nan)
