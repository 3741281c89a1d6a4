"""Every CUDA operation of the device seam, called with the real torch: here, without a driver, each must fail
only for want of the driver (never ValueError, TypeError, AttributeError or AssertionError, which a GPU would
raise too); where a GPU is visible, each must succeed.

No fake stands in for torch: the 2.14 release raised ``ValueError: Expected a torch.device with a specified
index`` from ``torch.cuda.set_device(torch.device("cuda"))`` on every GPU trial while the suite replaced
``prepare`` with a no-op. This file fails on that code (``prepare`` of ``cuda``), driver or not.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from autotune.machine.device import CUDADevice, nvml_gpus
from autotune.machine.gpu_check import CudaBuild
from autotune.applied import Applied
from autotune.config import TrialConfig

# What torch says when the driver (or a device under it) is missing, and nothing else: one of these is the only
# acceptable failure on a machine without one.
NO_DRIVER = (
    "Found no NVIDIA driver",  # torch.cuda._lazy_init: no libcuda
    "CUDA driver version is insufficient",  # cudaErrorInsufficientDriver, from the runtime without a driver
    "no CUDA GPUs are available",  # a driver but no device (CUDA_VISIBLE_DEVICES="")
    # c10::cuda's check that the index is below the device count (0 without a driver), for the calls that go
    # straight to the allocator with an integer index (reset_peak_memory_stats(0))
    "Invalid device argument",
)

HAVE_GPU = torch.cuda.is_available()

if torch.version.cuda is None:
    pytest.skip("this torch is a CPU-only build: its CUDA calls fail for want of CUDA itself", allow_module_level=True)


def _model_step(dev: CUDADevice):
    from autotune.trial.worker import make_step

    step = make_step(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2)), nn.CrossEntropyLoss(),
                     TrialConfig(batch_size=2, amp="fp16", channels_last=True), dev, train=True)
    return step((torch.randn(2, 3, 8, 8), torch.tensor([0, 1])))


def _timed(dev: CUDADevice):
    timer = dev.step_timer()
    timer.start()
    timer.fetched()
    timer.done()
    return timer.finish()


OPS = {
    "prepare (cudnn.benchmark)": lambda d: d.prepare(TrialConfig(cudnn_benchmark=True)),
    "prepare with a device memory cap": lambda d: d.prepare(TrialConfig(), memory_cap_mb=1024.0),
    "synchronize": lambda d: d.synchronize(),
    "step timer (events)": _timed,
    "reset peak memory": lambda d: d.reset_peak_memory(),
    "peak reserved": lambda d: d.peak_memory_mb(),
    "peak allocated": lambda d: d.peak_allocated_mb(),
    "autocast fp16": lambda d: d.autocast("fp16").__enter__(),
    "autocast bf16": lambda d: d.autocast("bf16").__enter__(),
    "GradScaler.scale": lambda d: d.grad_scaler("fp16").scale(torch.ones(1, device=d.torch_device())),
    "transfer non_blocking channels_last": lambda d: d.to_device(torch.ones(2, 3, 4, 4), non_blocking=True,
                                                                 channels_last=True),
    "pinned host memory": lambda d: torch.ones(2).pin_memory(),
    "release cached memory": lambda d: d.release_cached_memory(),
    "the parity check's rng state": lambda d: torch.cuda.get_rng_state(d.index),
    "a training step (fp16, GradScaler, channels_last)": _model_step,
    "Recommendation.apply's prepare_model": lambda d: Applied(TrialConfig(channels_last=True), d.name)
    .prepare_model(nn.Conv2d(3, 4, 3)),
}


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_each_cuda_operation_fails_only_for_want_of_the_driver(name, op):
    dev = CUDADevice(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available. Disabling autocast": torch's, and expected
        try:
            OPS[op](dev)
        except Exception as exc:  # noqa: BLE001 - the kind of failure is what is tested
            text = str(exc)
            assert isinstance(exc, RuntimeError), f"{op} on {name}: {type(exc).__name__}: {text}"
            assert not HAVE_GPU, f"{op} on {name} failed on a GPU: {type(exc).__name__}: {text}"
            assert any(m in text for m in NO_DRIVER), f"{op} on {name}: not a missing driver: {text}"


def test_the_old_prepare_fails_the_way_this_file_looks_for():
    """What the seam did before: the plain device, not its index. The check above rejects its failure."""
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_device(torch.device("cuda"))


def test_a_device_name_that_is_not_cuda_is_a_config_error():
    from autotune.errors import ConfigError

    for bad in ("cuda:x", "gpu:0", "cuda:-1"):
        with pytest.raises(ConfigError, match="not a CUDA device"):
            CUDADevice(bad)
    assert CUDADevice("cuda:3").index == 3  # no CUDA call needed for an explicit index


def test_nvml_and_the_build_are_read_without_raising():
    gpus, status = nvml_gpus()  # the real pynvml: no driver here is a status, not an exception
    assert (status == "ok") == bool(gpus)
    build = CudaBuild.read()
    assert build.cuda == torch.version.cuda and build.available == HAVE_GPU
    assert all(a.startswith(("sm_", "compute_")) for a in build.arch_list)
