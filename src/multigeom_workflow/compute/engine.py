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
through the UNet together (up to `rows_per_call` rows; the two conditional passes fused
into one call of twice as many rows), D stays on the device, its top-k eigenpairs come
(on a GPU) from the eigendecomposition of the smaller Gram matrix (DDᵀ or DᵀD)
accumulated in float64 instead of a float32 SVD of D on the CPU, and the Jacobian J_f
is computed by batched vector-Jacobian products (one vmapped backward pass) instead of
one backward pass per neuron.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026), "A multi-scale information geometry
reveals the structure of mutual information in neural populations", arXiv 2605.06304,
Algorithm 1 and Appendix C.2.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

__all__ = [
    "CONFIG_PRECISIONS",
    "EIGEN_METHODS",
    "ENGINES",
    "PRECISIONS",
    "check_precision",
    "conditional_pair_fast",
    "cpu_threads",
    "draw_noise",
    "estimate_image_fast",
    "fisher_fast",
    "precision_context",
    "rows_per_call",
    "top_eigenpairs",
]

#: The per-image engines: upstream's estimator verbatim, or this module's.
ENGINES = ("upstream", "fast")
#: Precisions of the fast engine's UNet passes. fp32: torch's defaults (those upstream
#: runs with; on Ampere and newer GPUs cuDNN's convolutions already use TF32). tf32:
#: matrix products in TF32 too (GPU only). bf16: autocast to bfloat16.
PRECISIONS = ("fp32", "tf32", "bf16")
#: The precisions a run may ask for (config key ``precision``): bf16 fails the agreement
#: checks (on the CPU, demo settings: G's eigenvalues off by a factor of 2 to 3, since
#: D is a difference of two close UNet outputs), so it is kept for benchmarks only.
CONFIG_PRECISIONS = ("fp32", "tf32")
#: Environment variable capping the rows of D per UNet call of the fast engine.
ROWS_ENV = "MULTIGEOM_FAST_ROWS"


