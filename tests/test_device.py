"""The device seam without a GPU: dtype mapping, GradScaler, step timers (CUDA's through fake events), get_device,
and NVML through a fake module."""

from __future__ import annotations

import dataclasses
import time
import types
import warnings

import pytest
import torch

from autotune import hardware
from autotune._device import (CPUDevice, CUDADevice, EventStepTimer, GPUInfo, HostStepTimer, autocast_dtype_name,
                               get_device, nvml_gpus)
from autotune.errors import ConfigError

NO_CUDA = not torch.cuda.is_available()


# --- autocast ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device_type, amp, name", [
    ("cpu", "off", None),
    ("cuda", "off", None),
    ("cpu", "bf16", "bfloat16"),
    ("cuda", "bf16", "bfloat16"),
    ("cuda", "fp16", "float16"),
])
def test_autocast_dtype_name(device_type, amp, name):
    assert autocast_dtype_name(device_type, amp) == name
    if name is not None:
        assert isinstance(getattr(torch, name), torch.dtype)


def test_fp16_on_cpu_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as info:
        autocast_dtype_name("cpu", "fp16")
    assert "fp16" in str(info.value) and "bf16" in str(info.value)
    with pytest.raises(ConfigError):
        CPUDevice().autocast("fp16")


def test_cpu_autocast_really_casts():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with CPUDevice().autocast("bf16"):
        assert torch.mm(a, b).dtype == torch.bfloat16
    with CPUDevice().autocast("off"):
        assert torch.mm(a, b).dtype == torch.float32


# --- GradScaler -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("amp", ["off", "bf16", "fp16"])
def test_cpu_has_no_grad_scaler(amp):
    assert CPUDevice().grad_scaler(amp) is None


def test_cuda_grad_scaler_only_for_fp16():
    dev = CUDADevice("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "GradScaler is enabled, but CUDA is not available" without a GPU
        try:
            scaler = dev.grad_scaler("fp16")
        except Exception as exc:  # pragma: no cover - a torch build that refuses to build it without CUDA
            pytest.skip(f"GradScaler('cuda') cannot be built here: {exc}")
    assert isinstance(scaler, torch.amp.GradScaler)
    assert dev.grad_scaler("bf16") is None
    assert dev.grad_scaler("off") is None


# --- CPU device operations ----------------------------------------------------------------------------------

def test_cpu_device_basics():
    dev = CPUDevice()
    assert dev.type == "cpu"
    assert dev.torch_device() == torch.device("cpu")
    assert dev.peak_memory_mb() is None
    dev.synchronize()
    dev.reset_peak_memory()
    x = torch.randn(2, 3, 8, 8)
    y = dev.to_device(x, channels_last=True)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert not x.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x, y)
    flat = torch.arange(6)
    assert dev.to_device(flat, channels_last=True) is flat  # not 4-D: untouched


# --- step timers -------------------------------------------------------------------------------------------

class _Clock:
    """A device clock the test sets by hand; its events read it when recorded, as CUDA events are stamped."""

    def __init__(self) -> None:
        self.now = 0.0


class _Event:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def record(self) -> None:
        self.t = self.clock.now

    def elapsed_time(self, end: "_Event") -> float:
        return (end.t - self.t) * 1e3  # ms, like torch.cuda.Event


