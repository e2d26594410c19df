"""
The `fast` engine: Algorithm 1 (the conditional-pair estimator of G(x)) and the Fisher
baseline J(x), re-implemented for large batches, beside upstream's
`multigeom.geometry.estimator.conditional_pair_estimate` and
`multigeom.geometry.fisher.fisher_eigendecomposition` (the `upstream` engine, the
reference).

It is the same estimator, not an approximation of it:

- the same random numbers: z [B, 1, H, W], xi_1 [B, N], xi_2 [B, N] drawn from the
  image's generator (seeded ``seed + i``) batch after batch in upstream's order, so that
  the two engines differ only by floating-point rounding;
- the same grid, trapezoid weights (upstream's own helpers) and row scales
  sqrt(w_j / (2 N_MC));
- the same top-k eigenpairs of G(x) ~ DᵀD and J(x) = sigma^-2 J_fᵀ J_f.

What differs is how the work is batched: the Monte-Carlo batches of several timesteps go
through the UNet together (`rows_per_call` rows, a function of the device's total
memory and the settings only, so that an image gives the same tensors in any process;
the two conditional passes fused into one call of twice as many rows; fewer rows after
an out-of-memory error), D stays on the device, its top-k eigenpairs come (on a GPU)
from the eigendecomposition of the smaller Gram matrix (DDᵀ or DᵀD) in float64 where
the GPU's float64 is fast, or in float32 refined in float64 where it is not
(`top_eigenpairs`), instead of a float32 SVD of D on the CPU, and the Jacobian J_f is
computed by batched vector-Jacobian products (one vmapped backward pass) instead of
one backward pass per neuron. Both engines run in the arithmetic that ``precision``
names (`multigeom_workflow.compute.arithmetic`).

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026), "A multi-scale information geometry
reveals the structure of mutual information in neural populations", arXiv 2605.06304,
Algorithm 1 and Appendix C.2.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import torch

from ..settings.names import ENGINES
from .arithmetic import (
    CONFIG_PRECISIONS,
    PRECISIONS,
    check_precision,
    precision_context,
)
from .gpu_errors import is_out_of_memory
from .gpus import VISIBLE_GPUS_ENV

__all__ = [
    "CONFIG_PRECISIONS",
    "EIGEN_METHODS",
    "ENGINES",
    "FAST_FLOAT64_CAPABILITIES",
    "MAX_CALL_ELEMENTS",
    "MEMORY_FRACTION",
    "PRECISIONS",
    "activation_elements",
    "check_precision",
    "conditional_pair_fast",
    "cpu_threads",
    "device_memory",
    "draw_noise",
    "eigen_method",
    "estimate_image_fast",
    "fisher_fast",
    "precision_context",
    "rows_per_call",
    "top_eigenpairs",
]

log = logging.getLogger(__name__)

#: Environment variable capping the rows of D per UNet call of the fast engine.
ROWS_ENV = "MULTIGEOM_FAST_ROWS"
#: The fraction of a GPU's total memory that the activations of one UNet call may take,
#: counted as every module's output kept at once (nested modules' outputs counted at
#: each level): an upper bound on what a call under `no_grad` holds.
MEMORY_FRACTION = 0.5
#: The most elements of any module's output in one UNet call: a quarter of 2**31, for
#: what module outputs do not show (attention scores, convolution workspaces), so that
#: no tensor reaches the 2**31 elements that 32-bit indexing (some cuDNN paths) fails
#: on.
MAX_CALL_ELEMENTS = 2**29


@contextlib.contextmanager
def cpu_threads(device: str | torch.device):
    """
    On a CUDA device, let torch's CPU-side work use this process's share of the CPU
    cores (the cores it may run on, divided by the visible GPUs) instead of the one
    thread a per-image job is scheduled with; restored after. Nothing changes on the
    CPU, where each job is one core's worth of work.
    """
    if torch.device(device).type != "cuda":
        yield
        return
    before = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    # a process narrowed to one GPU slice sees one device: the run's count comes
    # with it (multigeom_workflow.compute.gpus.Slot.environment)
    gpus = int(os.environ.get(VISIBLE_GPUS_ENV) or 0) or torch.cuda.device_count()
    share = max(1, cores // max(1, gpus))
    torch.set_num_threads(max(before, share))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def draw_noise(
    generator: torch.Generator | None,
    n_timesteps: int,
    n_samples: int,
    batch_size: int,
    image_shape: tuple[int, int],
    n_neurons: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    The Monte-Carlo draws of Algorithm 1, in upstream's order and shapes: for every
    timestep, for every batch of `batch_size`, z [B, 1, H, W], then xi_1 [B, N], then
    xi_2 [B, N] (upstream's encoder pass between them draws nothing).

    Returns
    -------
    z : torch.Tensor
        Of shape (n_timesteps * n_samples, 1, H, W), rows in upstream's order.
    xi1, xi2 : torch.Tensor
        Of shape (n_timesteps * n_samples, n_neurons).
    """
    H, W = image_shape
    zs, x1s, x2s = [], [], []
    for _ in range(n_timesteps * (n_samples // batch_size)):
        zs.append(torch.randn(batch_size, 1, H, W, device=device, generator=generator))
        x1s.append(
            torch.randn(batch_size, n_neurons, device=device, generator=generator)
        )
        x2s.append(
            torch.randn(batch_size, n_neurons, device=device, generator=generator)
        )
    return torch.cat(zs), torch.cat(x1s), torch.cat(x2s)


def device_memory(device: torch.device) -> int | None:
    """
    The total memory of a CUDA device in bytes (a property of the device, not of what
    this or another process holds now); None for the CPU.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


@torch.no_grad()
def activation_elements(
    unet: torch.nn.Module,
    n_neurons: int,
    device: torch.device,
    image_shape: tuple[int, int] = (64, 64),
) -> tuple[int, int]:
    """
    The activations of one UNet sample, counted from the outputs of all its modules
    (forward hooks) in a probe call of 2 samples: a function of the model and the image
    size only.

    Returns
    -------
    largest : int
        Elements of the largest module output, per sample.
    total : int
        Elements of all module outputs together, per sample (what the call would hold
        if it kept them all: an upper bound on its live activations).
    """
    H, W = image_shape
    n = 2
    sizes = []

    def count(module, args, output):
        for out in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(out, torch.Tensor):
                sizes.append(out.numel())
            elif hasattr(out, "sample"):  # diffusers' output dataclasses
                sizes.append(out.sample.numel())

    handles = [m.register_forward_hook(count) for m in unet.modules()]
    try:
        unet(
            torch.zeros(n, 1, H, W, device=device),
            torch.full((n,), 1, dtype=torch.long, device=device),
            torch.zeros(n, n_neurons, device=device),
        )
    finally:
        for h in handles:
            h.remove()
    return -(-max(sizes) // n), -(-sum(sizes) // n)


def rows_per_call(
    unet: torch.nn.Module,
    n_neurons: int,
    total_rows: int,
    device: torch.device,
    batch_size: int,
    image_shape: tuple[int, int] = (64, 64),
    *,
    memory: int | None = None,
) -> int:
    """
    Rows of D computed per UNet call (each row 2 samples of the fused conditional
    pass): a function of the device's total memory and the settings only, never of the
    memory free at the time, so that an image gives the same tensors in a warm worker,
    a cold job and a container.

    With `memory` (default `device_memory`: a GPU's total memory), the most rows whose
    activations (`activation_elements`, float32) fit in `MEMORY_FRACTION` of it and
    whose largest module output stays within `MAX_CALL_ELEMENTS`; without (the CPU), the
    estimator's `batch_size` (larger batches were slower there: their activations leave
    the caches). The environment variable ``MULTIGEOM_FAST_ROWS`` caps it; never more
    than `total_rows`, never fewer than 1.

    Raises
    ------
    ValueError
        If ``MULTIGEOM_FAST_ROWS`` is not a positive integer.
    """
    cap = os.environ.get(ROWS_ENV)
    if cap is not None and (not cap.isdigit() or int(cap) < 1):
        raise ValueError(
            f"environment variable {ROWS_ENV} = {cap!r}: allowed: a positive integer"
        )
    if memory is None:
        memory = device_memory(device)
    if memory is None:
        rows = batch_size
    else:
        largest, total = activation_elements(unet, n_neurons, device, image_shape)
        by_memory = int(MEMORY_FRACTION * memory) // (2 * total * 4)
        by_elements = MAX_CALL_ELEMENTS // (2 * largest)
        rows = min(by_memory, by_elements)
    if cap is not None:
        rows = min(rows, int(cap))
    return max(1, min(rows, total_rows))


#: How the fast engine takes the top-k eigenpairs of DᵀD: ``gram`` (the float64 Gram
#: matrix's eigendecomposition), ``gram32`` (the float32 Gram matrix's, refined in
#: float64), ``svd`` (upstream's float32 thin SVD of D) or ``auto`` (`eigen_method`).
EIGEN_METHODS = ("auto", "gram", "gram32", "svd")
#: CUDA compute capabilities whose float64 runs at half the float32 rate: P100 (6.0),
#: V100 (7.0), A100 and A30 (8.0), H100 and H200 (9.0), B200 (10.0). The others (T4
#: 7.5, A10 8.6, L4 and L40S 8.9, RTX 5090 12.0, B300 10.3) run it at 1/32 to 1/64.
FAST_FLOAT64_CAPABILITIES = ((6, 0), (7, 0), (8, 0), (9, 0), (10, 0))
#: Extra eigenpairs the float32 route refines with the k wanted.
OVERSAMPLING = 10


def eigen_method(device: str | torch.device) -> str:
    """
    The eigen-step of ``auto`` on `device`, a function of the device alone: ``gram``
    on a GPU whose float64 is fast (`FAST_FLOAT64_CAPABILITIES`), ``gram32`` on the
    other GPUs, ``svd`` (upstream's) on the CPU, where the Gram route was not faster.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "svd"
    fast = tuple(torch.cuda.get_device_capability(device)) in FAST_FLOAT64_CAPABILITIES
    return "gram" if fast else "gram32"


def _svd(D: torch.Tensor, k: int):
    _, S, Vh = torch.linalg.svd(D, full_matrices=False)
    return (S**2)[:k], Vh[:k]


def _gram(D: torch.Tensor, k: int):
    """float64 Gram matrix (the smaller of DᵀD and DDᵀ) and its eigendecomposition."""
    R, P = D.shape
    D64 = D.double()
    if R >= P:
        values, vectors = torch.linalg.eigh(D64.T @ D64)
        return values.flip(0)[:k], vectors.flip(1)[:, :k].T
    values, U = torch.linalg.eigh(D64 @ D64.T)
    V = D64.T @ U.flip(1)[:, :k]  # (P, k), column i has norm sqrt(values[i])
    return values.flip(0)[:k], (V / V.norm(dim=0).clamp_min(1e-300)).T


def _gram32(D: torch.Tensor, k: int):
    """
    float32 Gram matrix and eigendecomposition for the top k + `OVERSAMPLING`
    eigenvectors, then in float64 one subspace iteration (Q = orth(DᵀD V)) and the
    Rayleigh-Ritz step (the eigendecomposition of QᵀDᵀDQ, m x m): float64 accuracy
    from float64 work of O(R P m) instead of O(P³).
    """
    R, P = D.shape
    m = min(k + OVERSAMPLING, R, P)
    if R >= P:
        _, vectors = torch.linalg.eigh(D.T @ D)
        V0 = vectors[:, -m:]
    else:
        _, U = torch.linalg.eigh(D @ D.T)
        V0 = D.T @ U[:, -m:]
    D64 = D.double()
    Q, _ = torch.linalg.qr(D64.T @ (D64 @ V0.double()))
    Y = D64 @ Q  # (R, m)
    values, W = torch.linalg.eigh((Y.T @ Y).cpu())  # m x m: on the CPU, any GPU
    W = W.to(Q.device)
    return values.flip(0)[:k].to(Q.device), (Q @ W.flip(1)[:, :k]).T


_ROUTES = {"svd": _svd, "gram": _gram, "gram32": _gram32}


def top_eigenpairs(
    D: torch.Tensor, k: int, method: str = "auto", stats: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The k largest eigenpairs of DᵀD, on D's device.

    ``gram``: the eigendecomposition (`torch.linalg.eigh`) of the smaller Gram matrix,
    accumulated in float64: DᵀD (P x P) when D has at least as many rows as columns,
    else DDᵀ (R x R), whose eigenvectors u give those of DᵀD as Dᵀu (normalised).
    ``gram32``: the same in float32 for k + 10 eigenvectors, refined in float64 (one
    subspace iteration and a Rayleigh-Ritz step), for GPUs whose float64 is slow.
    ``svd``: upstream's thin SVD of D (eigenvalues S², rows of Vᵀ). ``auto``:
    `eigen_method` of D's device. All give upstream's result up to signs and rounding.
    The Gram products run in IEEE float32/float64 whatever the TF32 switches.

    If the solver fails (`torch.linalg.LinAlgError`, a cuSOLVER or out-of-memory
    error: any RuntimeError) or returns values that are not finite, the step is done
    again on the CPU in float64 (``gram``), and failing that by the CPU's SVD; the
    fall-back is logged.

    Parameters
    ----------
    D : torch.Tensor
        Of shape (R, P), float32.
    k : int
        Eigenpairs wanted; min(k, R, P) are returned, as upstream's SVD does.
    method : str
        One of `EIGEN_METHODS`.
    stats : dict, optional
        Receives ``eigen_method`` (the route that gave the result, with ``@cpu`` after
        a fall-back).

    Returns
    -------
    eigenvalues : torch.Tensor
        Of shape (k,), float32, descending, >= 0, on D's device.
    eigenvectors : torch.Tensor
        Of shape (k, P), float32, unit rows, on D's device.

    Raises
    ------
    ValueError
        If `method` is unknown.
    RuntimeError
        If every route failed (the last error).
    """
    if method not in EIGEN_METHODS:
        raise ValueError(
            f"eigen method {method!r}: allowed: {', '.join(EIGEN_METHODS)}"
        )
    if method == "auto":
        method = eigen_method(D.device)
    R, P = D.shape
    k = min(int(k), R, P)
    attempts = [(method, D)]
    for fallback in ("gram", "svd"):
        if (fallback, "cpu") != (method, D.device.type):
            attempts.append((fallback, None))
    error = None
    for route, matrix in attempts:
        where = route if matrix is not None else f"{route}@cpu"
        try:
            with precision_context("fp32", D.device):
                values, vectors = _ROUTES[route](
                    matrix if matrix is not None else D.cpu(), k
                )
            if not (values.isfinite().all() and vectors.isfinite().all()):
                raise torch.linalg.LinAlgError(f"{where}: values that are not finite")
        except RuntimeError as err:
            log.warning(
                "eigen-step %s failed (%s); trying the next route",
                where,
                str(err).splitlines()[0] if str(err) else type(err).__name__,
            )
            error = err
            continue
        if stats is not None:
            stats["eigen_method"] = where
        return (
            values.clamp_min(0).float().to(D.device).contiguous(),
            vectors.float().to(D.device).contiguous(),
        )
    raise error


@torch.no_grad()
def conditional_pair_fast(
    image: torch.Tensor,
    encoder: torch.nn.Module,
    unet: torch.nn.Module,
    alphas_cumprod: torch.Tensor,
    cfg,
    device: torch.device,
    generator: torch.Generator | None = None,
    *,
    precision: str = "fp32",
    max_rows: int | None = None,
    eigen: str = "auto",
    stats: dict | None = None,
):
    """
    The top-k eigenpairs of G(x) by Algorithm 1, as upstream's
    `conditional_pair_estimate` computes them (same arguments, same draws), in large
    batches.

    A UNet call that runs out of GPU memory (`torch.OutOfMemoryError`, or a GPU
    library's allocation failure: `multigeom_workflow.compute.gpu_errors
    .is_out_of_memory`) is made again with half the rows, down to one, the draws
    unchanged; the first such retry of an image is logged.

    Parameters
    ----------
    image : torch.Tensor
        Of shape (1, 1, H, W), pixels in [-1, 1].
    encoder, unet : torch.nn.Module
        f(x): (B, 1, H, W) -> (B, N); eps_theta(x_t, t, r) -> (B, 1, H, W).
    alphas_cumprod : torch.Tensor
        Of shape (T,), on `device`.
    cfg : namespace
        Upstream's estimator settings (``multigeom/configs/estimator.yaml``).
    device : torch.device
    generator : torch.Generator, optional
        On `device`, seeded ``seed + i`` for image i.
    precision : str
        One of `PRECISIONS` (`multigeom_workflow.compute.arithmetic`), in force for the
        whole estimate.
    max_rows : int, optional
        Rows of D per UNet call; default `rows_per_call`.
    eigen : str
        How the eigenpairs are taken (`top_eigenpairs`).
    stats : dict, optional
        Receives ``rows_per_call`` (at the start), ``rows_per_call_final`` (after any
        out-of-memory retry), ``oom_retries``, ``unet_seconds`` (the UNet and encoder
        passes), ``eigen_seconds`` and ``eigen_method``.

    Returns
    -------
    multigeom.geometry.estimator.EstimatorOutput
        `eigenvalues` of shape (k,) and `eigenvectors` of shape (k, H * W), on `device`.

    Raises
    ------
    ValueError
        If the image is not one image, N_MC is not a multiple of the batch size, or the
        precision is not allowed on `device`.
    torch.OutOfMemoryError
        If one row does not fit: one line naming the device and the library's error
        (raised from it).
    """
    device = torch.device(device)
    check_precision(precision, device, PRECISIONS)
    with precision_context(precision, device):
        return _conditional_pair_fast(
            image, encoder, unet, alphas_cumprod, cfg, device, generator,
            max_rows=max_rows, eigen=eigen, stats={} if stats is None else stats,
        )  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _conditional_pair_fast(
    image, encoder, unet, alphas_cumprod, cfg, device, generator, *, max_rows, eigen,
    stats,
):  # fmt: skip
    from multigeom.geometry.estimator import (
        EstimatorOutput,
        _build_log_tau_grid,
        _trapezoid_weights,
    )

    encoder.eval()
    unet.eval()
    if image.dim() != 4 or image.shape[0] != 1:
        raise ValueError(
            f"Expected single-image batch [1, C, H, W], got {tuple(image.shape)}"
        )
    image = image.to(device)
    H, W = image.shape[-2:]
    P = H * W
    mc = cfg.monte_carlo
    grid_t = list(
        range(mc.timestep_grid.start, mc.timestep_grid.stop + 1, mc.timestep_grid.step)
    )
    w = _trapezoid_weights(_build_log_tau_grid(grid_t, alphas_cumprod))
    N_MC, B = int(mc.n_samples), int(mc.batch_size)
    sigma = float(mc.observation_noise_sigma)
    if N_MC % B != 0:
        raise ValueError(f"N_MC={N_MC} must be divisible by batch_size={B}")
    n_neurons = int(encoder.n_neurons)
    R = len(grid_t) * N_MC

    t0 = time.perf_counter()
    z, xi1, xi2 = draw_noise(generator, len(grid_t), N_MC, B, (H, W), n_neurons, device)
    # Per-row constants, float32 like upstream's (python floats of float32 values).
    t_rows = torch.tensor(grid_t, device=device).repeat_interleave(N_MC)
    a_bar = alphas_cumprod[t_rows]
    sqrt_ab = a_bar.sqrt().view(R, 1, 1, 1)
    sqrt_1m = (1.0 - a_bar).sqrt().view(R, 1, 1, 1)
    scale = (w / (2.0 * N_MC)).sqrt().float().repeat_interleave(N_MC).view(R, 1)

    def rows_of_D(a: int, b: int) -> torch.Tensor:
        m = b - a
        t = t_rows[a:b]
        x_t = sqrt_ab[a:b] * image + sqrt_1m[a:b] * z[a:b]
        eps_u = unet(x_t, t, torch.zeros(m, n_neurons, device=device)).float()
        x_hat = ((x_t - sqrt_1m[a:b] * eps_u) / sqrt_ab[a:b]).clamp(-1.0, 1.0)
        mu = encoder(x_hat).float()
        r = torch.cat([mu + sigma * xi1[a:b], mu + sigma * xi2[a:b]])
        eps = unet(torch.cat([x_t, x_t]), torch.cat([t, t]), r).float()
        return scale[a:b] * (eps[:m] - eps[m:]).reshape(m, P)

    rows = max_rows or rows_per_call(unet, n_neurons, R, device, B, (H, W))
    stats.update(rows_per_call=rows, oom_retries=0)
    D = torch.empty(R, P, dtype=torch.float32, device=device)
    a = 0
    while a < R:
        b = min(a + rows, R)
        try:
            D[a:b] = rows_of_D(a, b)
            a = b
            continue
        except RuntimeError as err:  # cuBLAS and cuDNN say it in their own words
            if not is_out_of_memory(err):
                raise
            said = str(err).splitlines()[0] if str(err) else type(err).__name__
            if b - a == 1:
                raise torch.OutOfMemoryError(
                    f"out of GPU memory on {device} even at one row of D per UNet "
                    f"call: {said}"
                ) from err
        # Out of the except block, the failed call's tensors are freed.
        rows = max(1, (b - a) // 2)
        if stats["oom_retries"] == 0:
            log.warning(
                "a UNet call of %d rows (%d samples) ran out of GPU memory (%s): "
                "retrying with %d rows per call (the draws are unchanged)",
                b - a, 2 * (b - a), said, rows,
            )  # fmt: skip
        stats["oom_retries"] += 1
        if device.type == "cuda":
            torch.cuda.empty_cache()
    stats["rows_per_call_final"] = rows
    _sync(device)
    t1 = time.perf_counter()
    values, vectors = top_eigenpairs(D, int(cfg.top_k), eigen, stats)
    _sync(device)
    stats.update(unet_seconds=t1 - t0, eigen_seconds=time.perf_counter() - t1)
    return EstimatorOutput(eigenvalues=values, eigenvectors=vectors)


def fisher_fast(
    image: torch.Tensor,
    encoder: torch.nn.Module,
    sigma: float,
    top_k: int = 50,
    device: torch.device | None = None,
):
    """
    The top-k eigenpairs of J(x) = sigma^-2 J_fᵀ J_f, as upstream's
    `fisher_eigendecomposition` computes them (through the encoder's
    ``_to_backbone_input``, ``backbone`` and ``readout`` when it has them, else its
    forward), with the N rows of J_f from N vector-Jacobian products batched into one
    backward pass (`torch.autograd.grad` with ``is_grads_batched``, which vmaps the
    backward; one backward pass per neuron when an operation has no batching rule).

    Returns
    -------
    multigeom.geometry.fisher.FisherOutput
        `eigenvalues` of shape (k,) and `eigenvectors` of shape (k, P), on the CPU.
    """
    from multigeom.geometry.fisher import FisherOutput

    encoder.eval()
    if device is None:
        device = next(encoder.parameters()).device
    if image.dim() != 4 or image.shape[0] != 1:
        raise ValueError(
            f"Expected single-image batch [1, C, H, W], got {tuple(image.shape)}"
        )
    x = image.detach().to(device)
    if all(hasattr(encoder, a) for a in ("_to_backbone_input", "backbone", "readout")):

        def f(v):
            return encoder.readout(encoder.backbone(encoder._to_backbone_input(v)))
    else:
        f = encoder

    x = x.clone().requires_grad_(True)
    with torch.enable_grad():
        # The forward pass is plain autograd (a functorch transform around it would
        # capture modules that assign to a parameter's .data in forward, as
        # plenoptic's do); only the backward passes are batched.
        responses = f(x)
        n = responses.shape[1]
        eye = torch.eye(n, device=device, dtype=responses.dtype).unsqueeze(1)
        try:
            (J_f,) = torch.autograd.grad(
                responses, x, eye, retain_graph=True, is_grads_batched=True
            )
        except RuntimeError:  # an operation without a batching rule
            J_f = torch.stack(
                [
                    torch.autograd.grad(responses, x, e, retain_graph=True)[0]
                    for e in eye
                ]
            )
    J_f = J_f.reshape(n, -1).detach()
    _, S, Vh = torch.linalg.svd(J_f, full_matrices=False)
    k = min(int(top_k), n)
    return FisherOutput(
        eigenvalues=((S**2) / (sigma**2))[:k].cpu().clone(),
        eigenvectors=Vh[:k].cpu().clone(),
    )


def estimate_image_fast(
    x: torch.Tensor,
    encoder: torch.nn.Module,
    unet: torch.nn.Module,
    alphas_cumprod: torch.Tensor,
    cfg,
    *,
    seed: int,
    device: torch.device,
    precision: str = "fp32",
    max_rows: int | None = None,
    eigen: str = "auto",
    stats: dict | None = None,
):
    """
    G(x) and J(x) of one image, as upstream's `multigeom.pipeline.per_image.
    estimate_image` returns them (G output, J output or None when
    ``cfg.fisher_baseline.enabled`` is off), by `conditional_pair_fast` with a generator
    on `device` seeded `seed` and `fisher_fast`, both in the arithmetic of `precision`.
    `stats` receives those of `conditional_pair_fast` and ``fisher_seconds``.
    """
    from multigeom.utils import make_generator

    device = torch.device(device)
    stats = {} if stats is None else stats
    x = x.to(device)
    g_out = conditional_pair_fast(
        x,
        encoder,
        unet,
        alphas_cumprod,
        cfg,
        device,
        make_generator(int(seed), device),
        precision=precision,
        max_rows=max_rows,
        eigen=eigen,
        stats=stats,
    )
    j_out = None
    if cfg.fisher_baseline.enabled:
        t0 = time.perf_counter()
        # J(x) in the arithmetic asked for, without autocast: a Jacobian in bfloat16
        # is no baseline.
        with precision_context("fp32" if precision == "bf16" else precision, device):
            j_out = fisher_fast(
                x,
                encoder,
                float(cfg.monte_carlo.observation_noise_sigma),
                int(cfg.fisher_baseline.top_k),
                device,
            )
        _sync(device)
        stats["fisher_seconds"] = time.perf_counter() - t0
    return g_out, j_out


def timed(fn, *args, **kwargs):
    """(fn's result, seconds), CUDA work included (synchronised)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0
