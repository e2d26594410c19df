"""
The parts of the per-image engines that only a GPU reaches, forced on the CPU: the
arithmetic switches of ``precision`` (torch 2.8's names and torch >= 2.9's), emulated
TF32 and its bias, rows per UNet call independent of the memory free, the
out-of-memory retry, UNet calls across timesteps, the eigen-step's routes and its
fall-back. Models: upstream's UNet of the tests' diffusion settings and a small-CNN
encoder, random weights (seeded), so that no workflow run is needed.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO
from PIL import Image

from multigeom_workflow.compute import arithmetic, engine
from multigeom_workflow.compute.arithmetic import (
    TF32_ROUNDING_STEP,
    arithmetic_flags,
    emulated_tf32,
    precision_context,
    round_to_tf32,
)
from multigeom_workflow.compute.engine import (
    MAX_CALL_ELEMENTS,
    MEMORY_FRACTION,
    activation_elements,
    eigen_method,
    estimate_image_fast,
    rows_per_call,
    top_eigenpairs,
)
from multigeom_workflow.compute.estimate import Models, estimate_to_file
from multigeom_workflow.settings.files import to_namespace

DIFFUSION = yaml.safe_load((REPO / "tests/data/diffusion_tiny.yaml").read_text())
#: 2 timesteps x 8 samples in batches of 4: 16 rows of D.
ESTIMATOR = yaml.safe_load((REPO / "tests/data/estimator_tiny.yaml").read_text())
ESTIMATOR["monte_carlo"].update(n_samples=8, batch_size=4)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def models():
    from multigeom.diffusion.model import build_diffusion_model, build_scheduler
    from multigeom.encoders.backbones import SmallCNNBackbone
    from multigeom.encoders.neural import NeuralEncoder

    torch.manual_seed(0)
    cfg = to_namespace(DIFFUSION)
    unet = build_diffusion_model(cfg).eval()
    encoder = NeuralEncoder(SmallCNNBackbone(), n_neurons=50).eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    return Models(encoder, unet, build_scheduler(cfg).alphas_cumprod, None, CPU)


@pytest.fixture(scope="module")
def image():
    g = torch.Generator().manual_seed(1)
    return torch.rand(1, 1, 64, 64, generator=g) * 2 - 1


def run_fast(models, image, **kwargs):
    stats = kwargs.pop("stats", {})
    g, j = estimate_image_fast(
        image, models.encoder, models.unet, models.alphas_cumprod,
        to_namespace(ESTIMATOR), seed=43, device=CPU, stats=stats, **kwargs,
    )  # fmt: skip
    return g, j, stats


def run_upstream(models, image):
    from multigeom.pipeline.per_image import estimate_image

    args = (image, models.encoder, models.unet, models.alphas_cumprod)
    return estimate_image(*args, to_namespace(ESTIMATOR), seed=43, device=CPU)


def agreement(a, b) -> tuple[float, float]:
    """(max relative eigenvalue difference, min over k of A_k) of two outputs."""
    va, vb = a.eigenvalues.double(), b.eigenvalues.double()
    M = (a.eigenvectors.double() @ b.eigenvectors.double().T).pow(2)
    a_k = min(float(M[:k, :k].sum() / k) for k in range(1, len(va) + 1))
    return float(((va - vb).abs() / vb).max()), a_k


@pytest.fixture(scope="module")
def upstream_g(models, image):
    return run_upstream(models, image)[0]


# --- precision: the switches -------------------------------------------------------


@pytest.fixture
def odd_switches():
    """Switches as no default has them, restored after the test."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize(
    "precision, conv, matmul", [("fp32", False, False), ("tf32", True, False)]
)
def test_precision_sets_the_switches_and_restores_them(
    odd_switches, precision, conv, matmul
):
    # "cuda" passes the device check; nothing runs on it.
    with precision_context(precision, "cuda"):
        flags = arithmetic_flags()
        assert (flags["conv_tf32"], flags["matmul_tf32"]) == (conv, matmul)
        assert torch.backends.cudnn.allow_tf32 is conv
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (
        False,
        True,
    )
    with pytest.raises(KeyError), precision_context(precision, "cuda"):
        raise KeyError("the estimator failed")
    assert torch.backends.cuda.matmul.allow_tf32 is True


