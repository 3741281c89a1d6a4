"""The GPU decisions that need the driver's answer (which GPU, which driver, how much memory is free): made on
NVML rows and a torch build description, the only fakes here, so every branch runs without a GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.machine.gpu_check import CudaBuild, check_cuda_usable, cuda_in_forked_worker, cuda_problem
from autotune.config import TrialConfig
from autotune.errors import ConfigError
from autotune.workloads.global_batch import check_cudagraphs, restrict_space
from autotune.machine.hardware import detect
from autotune.machine.limits import check_device_cap, default_device_memory_cap_mb
from autotune.search.space.search_space import space_from_dict

CU130 = CudaBuild("2.14.1+cu130", "13.0", ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"), True)


def gpu(name="NVIDIA A100-SXM4-40GB", cc="8.0", total=40960.0, free=None, driver="580.82.07", index=0, uuid=None):
    return {"index": index, "name": name, "compute_capability": cc, "memory_total_mb": total, "driver": driver,
            "memory_free_mb": free, "uuid": uuid or f"GPU-{index:04d}", "pci_bus_id": f"0000:{index + 1:02d}:00.0"}


def hw_with(*gpus, visible=None):
    return dataclasses.replace(detect(with_torch=False), gpus=tuple(gpus), cuda_visible_devices=visible)


# --- a GPU this torch cannot use is refused up front, in one line ------------------------------------------

def test_a_cpu_only_build_beside_a_gpu_names_the_build_and_the_fix():
    msg = cuda_problem("cuda", [gpu()], dataclasses.replace(CU130, torch="2.14.1+cpu", cuda=None, available=False))
    assert "2.14.1+cpu is a CPU-only build" in msg and "A100" in msg and "--device cpu" in msg


def test_a_driver_older_than_the_build_needs_names_both_versions():
    msg = cuda_problem("cuda", [gpu(name="Tesla T4", cc="7.5", driver="535.104.05")],
                       dataclasses.replace(CU130, available=False))
    assert "driver 535.104.05" in msg and "CUDA 13.0" in msg and "580.65.6" in msg and "update the driver" in msg
    ok = cuda_problem("cuda", [gpu(driver="535.104.05")], dataclasses.replace(CU130, cuda="12.6"))
    assert ok is None  # CUDA 12.x runs on 525.60.13 and newer


def test_a_gpu_below_the_builds_oldest_architecture_kaggles_p100():
    msg = cuda_problem("cuda", [gpu(name="Tesla P100-PCIE-16GB", cc="6.0")],
                       dataclasses.replace(CU130, available=False))
    assert "compute capability 6.0" in msg and "7.5 and newer" in msg and "sm_60" in msg
    # binary compatible within a major (sm_80 runs on 8.6, 8.9), and PTX JIT-compiles for anything newer
    assert cuda_problem("cuda", [gpu(cc="8.9")], dataclasses.replace(CU130, arch_list=("sm_80",))) is None
    assert cuda_problem("cuda", [gpu(cc="7.0")], dataclasses.replace(CU130, arch_list=("sm_75", "compute_70"))) is None
    assert cuda_problem("cuda", [gpu(cc="7.0")], CU130) is not None  # V100: sm_75 does not run on 7.0


def test_a_build_that_finds_no_gpu_for_a_reason_nvml_cannot_tell():
    msg = cuda_problem("cuda", [gpu()], dataclasses.replace(CU130, available=False))
    assert "finds no usable GPU though NVML lists" in msg and "nvidia-smi" in msg


def test_check_cuda_usable_refuses_bf16_below_compute_8_and_a_hidden_device():
    t4 = hw_with(gpu(name="Tesla T4", cc="7.5"))
    check_cuda_usable("cuda", t4, amp="fp16", build=CU130)
    with pytest.raises(ConfigError, match="--amp bf16 needs compute capability 8.0.*Tesla T4 is 7.5"):
        check_cuda_usable("cuda", t4, amp="bf16", build=CU130)
    check_cuda_usable("cuda", hw_with(gpu()), amp="bf16", build=CU130)
    with pytest.raises(ConfigError, match="names no GPU here"):
        check_cuda_usable("cuda:1", t4, build=CU130)
    check_cuda_usable("cpu", t4)  # nothing to check on the CPU


# --- the device memory cap -----------------------------------------------------------------------------------

def test_the_default_device_cap_is_the_free_memory_less_the_cuda_context():
    # another process holds 10 GiB of the 40: the cap is what is free now, less 512 MiB for the context
    assert default_device_memory_cap_mb(hw_with(gpu(free=30720.0)), "cuda") == 30720.0 - 512.0
    assert default_device_memory_cap_mb(hw_with(gpu(free=None)), "cuda") == 40960.0 - 512.0  # NVML gave no free
    assert default_device_memory_cap_mb(hw_with(gpu()), "cpu") is None
    # CUDA_VISIBLE_DEVICES=1: cuda is the second GPU, and its free memory counts
    two = hw_with(gpu(free=30000.0), gpu(name="NVIDIA A100-SXM4-40GB", free=8000.0, index=1), visible="1")
    assert default_device_memory_cap_mb(two, "cuda") == 8000.0 - 512.0


def test_a_device_cap_off_a_gpu_too_small_or_too_large_is_one_line():
    hw = hw_with(gpu(total=16384.0))
    check_device_cap(8192.0, hw, "cuda")
    with pytest.raises(ConfigError, match="applies to a GPU"):
        check_device_cap(8192.0, hw, "cpu")
    with pytest.raises(ConfigError, match="below the 256 MiB"):
        check_device_cap(100.0, hw, "cuda")
    with pytest.raises(ConfigError, match="larger than the 16.00 GiB of the GPU cuda runs on"):
        check_device_cap(20000.0, hw, "cuda")


# --- CUDA graphs and gradient accumulation -----------------------------------------------------------------

def _space():
    # a compiler and Python.h on the fake machine: torch.compile's modes are offered whatever this one has
    hw = dataclasses.replace(hw_with(gpu()), compiler="/usr/bin/g++", python_headers=True)
    return space_from_dict({"name": "t", "device": "cuda", "parameters": {
        "batch_size": {"type": "int", "choices": [32, 64, 128]},
        "compile_mode": {"type": "categorical", "choices": ["none", "default", "reduce-overhead", "max-autotune"]}}},
        hardware=hw, device="cuda")


def test_cuda_graph_modes_are_not_searched_under_a_global_batch_on_a_gpu():
    sp = _space()
    modes = lambda s: next(p.choices for p in s.params if p.name == "compile_mode")  # noqa: E731
    assert "reduce-overhead" in modes(sp)
    cut = restrict_space(sp, 128, device="cuda")
    assert modes(cut) == ("none", "default") and any("CUDA graphs" in n for n in cut.notes)
    assert modes(restrict_space(sp, None, device="cuda")) == modes(sp)  # no accumulation: kept


def test_a_cuda_graph_trial_that_accumulates_is_refused():
    with pytest.raises(ConfigError, match="overwrite accumulated gradients"):
        check_cudagraphs("cuda", 256, TrialConfig(batch_size=64, compile_mode="reduce-overhead"))
    check_cudagraphs("cuda", 256, TrialConfig(batch_size=256, compile_mode="reduce-overhead"))  # no accumulation
    check_cudagraphs("cuda", 256, TrialConfig(batch_size=64, compile_mode="default"))
    check_cudagraphs("cpu", 256, TrialConfig(batch_size=64, compile_mode="max-autotune"))  # no CUDA graphs on CPU


# --- smaller -------------------------------------------------------------------------------------------------

def test_the_fingerprint_names_the_gpus_trials_can_use():
    a100, t4 = gpu(index=0), gpu(name="Tesla T4", cc="7.5", total=15360.0, index=1)
    both = hw_with(a100, t4)
    only_t4 = hw_with(a100, t4, visible="GPU-0001")  # by UUID
    assert only_t4.fingerprint != both.fingerprint
    assert hw_with(t4).fingerprint == only_t4.fingerprint  # as if the machine had the T4 alone
    by_bus = dataclasses.replace(hw_with(a100, t4, visible="1"), cuda_device_order="PCI_BUS_ID")
    assert by_bus.fingerprint == only_t4.fingerprint
    # an index on a mixed machine in CUDA's default (fastest first) order could be either GPU: both are named
    assert hw_with(a100, t4, visible="1").fingerprint == both.fingerprint


def test_compile_needs_pythons_headers_too():
    hw = detect(with_torch=False)
    assert dataclasses.replace(hw, compiler="/usr/bin/g++", python_headers=False).can_compile is False
    assert "Python.h not found" in dataclasses.replace(hw, compiler="/usr/bin/g++", python_headers=False).describe()
    assert dataclasses.replace(hw, compiler="/usr/bin/g++", python_headers=True).can_compile is True


def test_cuda_in_a_forked_dataloader_worker_is_a_workload_error_with_the_fix():
    import torch

    # the text torch raises (read from its source, so a rename there fails this test rather than the users)
    source = Path(torch.cuda.__file__).read_text()
    assert "Cannot re-initialize CUDA in forked subprocess" in source
    wrapped = RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
                           "last):\n  ...\nRuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA "
                           "with multiprocessing, you must use the 'spawn' start method")
    msg = cuda_in_forked_worker(wrapped)
    assert msg.startswith("WorkloadError:") and "keep the data on the CPU" in msg and "\n" not in msg
    assert cuda_in_forked_worker(RuntimeError("shape mismatch")) is None
