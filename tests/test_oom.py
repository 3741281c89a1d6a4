"""is_oom(): out-of-memory and nothing else."""

from __future__ import annotations

import pytest
import torch

from autotune import oom
from autotune.oom import is_oom


@pytest.mark.parametrize("message", oom._OOM_MESSAGES)
def test_each_known_message_is_oom(message):
    assert is_oom(RuntimeError(message))
    assert is_oom(RuntimeError(f"[enforce fail at somewhere.cpp:12] {message} Tried to allocate 2.00 GiB"))


@pytest.mark.parametrize("message", oom._OOM_MESSAGES)
def test_known_message_in_a_non_runtime_error_is_not_oom(message):
    assert not is_oom(ValueError(message))


def test_memory_error_is_oom():
    assert is_oom(MemoryError())
    assert is_oom(MemoryError("numpy could not allocate"))


def test_torch_out_of_memory_error_is_oom():
    assert issubclass(torch.OutOfMemoryError, RuntimeError)
    assert is_oom(torch.OutOfMemoryError("any text at all"))


# What torch >= 2.8 raises when a cudaMalloc or kernel launch outside the caching allocator gets
# cudaErrorMemoryAllocation (c10/cuda/CUDAException.cpp: "CUDA error: " + cudaGetErrorString + help + suffix)
_CUDA_HINT = ("\nSearch for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
              "group__CUDART__TYPES.html for more information.\nCUDA kernel errors might be asynchronously reported "
              "at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
              "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
_NOT_SUPPORTED = ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                  "non-contiguous input.")


@pytest.mark.parametrize("exc", [
    torch.AcceleratorError("CUDA error: out of memory" + _CUDA_HINT),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other "
                 "API call,so the stacktrace below might be incorrect.\nFor debugging consider passing "
                 "CUDA_LAUNCH_BLOCKING=1."),  # torch < 2.8: a plain RuntimeError, no "Search for" line
    RuntimeError("CUDA error: out of memory"),  # the bare text, as a CUDA extension may raise it
    RuntimeError("HIP error: out of memory\nHIP kernel errors might be asynchronously reported at some other API "
                 "call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
                 "AMD_SERIALIZE_KERNEL=3"),
    RuntimeError("CUDA driver error: out of memory"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB "
                           "of which 1.06 GiB is free."),
], ids=lambda e: f"{type(e).__name__}:{str(e)[:40]}")
def test_device_out_of_memory_texts_are_oom(exc):
    assert is_oom(exc)


def test_accelerator_error_is_a_runtime_error():
    # the driver-level OOM is matched by its text because torch raises it as this RuntimeError subclass
    assert issubclass(torch.AcceleratorError, RuntimeError)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x10)"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    torch.AcceleratorError("CUDA error: an illegal memory access was encountered" + _CUDA_HINT),
    torch.AcceleratorError("CUDA error: device-side assert triggered" + _CUDA_HINT),
    RuntimeError("CUDA error: invalid argument"),
    RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, opb, m, n, k)`"),
    # cuDNN's NOT_SUPPORTED: a shape/layout/dtype cuDNN lacks (see the comment in oom.py), not memory
    RuntimeError(_NOT_SUPPORTED),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT"),  # on-chip, per kernel
    RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    # every cuDNN algorithm failed: for lack of workspace or as unsupported; the text cannot tell which
    RuntimeError("Unable to find a valid cuDNN algorithm to run convolution"),
    RuntimeError("GET was unable to find an engine to execute this computation"),
    RuntimeError("FIND was unable to find an engine to execute this computation"),
    RuntimeError(),
    ValueError("boom"),
    ValueError("CUDA error: out of memory"),  # only a RuntimeError from torch carries it
    FloatingPointError("loss became nan"),
    KeyboardInterrupt(),
], ids=lambda e: f"{type(e).__name__}:{str(e)[:40]}")
def test_other_errors_are_not_oom(exc):
    assert not is_oom(exc)


def test_real_cpu_allocator_failure_is_oom():
    with pytest.raises(Exception) as info:
        torch.empty(2**50, dtype=torch.uint8)  # 1 PiB
    assert is_oom(info.value), str(info.value)