def test_precision_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="'precision' = 'tf32' needs a CUDA device"):
        with precision_context("tf32", "cpu"):
            pass
    with pytest.raises(ValueError, match="'precision' = 'fp16': allowed: fp32, tf32"):
        with precision_context("fp16", "cpu"):
            pass


def test_precision_turns_off_an_autocast_of_the_caller():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        with precision_context("fp32", "cpu"):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


class Fp32Precision:
    """
    Torch >= 2.9's switch objects (torch/backends/__init__.py, `_FP32Precision`;
    torch/backends/cuda/__init__.py, `cuBLASModule`): ``fp32_precision`` takes "ieee",
    "tf32" or "none"; reading the legacy ``allow_tf32`` once the new names are in use
    is refused (aten/src/ATen/Context.cpp: "a mix of the legacy and new APIs").
    """

    def __init__(self, value):
        self._value = value

    @property
    def fp32_precision(self):
        return self._value

    @fp32_precision.setter
    def fp32_precision(self, value):
        if value not in ("ieee", "tf32", "none"):
            raise RuntimeError(f"Invalid precision {value!r}")
        self._value = value

    @property
    def allow_tf32(self):
        raise RuntimeError("you have used a mix of the legacy and new APIs")


def test_torch_29_switches_are_used_where_present(monkeypatch):
    matmul, conv = Fp32Precision("none"), Fp32Precision("tf32")
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends.cudnn, "conv", conv, raising=False)
    seen = {}
    for precision in ("fp32", "tf32"):
        with precision_context(precision, "cuda"):
            seen[precision] = (conv.fp32_precision, matmul.fp32_precision)
            assert arithmetic_flags()["api"] == "fp32_precision"
    assert seen == {"fp32": ("ieee", "ieee"), "tf32": ("tf32", "ieee")}
    assert (conv.fp32_precision, matmul.fp32_precision) == ("tf32", "none")


class SwitchesSeen(torch.nn.Module):
    """A UNet that records the TF32 switches of every call."""

    def __init__(self, unet):
        super().__init__()
        self.unet, self.seen = unet, set()

    def forward(self, *args):
        self.seen.add(
            (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        )
        return self.unet(*args)


@pytest.mark.parametrize("engine_name", ["upstream", "fast"])
def test_both_engines_run_in_ieee_fp32_and_record_it(
    models, image, tmp_path, odd_switches, engine_name
):
    png = tmp_path / "img.png"
    pixels = ((image[0, 0].numpy() + 1) * 127.5).round().astype(np.uint8)
    Image.fromarray(pixels).save(png)
    seen = SwitchesSeen(models.unet)
    m = Models(models.encoder, seen, models.alphas_cumprod, None, CPU)
    out = estimate_to_file(
        m, png, 0, tmp_path / "img0000.pt", ESTIMATOR, encoder_name="smallcnn",
        area="V1", engine=engine_name, precision="fp32",
    )  # fmt: skip
    assert seen.seen == {(False, False)}
    prov = torch.load(out, weights_only=False)["provenance"]
    assert prov["precision"] == "fp32"
    assert (prov["arithmetic"]["conv_tf32"], prov["arithmetic"]["matmul_tf32"]) == (
        False,
        False,
    )
    assert prov["arithmetic"]["torch"] == torch.__version__
    if engine_name == "fast":
        assert prov["fast_engine"]["rows_per_call"] == 4  # the batch size, on the CPU
        assert prov["fast_engine"]["eigen_method"] == "svd"
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (
        False,
        True,
    )


# --- emulated TF32 -----------------------------------------------------------------


def test_tf32_rounding_is_to_nearest_with_10_mantissa_bits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, generator=g) * torch.logspace(-30, 30, 10_000)
    x = torch.cat([x, torch.tensor([1 + 2**-11, 1 + 2**-12, -(1 + 3 * 2**-12), 0.0])])
    expected = []
    for v in x.tolist():  # independently: frexp in float64, ties away from zero
        m, e = math.frexp(v)
        scaled = abs(m) * 2**11
        q = math.floor(scaled + 0.5)
        expected.append(math.copysign(math.ldexp(q / 2**11, e), v))
    rounded = round_to_tf32(x)
    assert torch.equal(rounded, torch.tensor(expected, dtype=torch.float32))
    assert float(((rounded - x).abs() / x.abs().clamp_min(1e-38)).max()) <= (
        TF32_ROUNDING_STEP
    )
    assert rounded[-4:].tolist() == [1 + 2**-10, 1.0, -(1 + 2**-10), 0.0]


