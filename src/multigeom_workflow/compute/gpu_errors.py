"""
Which errors of the GPU libraries are an out-of-memory, whatever they are called: the
one place that says so (`is_out_of_memory`), for every caller that handles an
out-of-memory error (the fast engine's UNet calls: half the rows, again).

PyTorch raises `torch.OutOfMemoryError` only where its own caching allocator fails. A
library that allocates device memory itself reports the same shortage in its own
words, as a plain `RuntimeError`: cuBLAS when it creates its handle on a full GPU
("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
cuDNN when it creates its handle or its workspace ("cuDNN error:
CUDNN_STATUS_NOT_INITIALIZED", "..._ALLOC_FAILED"), the CUDA runtime outside the
allocator ("CUDA error: out of memory"). Such an error leaves the CUDA context
usable (unlike those of `multigeom_workflow.compute.workers.STICKY_CUDA_ERRORS`): the
same work in smaller pieces, or after other processes freed memory, succeeds.
"""

from __future__ import annotations

import sys

__all__ = ["OUT_OF_MEMORY_MESSAGES", "is_out_of_memory"]

#: What the GPU libraries say when they could not allocate memory, as PyTorch 2.8
#: raises it (a RuntimeError, `torch.AcceleratorError` or `torch.OutOfMemoryError`);
#: each with where the text comes from.
OUT_OF_MEMORY_MESSAGES = (
    # c10/cuda/CUDACachingAllocator.cpp: torch.OutOfMemoryError's own text, also when
    # only its text survives (a RuntimeError raised from it, a worker's reply)
    "CUDA out of memory",
    # c10/cuda/CUDAException.cpp (C10_CUDA_CHECK): cudaErrorMemoryAllocation (2),
    # "out of memory", from an allocation outside the caching allocator (a context,
    # a library's own cudaMalloc)
    "CUDA error: out of memory",
    # aten/src/ATen/cuda/Exceptions.h (TORCH_CUDABLAS_CHECK): "CUDA error:
    # CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" (cuBLAS 12,
    # cublasCreate: "the resources could not be allocated"), cuBLASLt the same
    "CUBLAS_STATUS_ALLOC_FAILED",
    # the same check, when cublasCreate cannot set up its handle on a GPU whose memory
    # is taken (tensorflow/tensorflow #9489, EleutherAI/lm-evaluation-harness #1689:
    # gone once memory was freed)
    "CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
    # Exceptions.h (AT_CUDNN_CHECK): "cuDNN error: " + cudnnGetErrorString; cuDNN 8's
    # name, cuDNN 9's two (cudnn_graph.h 9.10: 4003 is the old ALLOC_FAILED, 4004 the
    # device's), and cudnnCreate's status on a full GPU (haotian-liu/LLaVA #392,
    # flexflow/flexflow-train #51: its handle's memory)
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "CUDNN_STATUS_NOT_INITIALIZED",
    # Exceptions.h (TORCH_CUSOLVER_CHECK): "cusolver error:
    # CUSOLVER_STATUS_ALLOC_FAILED"
    "CUSOLVER_STATUS_ALLOC_FAILED",
)


def is_out_of_memory(err: BaseException) -> bool:
    """
    Whether `err` says that a GPU (or a GPU library) ran out of memory:
    `torch.OutOfMemoryError`, or a RuntimeError whose text holds one of
    `OUT_OF_MEMORY_MESSAGES`.

    Parameters
    ----------
    err : BaseException
        An error raised by a computation on a GPU.

    Returns
    -------
    bool
        True for an out-of-memory error (the CUDA context stays usable: the work may
        be made again in smaller pieces); False for any other error.
    """
    torch = sys.modules.get("torch")  # imported by whoever computed on a GPU
    if torch is not None and isinstance(err, torch.OutOfMemoryError):
        return True
    if not isinstance(err, RuntimeError):
        return False
    text = str(err)
    return any(message in text for message in OUT_OF_MEMORY_MESSAGES)
