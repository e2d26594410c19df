"""
The floating-point arithmetic of a per-image estimate: what ``precision`` means on a
GPU, set for the estimator's duration and restored after, and a CPU emulation of TF32.

On Ampere and newer NVIDIA GPUs, PyTorch runs cuDNN convolutions of float32 tensors in
TF32 by default (``torch.backends.cudnn.allow_tf32 = True``: operands rounded to 10
mantissa bits, products accumulated in float32), and matrix products in IEEE float32
(``torch.backends.cuda.matmul.allow_tf32 = False``). Torch >= 2.9 spells the same
switches ``torch.backends.cudnn.conv.fp32_precision`` and
``torch.backends.cuda.matmul.fp32_precision`` (``"tf32"`` or ``"ieee"``) and warns on
the old ones. A row of D in Algorithm 1 is the difference of two UNet outputs that
differ by 2e-4 to 2e-3 of their size, TF32's rounding step (2**-11, about 4.9e-4): in
TF32 the estimate of G(x) is biased (docs/gpus.md).

- ``fp32``: IEEE float32 everywhere (TF32 off for convolutions and matrix products).
- ``tf32``: PyTorch's defaults on a GPU, as upstream's own command line runs there:
  convolutions in TF32, matrix products in IEEE float32. CUDA only.
- ``bf16`` (benchmarks only, refused in a configuration): a bfloat16 autocast.

References
----------
NVIDIA, "TensorFloat-32 in the A100 GPU accelerates AI training, HPC up to 20x" (2020);
PyTorch documentation, "CUDA semantics: TensorFloat-32 (TF32) on Ampere (and later)
devices".
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from ..settings.names import PRECISIONS as CONFIG_PRECISIONS

__all__ = [
    "CONFIG_PRECISIONS",
    "PRECISIONS",
    "TF32_ROUNDING_STEP",
    "arithmetic_flags",
    "check_precision",
    "emulated_tf32",
    "precision_context",
    "round_to_tf32",
]

#: Every precision the fast engine can run: the configuration's, and bf16 for the
#: benchmarks (its G eigenvalues were 2-3 times upstream's on the CPU: refused in a
#: configuration).
PRECISIONS = (*CONFIG_PRECISIONS, "bf16")
#: Relative rounding step of TF32 (10 explicit mantissa bits, round to nearest).
TF32_ROUNDING_STEP = 2.0**-11


def check_precision(
    precision: str, device: str | torch.device, allowed: tuple = CONFIG_PRECISIONS
) -> None:
    """
    Raise ValueError (one line naming the key, the value and what is allowed) if
    `precision` is not `allowed` or cannot run on `device` (tf32 needs a CUDA device:
    on the CPU it would silently be fp32).
    """
    if precision not in allowed:
        raise ValueError(
            f"config key 'precision' = {precision!r}: allowed: {', '.join(allowed)}"
        )
    if precision == "tf32" and torch.device(device).type != "cuda":
        raise ValueError(
            f"config key 'precision' = 'tf32' needs a CUDA device (device is "
            f"{str(device)!r}); allowed on the CPU: fp32"
        )


def _new_api() -> bool:
    """Whether this torch has the fp32_precision switches (torch >= 2.9)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    return conv is not None and hasattr(torch.backends.cuda.matmul, "fp32_precision")


def _get() -> tuple:
    if _new_api():
        return (
            torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cuda.matmul.fp32_precision,
        )
    return (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)


def _set(state: tuple) -> None:
    conv, matmul = state
    if _new_api():
        torch.backends.cudnn.conv.fp32_precision = conv
        torch.backends.cuda.matmul.fp32_precision = matmul
    else:
        torch.backends.cudnn.allow_tf32 = conv
        torch.backends.cuda.matmul.allow_tf32 = matmul


def arithmetic_flags() -> dict:
    """
    The switches in force, as a per-image file's provenance records them.

    Returns
    -------
    dict
        ``conv_tf32`` and ``matmul_tf32`` (bool: whether cuDNN convolutions and CUDA
        matrix products of float32 tensors may use TF32), ``api`` (the names read:
        ``"allow_tf32"`` before torch 2.9, ``"fp32_precision"`` after) and ``torch``
        (its version).
    """
    conv, matmul = _get()
    new = _new_api()
    return {
        "conv_tf32": conv == "tf32" if new else bool(conv),
        "matmul_tf32": matmul == "tf32" if new else bool(matmul),
        "api": "fp32_precision" if new else "allow_tf32",
        "torch": torch.__version__,
    }