def test_emulated_tf32_rounds_the_operands_of_convolutions_only():
    conv, lin = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(8, 2)
    x = torch.randn(2, 3, 8, 8)
    with emulated_tf32():
        y, z = conv(x), lin(x[:, 0, 0])
    by_hand = torch.nn.functional.conv2d(
        round_to_tf32(x), round_to_tf32(conv.weight), conv.bias
    )
    assert torch.equal(y, by_hand) and not torch.equal(y, conv(x))
    assert torch.equal(z, lin(x[:, 0, 0]))  # matmuls: IEEE, as precision tf32
    with emulated_tf32(matmul=True):
        z = lin(x[:, 0, 0])
    assert torch.equal(
        z, round_to_tf32(x[:, 0, 0]) @ round_to_tf32(lin.weight).T + lin.bias
    )


def test_emulated_tf32_bias_is_above_the_engines_ieee_agreement(models, image):
    g_up, j_up = run_upstream(models, image)
    g_fast, _, _ = run_fast(models, image)
    with emulated_tf32():
        g_tf32, _, _ = run_fast(models, image)
    ieee_rel, ieee_a = agreement(g_fast, g_up)
    tf32_rel, tf32_a = agreement(g_tf32, g_up)
    assert ieee_rel <= 1e-4 and ieee_a >= 0.999  # the engines' agreement in IEEE
    # Measured 2026-12-01: 1.8e-5 / 0.99999997 in IEEE, 1.8e-2 / 0.981 in TF32.
    assert tf32_rel >= 100 * ieee_rel and tf32_rel > 1e-3
    assert 1 - tf32_a >= 100 * (1 - ieee_a)
    # Pushed up like a noise floor: the smallest eigenvalue kept grows.
    assert g_tf32.eigenvalues[-1] > g_up.eigenvalues[-1]


# --- rows per UNet call ------------------------------------------------------------


