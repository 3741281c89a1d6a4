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
    # cudaErrorMemoryAllocation outside the caching allocator (a kernel launch, the CUDA context, a library's own
    # cudaMalloc): C10_CUDA_CHECK writes "CUDA error: " + cudaGetErrorString(err), then a newline and a hint
    # (c10/cuda/CUDAException.cpp); torch >= 2.8 raises it as torch.AcceleratorError, older as RuntimeError.
    # The full phrase, so "CUDA error: an illegal memory access was encountered" is not mistaken for it.
    "CUDA error: out of memory",
    "HIP error: out of memory",  # the same check in ROCm builds (hipErrorOutOfMemory)
    "CUDA driver error: out of memory",  # C10_CUDA_DRIVER_CHECK (cuMem* calls, expandable segments)
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS workspace allocation during a matmul
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN < 9: an allocation inside cuDNN failed
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN >= 9 splits ALLOC_FAILED into device ...
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",  # ... and host memory
    # Deliberately NOT matched, though accelerate's should_reduce_batch_size matches the first:
    # - "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
    #   PyTorch writes this one text for every bare NOT_SUPPORTED (aten/src/ATen/cudnn/Exceptions.h), so the
    #   text cannot tell memory from anything else. cuDNN never allocates a convolution's workspace: PyTorch
    #   does, through the caching allocator, and on OutOfMemoryError (or a CuDNNError) it tries the next
    #   algorithm (Conv_v7.cpp try_all, Conv_v8.cpp try_plans). So a NOT_SUPPORTED that reaches us is a shape,
    #   layout or dtype cuDNN does not implement; the large-batch case accelerate inherited from toma
    #   (pytorch#4107, #2917: batchnorm/conv past cuDNN's size limits) is a size limit, not memory. accelerate
    #   asks "would a smaller batch help?", where a wrong yes costs one retry; here a wrong yes records a real
    #   incompatibility (say channels_last with a dtype this cuDNN lacks) as "out of memory" and silently takes
    #   it out of the search. It stays an error, with its text.
    # - "Unable to find a valid cuDNN algorithm to run convolution" / "FIND|GET was unable to find an engine to
    #   execute this computation": every algorithm failed, each for lack of workspace OR as unsupported (a T4
    #   asked for bf16 says it too). Ambiguous, so an error.
    "DefaultCPUAllocator: can't allocate memory",  # the CPU allocator (c10/core/impl/alloc_cpu.cpp)
    "DefaultCPUAllocator: not enough memory",  # the CPU allocator on Windows
)


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` means the device or host ran out of memory.

    >>> is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    True
    >>> is_oom(RuntimeError("CUDA error: out of memory\\nCUDA kernel errors might be asynchronously reported"))
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
    # torch.AcceleratorError (a driver-level CUDA error) and cuDNN/cuBLAS errors are RuntimeErrors: the text decides
    if isinstance(exc, RuntimeError) and exc.args:
        text = str(exc.args[0])
        return any(m in text for m in _OOM_MESSAGES)
    return False
