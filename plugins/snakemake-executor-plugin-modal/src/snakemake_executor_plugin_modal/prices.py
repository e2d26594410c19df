"""
What a container asks for and what its seconds cost: its GPUs (a GPU specification,
priced per GPU type), its CPU cores and its memory (priced per core and per GiB), all
at Modal's published per-second rates (`ContainerRequest`).

A GPU specification is Modal's string for the ``gpu=`` argument of ``App.function``:
a type (``"A100"``, ``"A100-80GB"``, ``"H100"``, ``"L4"``, ...) optionally followed by
``:<count>`` (``"H100:2"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "CPU_USD_PER_CORE_S",
    "DEFAULT_CPU_CORES",
    "DEFAULT_MEMORY_MIB",
    "MEMORY_USD_PER_GIB_S",
    "PRICES_USD_PER_S",
    "ContainerRequest",
    "GpuRequest",
    "give_prices",
    "given_prices",
    "parse_gpu",
    "parse_prices",
    "price_per_second",
    "price_table",
]

#: Modal GPU prices in USD per second per GPU (third-party copy of Modal's price page,
#: https://modal.com/pricing, July 2026). ``A100`` alone is Modal's 40 GB model.
#: Types Modal sells that are not here (``RTX-PRO-6000`` and ``B200+`` among them;
#: modal 1.6.4's client holds no list of types, its server checks them) have no
#: price the plugin could copy from a dated page: a run refuses them in one line
#: until a price is given (``--modal-gpu-prices``, :func:`give_prices`), rather
#: than guessing one.
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
#: Modal's CPU price, USD per physical core per second ("Physical core (2 vCPU
#: equivalent)", $0.0000131 / core / sec), from the same page and date as
#: :data:`PRICES_USD_PER_S` (https://modal.com/pricing, July 2026). Modal's own page
#: could not be read from where this was written: the number is as two third-party
#: copies of that page give it (one says it was checked on the page on 2026-06-27).
#: Modal's ``cpu=`` counts physical cores, not vCPUs (docs, guide "Reserving CPU and
#: memory").
CPU_USD_PER_CORE_S = 0.0000131
#: Modal's memory price, USD per GiB per second ($0.00000222 / GiB / sec), from the
#: same page, date and copies as :data:`CPU_USD_PER_CORE_S` (not verified on Modal's
#: page itself either).
MEMORY_USD_PER_GIB_S = 0.00000222
#: What Modal reserves, and bills at least, for a container that requests no CPU
#: (physical cores) or no memory (MiB): "a default reservation of 0.125 CPU cores
#: and 128 MiB of memory" (docs, guide "Reserving CPU and memory").
DEFAULT_CPU_CORES = 0.125
DEFAULT_MEMORY_MIB = 128
_ALIASES = {"A100": "A100-40GB", "A10G": "A10", "H100!": "H100"}
#: Prices given for this run (``--modal-gpu-prices``; a workflow may add its own),
#: USD per second per GPU, by type as :func:`parse_gpu` writes it; they win over
#: :data:`PRICES_USD_PER_S`.
_GIVEN: dict[str, float] = {}


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


@dataclass(frozen=True)
class ContainerRequest:
    """
    What one container requests of Modal, and what each of its seconds costs.

    Modal bills a container per second for its GPUs, its CPU cores and its memory,
    each at its rate (https://modal.com/pricing): GPUs at their type's price
    (:data:`PRICES_USD_PER_S`), cores at :data:`CPU_USD_PER_CORE_S`, memory at
    :data:`MEMORY_USD_PER_GIB_S`. For CPU and memory Modal bills "whichever is
    higher: your reservation or actual usage" (docs, guide "Reserving CPU and
    memory"): the request is priced here, what a container uses beyond it cannot be
    known before it runs.

    Attributes
    ----------
    gpu : GpuRequest or None
        Its GPUs; None: a CPU container.
    cpu : float
        Physical CPU cores requested (``cpu=``); Modal's default,
        :data:`DEFAULT_CPU_CORES`, where none.
    memory_mb : int or None
        Memory requested (``memory=``), MiB; None: Modal's default,
        :data:`DEFAULT_MEMORY_MIB`.

    Notes
    -----
    A function's ``ephemeral_disk`` raises its billed memory ("Disk requests are
    billed by increasing the memory request at a 20:1 ratio", the same guide); the
    plugin requests none for its jobs, so none is priced here.
    """

    gpu: GpuRequest | None = None
    cpu: float = DEFAULT_CPU_CORES
    memory_mb: int | None = None

    @property
    def cores(self) -> float:
        """Physical cores billed per second: the request."""
        return float(self.cpu)

    @property
    def memory_gib(self) -> float:
        """GiB of memory billed per second: the request (MiB / 1024), Modal's
        default of :data:`DEFAULT_MEMORY_MIB` MiB where none."""
        return (self.memory_mb or DEFAULT_MEMORY_MIB) / 1024

    @property
    def gpus(self) -> int:
        """GPUs in the container (0 for a CPU container)."""
        return 0 if self.gpu is None else self.gpu.count

    @property
    def gpu_usd_per_second(self) -> float:
        """Its GPUs' price, USD per second: 0 without GPUs, ``nan`` for a type
        without a price, the dearest type of a fallback list."""
        return 0.0 if self.gpu is None else self.gpu.usd_per_second

    @property
    def cpu_usd_per_second(self) -> float:
        """Its cores' price, USD per second: cores x :data:`CPU_USD_PER_CORE_S`."""
        return self.cores * CPU_USD_PER_CORE_S

    @property
    def memory_usd_per_second(self) -> float:
        """Its memory's price, USD per second: GiB x :data:`MEMORY_USD_PER_GIB_S`."""
        return self.memory_gib * MEMORY_USD_PER_GIB_S

    @property
    def usd_per_second(self) -> float:
        """
        What one second of the container costs, USD: GPUs + cores + memory
        (``nan`` where a GPU type has no price).
        """
        return (
            self.gpu_usd_per_second
            + self.cpu_usd_per_second
            + self.memory_usd_per_second
        )


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
    Price of one GPU of a type, USD per second; ``nan`` for a type without one.

    Source: the prices given (:func:`give_prices`), else :data:`PRICES_USD_PER_S`.
    """
    key = _key(gpu_type)
    return _GIVEN.get(key, PRICES_USD_PER_S.get(key, math.nan))


def _key(gpu_type: str) -> str:
    key = str(gpu_type).strip().upper()
    return _ALIASES.get(key, key)


def parse_prices(entries) -> dict[str, float]:
    """
    Read GPU prices given as ``TYPE=USD`` (USD per second per GPU, as Modal's price
    page, https://modal.com/pricing, shows them), e.g. ``RTX-PRO-6000=0.000842``.

    Parameters
    ----------
    entries : list of str, or str
        One entry each (a string holds entries separated by spaces).

    Returns
    -------
    dict
        Type (upper case, aliases resolved) -> USD per second.

    Raises
    ------
    ValueError
        If an entry is not ``TYPE=USD`` with a price > 0.
    """
    if isinstance(entries, str):
        entries = entries.split()
    found = {}
    for entry in entries or []:
        gpu_type, sep, usd = str(entry).partition("=")
        try:
            price = float(usd) if sep and gpu_type.strip() else math.nan
        except ValueError:
            price = math.nan
        if not price > 0 or math.isinf(price):
            raise ValueError(
                f"--modal-gpu-prices: {entry!r} is not TYPE=USD, the price of one GPU "
                "per second from Modal's price page (e.g. 'RTX-PRO-6000=0.000842')"
            )
        found[_key(gpu_type)] = price
    return found


def give_prices(prices: dict[str, float]) -> None:
    """Add prices (type -> USD per second per GPU) for this process's run; they
    win over the table."""
    _GIVEN.update({_key(k): float(v) for k, v in prices.items()})


def given_prices() -> dict[str, float]:
    """The prices given for this run (:func:`give_prices`)."""
    return dict(_GIVEN)


def price_table() -> dict[str, float]:
    """Every priced type, USD per second per GPU: the table and the prices given."""
    return {**PRICES_USD_PER_S, **_GIVEN}