class OneConv(torch.nn.Module):
    """A UNet of one convolution (8 channels): outputs 8 + 1 channels per sample."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)

    def forward(self, x, t, r):
        return self.conv(x).mean(dim=1, keepdim=True)


def test_rows_per_call_follow_the_total_memory_and_the_element_cap(monkeypatch):
    unet, hw = OneConv(), 64 * 64
    assert activation_elements(unet, 50, CPU) == (8 * hw, 9 * hw)
    gib = 2**30
    # Activations of a row: 2 samples x 9 x 4096 float32 values.
    expected = int(MEMORY_FRACTION * gib) // (2 * 9 * hw * 4)
    assert rows_per_call(unet, 50, 10**6, CPU, 25, memory=gib) == expected == 1820
    # Much memory: the largest output of a call stays within MAX_CALL_ELEMENTS.
    rows = rows_per_call(unet, 50, 10**6, CPU, 25, memory=2**50)
    assert rows == MAX_CALL_ELEMENTS // (2 * 8 * hw) == 8192
    assert 2 * rows * 8 * hw < 2**31
    assert rows_per_call(unet, 50, 100, CPU, 25, memory=2**50) == 100
    monkeypatch.setenv("MULTIGEOM_FAST_ROWS", "7")
    assert rows_per_call(unet, 50, 10**6, CPU, 25, memory=gib) == 7


def test_the_schema_allows_the_engines_and_precisions_of_their_one_home():
    from multigeom_workflow.settings.names import ENGINES, PRECISIONS

    schema = yaml.safe_load((REPO / "config/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["engine"]["enum"] == list(ENGINES)
    assert schema["properties"]["precision"]["enum"] == list(PRECISIONS)
    assert arithmetic.PRECISIONS == (*PRECISIONS, "bf16")


def test_rows_per_call_on_a_gpu_are_those_of_its_total_memory(monkeypatch):
    class Properties:
        total_memory = 2**30

    def no_free_memory_asked(*args):
        raise AssertionError("the memory free now must not choose the rows")

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Properties)
    monkeypatch.setattr(torch.cuda, "mem_get_info", no_free_memory_asked)
    assert engine.device_memory(torch.device("cuda:0")) == 2**30
    assert engine.device_memory(CPU) is None


@pytest.fixture
def gpu_memory(monkeypatch):
    """The CPU taken for a GPU of 8 GiB by the rows rule."""
    monkeypatch.setattr(engine, "device_memory", lambda device: 8 * 2**30)


def test_the_same_image_gives_the_same_tensors_whatever_the_free_memory(
    models, image, gpu_memory, monkeypatch, upstream_g
):
    results = []
    for free in (2**28, 7 * 2**30):  # a warm worker's second image, a fresh container
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a, f=free: (f, 2**33))
        results.append(run_fast(models, image, eigen="gram"))
    (g_a, j_a, stats_a), (g_b, j_b, stats_b) = results
    assert stats_a["rows_per_call"] == stats_b["rows_per_call"] == 16  # all rows
    assert torch.equal(g_a.eigenvalues, g_b.eigenvalues)
    assert torch.equal(g_a.eigenvectors, g_b.eigenvectors)
    # Both timesteps in one call (the GPU's path) agree with upstream's batches.
    rel, a_k = agreement(g_a, upstream_g)
    assert rel <= 1e-4 and a_k >= 0.999


@pytest.mark.parametrize("rows", [3, 6, 16], ids=["3", "6-across-timesteps", "all"])
def test_calls_of_any_rows_agree_with_upstream(models, image, rows, upstream_g):
    g, _, stats = run_fast(models, image, max_rows=rows, eigen="gram")
    assert stats["rows_per_call"] == rows
    rel, a_k = agreement(g, upstream_g)
    assert rel <= 1e-4 and a_k >= 0.999


class RunsOutOfMemory(torch.nn.Module):
    """
    A UNet that raises what the CUDA caching allocator raises (torch.OutOfMemoryError,
    c10/cuda/CUDACachingAllocator.cpp) for calls of more than `most` samples, or
    `error` (another library's words for it).
    """

    def __init__(self, unet, most, error=None):
        super().__init__()
        self.unet, self.most, self.calls, self.error = unet, most, [], error

    def forward(self, x, t, r):
        if len(x) > self.most and self.error is not None:
            raise self.error
        if len(x) > self.most:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                "capacity of 79.15 GiB of which 1.10 GiB is free."
            )
        self.calls.append(len(x))  # the calls made
        return self.unet(x, t, r)


def test_a_call_out_of_memory_is_made_again_with_fewer_rows(models, image, caplog):
    oom = RunsOutOfMemory(models.unet, most=5)  # 2 rows: 4 samples fit
    m = Models(models.encoder, oom, models.alphas_cumprod, None, CPU)
    with caplog.at_level(logging.WARNING, logger=engine.__name__):
        g, j, stats = run_fast(m, image, max_rows=8)
    assert (stats["rows_per_call"], stats["rows_per_call_final"]) == (8, 2)
    assert stats["oom_retries"] == 2  # 8 -> 4 -> 2 rows
    # 3 samples per row of D, and the null pass of 4 rows that preceded the failed
    # fused pass of 8 samples.
    assert max(oom.calls) == 4 and sum(oom.calls) == 3 * 16 + 4
    logged = [r for r in caplog.records if "ran out of GPU memory" in r.message]
    assert len(logged) == 1 and "8 rows (16 samples)" in logged[0].message
    # The draws are the same: the result is that of a run at 2 rows per call.
    g_2, j_2, _ = run_fast(models, image, max_rows=2)
    assert torch.equal(g.eigenvalues, g_2.eigenvalues)
    assert torch.equal(g.eigenvectors, g_2.eigenvectors)
    assert torch.equal(j.eigenvalues, j_2.eigenvalues)


def test_a_row_that_does_not_fit_raises(models, image):
    oom = RunsOutOfMemory(models.unet, most=1)
    m = Models(models.encoder, oom, models.alphas_cumprod, None, CPU)
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        run_fast(m, image, max_rows=4)


#: An allocation failure in each library's words, as PyTorch 2.8 raises it: a plain
#: RuntimeError from TORCH_CUDABLAS_CHECK and AT_CUDNN_CHECK
#: (aten/src/ATen/cuda/Exceptions.h; cuDNN's names from cudnnGetErrorString, cuDNN 8
#: and 9), torch.AcceleratorError from C10_CUDA_CHECK (c10/cuda/CUDAException.cpp).
LIBRARY_OUT_OF_MEMORY = {
    "cublas-alloc": RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
    "cublas-init": RuntimeError(
        "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"
    ),
    "cublaslt": RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle,"
        " computeDesc.descriptor(), ...)`"
    ),
    "cudnn8": RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "cudnn9": RuntimeError(
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"
    ),
    "cudnn-init": RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"),
    "cuda-runtime": torch.AcceleratorError(
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
        "reported at some other API call, so the stacktrace below might be incorrect."
    ),
}


@pytest.fixture(scope="module")
def at_two_rows(models, image):
    """The unfaulted result at 2 rows per UNet call."""
    return run_fast(models, image, max_rows=2)


@pytest.mark.parametrize(
    "error", LIBRARY_OUT_OF_MEMORY.values(), ids=LIBRARY_OUT_OF_MEMORY.keys()
)
def test_a_librarys_allocation_failure_is_made_again_with_fewer_rows(
    models, image, at_two_rows, error, caplog
):
    oom = RunsOutOfMemory(models.unet, most=5, error=error)  # 2 rows: 4 samples fit
    m = Models(models.encoder, oom, models.alphas_cumprod, None, CPU)
    with caplog.at_level(logging.WARNING, logger=engine.__name__):
        g, j, stats = run_fast(m, image, max_rows=8)
    assert (stats["rows_per_call"], stats["rows_per_call_final"]) == (8, 2)
    assert stats["oom_retries"] == 2  # 8 -> 4 -> 2 rows
    logged = [r.getMessage() for r in caplog.records]
    assert [line for line in logged if "ran out of GPU memory" in line] == [
        "a UNet call of 8 rows (16 samples) ran out of GPU memory "
        f"({str(error).splitlines()[0]}): retrying with 4 rows per call (the draws "
        "are unchanged)"
    ]
    g_2, j_2, _ = at_two_rows
    assert torch.equal(g.eigenvalues, g_2.eigenvalues)
    assert torch.equal(g.eigenvectors, g_2.eigenvectors)
    assert torch.equal(j.eigenvalues, j_2.eigenvalues)


def test_a_row_that_does_not_fit_is_said_in_one_line(models, image):
    error = LIBRARY_OUT_OF_MEMORY["cublas-alloc"]
    oom = RunsOutOfMemory(models.unet, most=1, error=error)
    m = Models(models.encoder, oom, models.alphas_cumprod, None, CPU)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        run_fast(m, image, max_rows=4)
    assert str(raised.value) == (
        "out of GPU memory on cpu even at one row of D per UNet call: CUDA error: "
        "CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    )
    assert raised.value.__cause__ is error


def test_other_errors_of_the_gpu_libraries_are_not_taken_for_out_of_memory(
    models, image
):
    from multigeom_workflow.compute.gpu_errors import is_out_of_memory
    from multigeom_workflow.compute.workers import STICKY_CUDA_ERRORS

    assert all(is_out_of_memory(e) for e in LIBRARY_OUT_OF_MEMORY.values())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried"))
    others = [RuntimeError(f"CUDA error: {m}") for m in STICKY_CUDA_ERRORS]
    others += [
        RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
        RuntimeError("CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublas"),
        ValueError("CUDA error: out of memory"),  # not what a library raises
    ]
    assert not any(is_out_of_memory(e) for e in others)
    # one is raised at once, the call not made again
    sticky = RunsOutOfMemory(models.unet, most=5, error=others[-2])
    m = Models(models.encoder, sticky, models.alphas_cumprod, None, CPU)
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_INVALID_VALUE"):
        run_fast(m, image, max_rows=8)
    assert sticky.calls == []


# --- the eigen-step ----------------------------------------------------------------


@pytest.mark.parametrize(
    "capability, method",
    [((9, 0), "gram"), ((8, 0), "gram"), ((8, 9), "gram32"), ((7, 5), "gram32"),
     ((8, 6), "gram32"), ((12, 0), "gram32")],
    ids=["H100-H200", "A100", "L4-L40S", "T4", "A10", "RTX-5090"],
)  # fmt: skip
def test_the_eigen_step_follows_the_gpus_float64_rate(monkeypatch, capability, method):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability)
    assert eigen_method("cuda:0") == method
    assert eigen_method("cpu") == "svd"


def spectrum_like_G(shape):
    """A D whose spectrum falls like G's, with close pairs among the top 50."""
    g = torch.Generator().manual_seed(0)
    scale = torch.logspace(0, -2, shape[1])
    scale[10:20:2] = scale[11:21:2] * (1 + 1e-3)
    return torch.randn(*shape, generator=g) * scale


@pytest.mark.parametrize("method", ["gram", "gram32"])
@pytest.mark.parametrize("shape", [(600, 256), (100, 256)], ids=["DtD", "DDt"])
def test_every_route_gives_the_top_eigenpairs(method, shape):
    D = spectrum_like_G(shape)
    values, vectors = top_eigenpairs(D, 50, method)
    G = D.double().T @ D.double()
    exact, exact_vectors = torch.linalg.eigh(G)  # independently, float64
    k = min(50, *shape)
    exact, exact_vectors = exact.flip(0)[:k], exact_vectors.flip(1)[:, :k].T
    assert values.shape == (k,) and vectors.shape == (k, 256)
    torch.testing.assert_close(values.double(), exact, rtol=1e-5, atol=0)
    residual = G @ vectors.double().T - vectors.double().T * values.double()
    assert float(residual.norm(dim=0).max()) <= 1e-5 * float(values[0])
    M = (vectors.double() @ exact_vectors.T).pow(2)
    assert min(float(M[:i, :i].sum() / i) for i in range(1, k + 1)) >= 0.99999


def test_a_failed_solver_falls_back_to_the_cpus_float64(monkeypatch, caplog):
    D = spectrum_like_G((600, 256))
    expected, expected_vectors = top_eigenpairs(D, 20, "svd")
    real_eigh = torch.linalg.eigh
    calls = []

    def eigh(A, *args, **kwargs):  # what cuSOLVER's failure raises (a LinAlgError)
        calls.append(A.dtype)
        if len(calls) == 1:
            raise torch.linalg.LinAlgError(
                "linalg.eigh: The algorithm failed to converge because the input "
                "matrix is ill-conditioned or has too many repeated eigenvalues"
            )
        return real_eigh(A, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "eigh", eigh)
    stats = {}
    with caplog.at_level(logging.WARNING, logger=engine.__name__):
        values, vectors = top_eigenpairs(D, 20, "gram32", stats)
    assert stats["eigen_method"] == "gram@cpu" and calls[:2] == [
        torch.float32,
        torch.float64,
    ]
    assert any("eigen-step gram32 failed" in r.message for r in caplog.records)
    torch.testing.assert_close(values, expected, rtol=1e-4, atol=0)
    M = (vectors.double() @ expected_vectors.double().T).pow(2)
    assert float(M.sum() / 20) >= 0.99999


def test_values_that_are_not_finite_fall_back_and_all_routes_failing_raise(
    monkeypatch,
):
    D = spectrum_like_G((100, 64))

    def nan_eigh(A, *args, **kwargs):
        n = A.shape[-1]
        return torch.full((n,), float("nan"), dtype=A.dtype), torch.eye(n)

    monkeypatch.setattr(torch.linalg, "eigh", nan_eigh)
    stats = {}
    values, _ = top_eigenpairs(D, 5, "gram", stats)
    assert stats["eigen_method"] == "svd@cpu" and values.isfinite().all()

    def failing_svd(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "svd", failing_svd)
    with pytest.raises(torch.linalg.LinAlgError, match="svd: The algorithm failed"):
        top_eigenpairs(D, 5, "gram")
