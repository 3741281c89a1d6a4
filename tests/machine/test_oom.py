"""is_oom(): out-of-memory and nothing else."""

from __future__ import annotations

import pytest
import torch

from autotune.machine import oom
from autotune.machine.oom import is_oom


# Whole messages as each allocator writes them (not the classifier's own fragments, so a wrong fragment in
# oom.py cannot pass for right): the text of the exception a user's trial would raise.
REAL_OOM_MESSAGES = [
    # CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), raised as torch.OutOfMemoryError
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which 1.06 GiB is "
    "free. Including non-PyTorch memory, this process has 22.57 GiB memory in use. Of the allocated memory 21.93 GiB "
    "is allocated by PyTorch, and 172.51 MiB is reserved by PyTorch but unallocated.",
    # the same allocator under set_per_process_memory_fraction (the device memory cap)
    "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 70.12 GiB "
    "is free. Process 4242 has 9.06 GiB memory in use. Of the allocated memory 7.80 GiB is allocated by PyTorch, "
    "and 1.11 GiB is reserved by PyTorch but unallocated. 8.00 GiB allowed;",
    "HIP out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 63.98 GiB of which 0 bytes is free.",
    "XPU out of memory. Tried to allocate 4.00 GiB (GPU 0; 15.11 GiB total capacity; 12.00 GiB already allocated)",
    "MPS backend out of memory (MPS allocated: 18.13 GB, other allocations: 2.80 MB, max allowed: 18.13 GB). Tried "
    "to allocate 256.00 MB on private pool.",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
    "HIP error: out of memory\nHIP kernel errors might be asynchronously reported at some other API call",
    "CUDA driver error: out of memory",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "1125899906842624 bytes. Error code 12 (Cannot allocate memory)",
    "[enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: not enough memory: you "
    "tried to allocate 17179869184 bytes.",
]


@pytest.mark.parametrize("message", REAL_OOM_MESSAGES, ids=lambda m: m[:40])
def test_each_real_out_of_memory_message_is_oom(message):
    assert is_oom(RuntimeError(message))
    assert not is_oom(ValueError(message))  # only a RuntimeError from torch carries it


def test_every_fragment_the_classifier_matches_is_in_some_real_message():
    """The reverse check: a fragment in oom.py that no real message holds (a typo, an invented text) fails."""
    unmatched = [f for f in oom._OOM_MESSAGES if not any(f in m for m in REAL_OOM_MESSAGES)]
    assert unmatched == []


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