class _FakeCUDA(CUDADevice):
    """CUDADevice's timer on fake events; counts synchronisations."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__("cuda")
        self.clock, self.syncs = clock, 0

    def new_event(self):
        return _Event(self.clock)

    def synchronize(self) -> None:
        self.syncs += 1


def test_each_device_has_its_timer():
    assert type(CPUDevice().step_timer()) is HostStepTimer
    assert type(CUDADevice("cuda").step_timer()) is EventStepTimer  # no GPU needed to build it


def test_event_timer_splits_by_the_device_timeline_and_synchronises_once():
    clock = _Clock()
    dev = _FakeCUDA(clock)
    timer = dev.step_timer()
    timer.start()                       # device idle at t=0
    clock.now = 0.010; timer.fetched()  # first batch in hand: the device sat 10 ms waiting for it
    clock.now = 0.050; timer.done()     # its kernels end at 50 ms
    clock.now = 0.052; timer.fetched()  # next batch fetched while they ran: only 2 ms of idle device
    clock.now = 0.090; timer.done()
    assert dev.syncs == 0               # nothing synchronises inside the window
    wait, compute = timer.finish()
    assert dev.syncs == 1
    assert wait == pytest.approx(0.012) and compute == pytest.approx(0.078)
    timer.start()                       # a new window starts afresh
    clock.now = 0.1; timer.fetched(); timer.done()
    assert timer.finish() == pytest.approx((0.010, 0.0)) and dev.syncs == 2


def test_host_timer_chains_the_steps():
    timer = HostStepTimer(CPUDevice())
    timer.start()
    time.sleep(0.02)
    timer.fetched()
    time.sleep(0.03)
    timer.done()
    wait, compute = timer.finish()
    assert 0.02 <= wait < 0.03 <= compute < 0.2


# --- get_device ---------------------------------------------------------------------------------------------

def test_get_device_cpu():
    dev = get_device("cpu")
    assert isinstance(dev, CPUDevice) and not isinstance(dev, CUDADevice)


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA GPU is visible")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_get_device_cuda_without_gpu(name):
    with pytest.raises(ConfigError) as info:
        get_device(name)
    assert repr(name) in str(info.value) and "--device cpu" in str(info.value)


@pytest.mark.parametrize("name", ["tpu", "mps", "CPU", ""])
def test_get_device_unknown(name):
    with pytest.raises(ConfigError, match="not supported"):
        get_device(name)


# --- NVML through a fake pynvml -----------------------------------------------------------------------------

class _NVMLError(Exception):
    pass


def fake_nvml(gpus=(("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0)),), *, driver=b"550.54.15", init_error=None):
    """A stand-in for pynvml: ``gpus`` is a sequence of (name, total bytes, (major, minor) or None)."""
    calls = {"init": 0, "shutdown": 0}

    def nvmlInit():
        calls["init"] += 1
        if init_error is not None:
            raise init_error

    def nvmlShutdown():
        calls["shutdown"] += 1

    def cc(handle):
        value = gpus[handle][2]
        if value is None:
            raise _NVMLError("Not Supported")
        return value

    ns = types.SimpleNamespace(
        nvmlInit=nvmlInit,
        nvmlShutdown=nvmlShutdown,
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=gpus[h][1], free=gpus[h][1], used=0),
        nvmlDeviceGetName=lambda h: gpus[h][0],
        nvmlDeviceGetCudaComputeCapability=cc,
    )
    ns.calls = calls
    return ns


def test_nvml_gpus_with_fake():
    fake = fake_nvml([("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0)), (b"Tesla T4", 15 * 2**30, (7, 5))])
    gpus, status = nvml_gpus(fake)
    assert status == "ok"
    assert gpus == [
        GPUInfo(0, "NVIDIA A100-SXM4-40GB", 40 * 1024.0, "550.54.15", "8.0"),
        GPUInfo(1, "Tesla T4", 15 * 1024.0, "550.54.15", "7.5"),  # bytes names are decoded
    ]
    assert fake.calls == {"init": 1, "shutdown": 1}
    assert gpus[0].to_dict() == {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mb": 40960.0,
                                 "driver": "550.54.15", "compute_capability": "8.0"}


def test_nvml_gpus_unknown_compute_capability():
    gpus, status = nvml_gpus(fake_nvml([("Old GPU", 2**30, None)], driver="390.1"))
    assert status == "ok"
    assert gpus[0].compute_capability is None and gpus[0].driver == "390.1"


def test_nvml_gpus_zero_devices():
    fake = fake_nvml([])
    assert nvml_gpus(fake) == ([], "ok")
    assert fake.calls["shutdown"] == 1


def test_nvml_gpus_without_driver():
    fake = fake_nvml(init_error=_NVMLError("NVML Shared Library Not Found"))
    gpus, status = nvml_gpus(fake)
    assert gpus == []
    assert "no NVIDIA driver" in status and "NVML Shared Library Not Found" in status
    assert fake.calls["shutdown"] == 0  # never initialised, never shut down


def test_nvml_gpus_without_driver_and_empty_message():
    gpus, status = nvml_gpus(fake_nvml(init_error=_NVMLError()))
    assert gpus == [] and status == "no NVIDIA driver (_NVMLError)"


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA GPU is visible")
def test_nvml_gpus_on_this_machine_reports_why_there_is_none():
    gpus, status = nvml_gpus()
    assert gpus == []
    assert status.startswith("no NVIDIA driver") or status.startswith("pynvml not installed")


# --- hardware.detect with the fake ---------------------------------------------------------------------------

def test_detect_with_fake_gpu():
    fake = fake_nvml([("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0))])
    hw = hardware.detect(with_torch=False, nvml=fake)
    assert hw.gpu_status == "ok"
    assert len(hw.gpus) == 1
    g = hw.gpus[0]
    assert g["name"] == "NVIDIA A100-SXM4-40GB" and g["memory_total_mb"] == 40960.0
    assert g["compute_capability"] == "8.0" and g["index"] == 0
    assert "NVIDIA A100-SXM4-40GB" in hw.summary_line()
    assert "gpu 0" in hw.describe() and "compute 8.0" in hw.describe()
    no_gpu = hardware.detect(with_torch=False, nvml=fake_nvml(init_error=_NVMLError("no driver")))
    assert no_gpu.gpus == () and "no GPU" in no_gpu.summary_line()
    assert hw.fingerprint != no_gpu.fingerprint  # a GPU is part of what the machine is


@pytest.mark.parametrize("cc, expected", [
    ((8, 0), True),
    ((7, 5), False),
    ((10, 0), True),
    ((12, 1), True),
    ((6, 1), False),
    (None, False),
])
def test_has_bf16_from_gpu_compute_capability(cc, expected):
    hw = hardware.detect(with_torch=False, nvml=fake_nvml([("GPU", 8 * 2**30, cc)]))
    hw = dataclasses.replace(hw, cpu_flags=())  # this CPU may have native bf16: look at the GPU only
    assert hw.has_bf16 is expected


def test_has_bf16_from_cpu_flags():
    hw = hardware.detect(with_torch=False, nvml=fake_nvml([]))
    assert dataclasses.replace(hw, cpu_flags=("avx2", "fma")).has_bf16 is False
    assert dataclasses.replace(hw, cpu_flags=("avx512f", "avx512_bf16")).has_bf16 is True
    assert dataclasses.replace(hw, cpu_flags=("amx_bf16",)).has_bf16 is True


def test_nvml_error_while_listing_is_reported_not_raised():
    fake = fake_nvml()

    def broken(h):
        raise _NVMLError("Unknown Error")

    fake.nvmlDeviceGetMemoryInfo = broken
    gpus, status = nvml_gpus(fake)
    assert gpus == [] and "Unknown Error" in status
    assert fake.calls["shutdown"] == 1
