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


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x10)"),
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError(),
    ValueError("boom"),
    FloatingPointError("loss became nan"),
    KeyboardInterrupt(),
])
def test_other_errors_are_not_oom(exc):
    assert not is_oom(exc)


def test_real_cpu_allocator_failure_is_oom():
    with pytest.raises(Exception) as info:
        torch.empty(2**50, dtype=torch.uint8)  # 1 PiB
    assert is_oom(info.value), str(info.value)