def check_precision(
    precision: str, device: str | torch.device, allowed: tuple = CONFIG_PRECISIONS
) -> None:
    """
    Raise ValueError (one line naming the key, the value and what is allowed) if
    `precision` is not `allowed` or cannot run on `device` (tf32 needs a CUDA device).
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


@contextlib.contextmanager
def precision_context(precision: str, device: str | torch.device):
    """
    The numerics of the fast engine's UNet passes (see `PRECISIONS`): TF32 switches for
    the duration of the block (restored after), or a bfloat16 autocast.
    """
    device = torch.device(device)
    check_precision(precision, device, PRECISIONS)
    if precision == "fp32":
        yield
    elif precision == "tf32":
        saved = (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
        )
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            (
                torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32,
            ) = saved
    else:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield


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
    share = max(1, cores // max(1, torch.cuda.device_count()))
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


def rows_per_call(
    unet: torch.nn.Module,
    n_neurons: int,
    total_rows: int,
    device: torch.device,
    batch_size: int,
    image_shape: tuple[int, int] = (64, 64),
    probe_rows: int = 8,
    memory_fraction: float = 0.5,
) -> int:
    """
    Rows of D computed per UNet call: on a GPU, what `memory_fraction` of its free
    memory holds (the peak memory of a probe call of the fused conditional pass,
    2 x `probe_rows` samples, scaled); on the CPU the estimator's `batch_size` (larger
    batches were slower there: their activations leave the caches). The environment
    variable ``MULTIGEOM_FAST_ROWS`` caps it; never more than `total_rows`.

    Raises
    ------
    ValueError
        If ``MULTIGEOM_FAST_ROWS`` is not a positive integer.
    """
    cap = os.environ.get(ROWS_ENV)
    if cap is not None:
        if not cap.isdigit() or int(cap) < 1:
            raise ValueError(
                f"environment variable {ROWS_ENV} = {cap!r}: allowed: a positive "
                "integer"
            )
    if device.type == "cuda":
        H, W = image_shape
        torch.cuda.synchronize(device)
        free, _ = torch.cuda.mem_get_info(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with torch.no_grad():
            n = 2 * probe_rows
            unet(
                torch.zeros(n, 1, H, W, device=device),
                torch.full((n,), 1, dtype=torch.long, device=device),
                torch.zeros(n, n_neurons, device=device),
            )
        per_row = (torch.cuda.max_memory_allocated(device) - base) / probe_rows
        rows = int(memory_fraction * free / max(per_row, 1.0))
    else:
        rows = batch_size
    if cap is not None:
        rows = min(rows, int(cap))
    return max(1, min(rows, total_rows))


#: How the fast engine takes the top-k eigenpairs of DᵀD: ``gram`` (the float64 Gram
#: matrix's eigendecomposition), ``svd`` (upstream's float32 thin SVD of D) or ``auto``
#: (gram on a GPU; svd on the CPU, where the Gram route was not faster: docs/gpus.md).
EIGEN_METHODS = ("auto", "gram", "svd")


def top_eigenpairs(
    D: torch.Tensor, k: int, method: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    The k largest eigenpairs of DᵀD, on D's device.

    ``gram``: the eigendecomposition (`torch.linalg.eigh`) of the smaller Gram matrix,
    accumulated in float64: DᵀD (P x P) when D has at least as many rows as columns,
    else DDᵀ (R x R), whose eigenvectors u give those of DᵀD as Dᵀu (normalised).
    ``svd``: upstream's thin SVD of D (eigenvalues S², rows of Vᵀ). ``auto``: gram on a
    CUDA device, svd elsewhere. Both give upstream's result up to signs and rounding.

    Parameters
    ----------
    D : torch.Tensor
        Of shape (R, P).
    k : int
        Eigenpairs wanted; min(k, R, P) are returned, as upstream's SVD does.
    method : str
        One of `EIGEN_METHODS`.

    Returns
    -------
    eigenvalues : torch.Tensor
        Of shape (k,), float32, descending, >= 0.
    eigenvectors : torch.Tensor
        Of shape (k, P), float32, unit rows.

    Raises
    ------
    ValueError
        If `method` is unknown.
    """
    if method not in EIGEN_METHODS:
        raise ValueError(
            f"eigen method {method!r}: allowed: {', '.join(EIGEN_METHODS)}"
        )
    if method == "auto":
        method = "gram" if D.device.type == "cuda" else "svd"
    R, P = D.shape
    k = min(int(k), R, P)
    if method == "svd":
        _, S, Vh = torch.linalg.svd(D, full_matrices=False)
        return (S**2)[:k].clone(), Vh[:k].clone()
    D64 = D.double()
    if R >= P:
        values, vectors = torch.linalg.eigh(D64.T @ D64)
        values = values.flip(0)[:k]
        vectors = vectors.flip(1)[:, :k].T
    else:
        values, U = torch.linalg.eigh(D64 @ D64.T)
        values = values.flip(0)[:k]
        V = D64.T @ U.flip(1)[:, :k]  # (P, k), column i has norm sqrt(values[i])
        vectors = (V / V.norm(dim=0).clamp_min(torch.finfo(V.dtype).tiny)).T
    return values.clamp_min(0).float(), vectors.float().contiguous()


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
):
    """
    The top-k eigenpairs of G(x) by Algorithm 1, as upstream's
    `conditional_pair_estimate` computes them (same arguments, same draws), in large
    batches.

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
        One of `PRECISIONS`.
    max_rows : int, optional
        Rows of D per UNet call; default `rows_per_call`.
    eigen : str
        How the eigenpairs are taken (`top_eigenpairs`).

    Returns
    -------
    multigeom.geometry.estimator.EstimatorOutput
        `eigenvalues` of shape (k,) and `eigenvectors` of shape (k, H * W), on `device`.

    Raises
    ------
    ValueError
        If the image is not one image, N_MC is not a multiple of the batch size, or the
        precision is not allowed on `device`.
    """
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
    device = torch.device(device)
    check_precision(precision, device, PRECISIONS)
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

    z, xi1, xi2 = draw_noise(generator, len(grid_t), N_MC, B, (H, W), n_neurons, device)
    # Per-row constants, float32 like upstream's (python floats of float32 values).
    t_rows = torch.tensor(grid_t, device=device).repeat_interleave(N_MC)
    a_bar = alphas_cumprod[t_rows]
    sqrt_ab = a_bar.sqrt().view(R, 1, 1, 1)
    sqrt_1m = (1.0 - a_bar).sqrt().view(R, 1, 1, 1)
    scale = (w / (2.0 * N_MC)).sqrt().float().repeat_interleave(N_MC).view(R, 1)

    rows = max_rows or rows_per_call(unet, n_neurons, R, device, B, (H, W))
    D = torch.empty(R, P, dtype=torch.float32, device=device)
    for a in range(0, R, rows):
        b = min(a + rows, R)
        m = b - a
        t = t_rows[a:b]
        x_t = sqrt_ab[a:b] * image + sqrt_1m[a:b] * z[a:b]
        with precision_context(precision, device):
            eps_u = unet(x_t, t, torch.zeros(m, n_neurons, device=device)).float()
        x_hat = ((x_t - sqrt_1m[a:b] * eps_u) / sqrt_ab[a:b]).clamp(-1.0, 1.0)
        mu = encoder(x_hat)
        r = torch.cat([mu + sigma * xi1[a:b], mu + sigma * xi2[a:b]])
        with precision_context(precision, device):
            eps = unet(torch.cat([x_t, x_t]), torch.cat([t, t]), r).float()
        D[a:b] = scale[a:b] * (eps[:m] - eps[m:]).reshape(m, P)

    values, vectors = top_eigenpairs(D, int(cfg.top_k), eigen)
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
):
    """
    G(x) and J(x) of one image, as upstream's `multigeom.pipeline.per_image.
    estimate_image` returns them (G output, J output or None when
    ``cfg.fisher_baseline.enabled`` is off), by `conditional_pair_fast` with a generator
    on `device` seeded `seed` and `fisher_fast`.
    """
    from multigeom.utils import make_generator

    device = torch.device(device)
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
    )
    j_out = None
    if cfg.fisher_baseline.enabled:
        j_out = fisher_fast(
            x,
            encoder,
            float(cfg.monte_carlo.observation_noise_sigma),
            int(cfg.fisher_baseline.top_k),
            device,
        )
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
