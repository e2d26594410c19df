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
    #: Types Modal may take instead, in this order, when ``type`` is not available
    #: (a GPU fallback list, allowed by Modal 1.6 in ``App.function(gpu=[...])``).
    fallbacks: tuple[str, ...] = ()

    @property
    def modal_spec(self) -> str | list[str]:
        """
        The ``gpu=`` value for Modal: ``"H100"``, ``"H100:2"``, or a list of such
        strings for a fallback list.
        """
        specs = [t if self.count == 1 else f"{t}:{self.count}" for t in self.types]
        return specs[0] if len(specs) == 1 else specs

    @property
    def types(self) -> tuple[str, ...]:
        """The type and its fallbacks, in Modal's order of preference."""
        return (self.type, *self.fallbacks)

    @property
    def usd_per_second(self) -> float:
        """
        Price of the container's GPUs, USD per second (``nan`` if unknown); for a
        fallback list, that of its most expensive type (what a budget must allow).
        """
        return self.count * max(price_per_second(t) for t in self.types)


def parse_gpu(spec: str | list[str]) -> GpuRequest:
    """
    Read a GPU specification such as ``"A100"``, ``"h100:2"``, or a fallback list
    ``"A100-80GB,H100"`` (or a list of strings): Modal takes the first type it has.

    Parameters
    ----------
    spec : str or list of str
        ``TYPE`` or ``TYPE:COUNT``; the type is case-insensitive. In a list, every
        entry has the same count.

    Returns
    -------
    GpuRequest

    Raises
    ------
    ValueError
        If the count is not a positive integer, the type is empty, or the entries of a
        list have different counts.
    """
    parts = spec if isinstance(spec, list) else str(spec).split(",")
    if len(parts) > 1:
        requests = [parse_gpu(p) for p in parts]
        if len({r.count for r in requests}) > 1:
            raise ValueError(
                f"GPU specification {spec!r}: every type of a fallback list needs the "
                "same count (e.g. 'A100-80GB:2,H100:2')"
            )
        types = tuple(dict.fromkeys(r.type for r in requests))
        return GpuRequest(types[0], requests[0].count, types[1:])
    text = str(parts[0]).strip()
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
