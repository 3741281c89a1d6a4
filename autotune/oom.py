"""The one place that decides "this was out of memory".

Each backend says it differently; every message matched is listed with where it comes from. Anything that is
not an out-of-memory error is not one: callers re-raise it or report it as an error, never as OOM.
"""

from __future__ import annotations

__all__ = ["is_oom"]

_OOM_MESSAGES = (
    "CUDA out of memory.",  # CUDA caching allocator (older torch raised RuntimeError with this text)
    "HIP out of memory.",  # ROCm's caching allocator
    "XPU out of memory.",  # Intel GPUs
    "MPS backend out of memory",  # Apple silicon
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS workspace allocation during a matmul
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN workspace allocation
    # cuDNN reports an allocation failure inside a conv as NOT_SUPPORTED; its message names the cause.
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
    "DefaultCPUAllocator: can't allocate memory",  # the CPU allocator (c10/core/impl/alloc_cpu.cpp)
    "DefaultCPUAllocator: not enough memory",  # the CPU allocator on Windows
)


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` means the device or host ran out of memory.

    >>> is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    True
    >>> is_oom(RuntimeError("shape mismatch"))
    False
    """
    if isinstance(exc, MemoryError):  # Python's own allocator (numpy, PIL, lists)
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):  # CUDA/XPU/MPS since torch 2.5: a RuntimeError subclass
            return True
    except (ImportError, AttributeError):
        pass
    if isinstance(exc, RuntimeError) and exc.args:
        text = str(exc.args[0])
        return any(m in text for m in _OOM_MESSAGES)
    return False