@contextlib.contextmanager
def precision_context(precision: str, device: str | torch.device):
    """
    The arithmetic of `precision` (see the module's notes) for the duration of the
    block, whatever the process had set (an autocast included); the switches are
    restored after, also when the block raises.

    Parameters
    ----------
    precision : str
        One of `PRECISIONS`.
    device : str or torch.device
        Where the estimator runs (tf32 needs CUDA; bf16 autocasts on its type).

    Raises
    ------
    ValueError
        If `precision` is unknown or tf32 is asked on a device other than CUDA.
    """
    device = torch.device(device)
    check_precision(precision, device, PRECISIONS)
    new = _new_api()
    tf32, ieee = ("tf32", "ieee") if new else (True, False)
    saved = _get()
    _set((tf32 if precision == "tf32" else ieee, ieee))
    try:
        # fp32 and tf32 also switch off an autocast of the caller's.
        with torch.autocast(
            device.type, dtype=torch.bfloat16, enabled=precision == "bf16"
        ):
            yield
    finally:
        _set(saved)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """
    `x` (float32) rounded to TF32: 10 explicit mantissa bits, to nearest (ties away
    from zero, as the GPU's ``cvt.rna.tf32.f32``), float32 range; other dtypes are
    returned unchanged.

    Returns
    -------
    torch.Tensor
        Of `x`'s shape and dtype, each value within a relative `TF32_ROUNDING_STEP` of
        `x`'s, its 13 lowest mantissa bits zero. Gradients pass through unchanged (the
        rounding as a straight-through step), so that a Jacobian can be taken through
        it.
    """
    if x.dtype != torch.float32:
        return x
    with torch.no_grad():
        bits = x.detach().contiguous().view(torch.int32)
        # Adding half of the dropped part to the magnitude's bits rounds it to nearest;
        # a carry into the exponent gives the next power of two, as it should.
        rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32).view(x.shape)
    if not x.requires_grad:
        return rounded
    return x + (rounded - x).detach()  # exactly `rounded`: x and it are that close


#: The convolutions of float32 tensors that cuDNN runs in TF32 by default, with the
#: positions of their two operands.
_CONVOLUTIONS = {
    f: (0, 1)
    for f in (
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        torch.conv_transpose1d,
        torch.conv_transpose2d,
        torch.conv_transpose3d,
    )
}
#: The matrix products that ``cuda.matmul`` TF32 would cover (off in both precisions).
_MATMULS = {
    **{
        f: (0, 1)
        for f in (
            torch.matmul,
            torch.mm,
            torch.bmm,
            torch.nn.functional.linear,
            torch.Tensor.matmul,
            torch.Tensor.__matmul__,
        )
    },
    torch.addmm: (1, 2),
    torch.baddbmm: (1, 2),
}


class _EmulatedTF32(TorchFunctionMode):
    """Rounds the operands of convolutions (and matmuls if asked) to TF32."""

    def __init__(self, matmul: bool):
        super().__init__()
        self.operands = _CONVOLUTIONS | (_MATMULS if matmul else {})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        where = self.operands.get(func)
        if where:
            args = tuple(
                round_to_tf32(a) if i in where and isinstance(a, torch.Tensor) else a
                for i, a in enumerate(args)
            )
        return func(*args, **kwargs)


@contextlib.contextmanager
def emulated_tf32(matmul: bool = False):
    """
    TF32 on any device, for a measurement of its bias on the CPU: within the block, the
    two operands of every convolution (input and weight; with `matmul`, of every matrix
    product too) are rounded to TF32 (`round_to_tf32`) and the products accumulated in
    float32, the bias added in float32, as tensor cores do. `matmul` off is what
    precision ``tf32`` (PyTorch's GPU defaults) runs.

    Notes
    -----
    A GPU's tensor cores accumulate in float32 in another order than the CPU; the
    emulation reproduces the rounding of the operands, which dominates (2**-11 against
    float32's 2**-24 per addition).
    """
    with _EmulatedTF32(matmul):
        yield
