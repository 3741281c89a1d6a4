"""The device seam without a GPU: dtype mapping, GradScaler, step timers (CUDA's through fake events), get_device,
and NVML through a fake module."""

from __future__ import annotations

import dataclasses
import time
import types
import warnings

import pytest
import torch

from autotune.machine import hardware
from autotune.machine.device import (CPUDevice, CUDADevice, EventStepTimer, GPUInfo, HostStepTimer,
                                     autocast_dtype_name, cuda_device_gpus, get_device, nvml_gpus)
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
    clock.now = 0.010
    timer.fetched()                     # first batch in hand: the device sat 10 ms waiting for it
    clock.now = 0.050
    timer.done()                        # its kernels end at 50 ms
    clock.now = 0.052
    timer.fetched()                     # next batch fetched while they ran: only 2 ms of idle device
    clock.now = 0.090
    timer.done()
    assert dev.syncs == 0               # nothing synchronises inside the window
    wait, compute = timer.finish()
    assert dev.syncs == 1
    assert wait == pytest.approx(0.012) and compute == pytest.approx(0.078)
    timer.start()                       # a new window starts afresh
    clock.now = 0.1
    timer.fetched()
    timer.done()
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


def fake_nvml(gpus=(("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0)),), *, driver=b"550.54.15", init_error=None,
              ids=None):
    """A stand-in for pynvml: ``gpus`` is a sequence of (name, total bytes, (major, minor) or None); ``ids``,
    when given, one (uuid, PCI bus id) per GPU (without it the fake is an old pynvml with neither call)."""
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
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=gpus[h][1], free=gpus[h][1] - 2**30, used=2**30),
        nvmlDeviceGetName=lambda h: gpus[h][0],
        nvmlDeviceGetCudaComputeCapability=cc,
    )
    if ids is not None:
        ns.nvmlDeviceGetUUID = lambda h: ids[h][0]
        ns.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=ids[h][1])
    ns.calls = calls
    return ns


def test_nvml_gpus_with_fake():
    fake = fake_nvml([("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0)), (b"Tesla T4", 15 * 2**30, (7, 5))])
    gpus, status = nvml_gpus(fake)
    assert status == "ok"
    assert gpus == [
        GPUInfo(0, "NVIDIA A100-SXM4-40GB", 40 * 1024.0, "550.54.15", "8.0", memory_free_mb=39 * 1024.0),
        GPUInfo(1, "Tesla T4", 15 * 1024.0, "550.54.15", "7.5", memory_free_mb=14 * 1024.0),  # bytes names decoded
    ]
    assert fake.calls == {"init": 1, "shutdown": 1}
    assert gpus[0].to_dict() == {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mb": 40960.0,
                                 "driver": "550.54.15", "compute_capability": "8.0", "uuid": None,
                                 "pci_bus_id": None, "memory_free_mb": 39 * 1024.0}


def test_nvml_gpus_reads_uuid_and_bus_id():
    fake = fake_nvml([("A100", 40 * 2**30, (8, 0)), ("T4", 15 * 2**30, (7, 5))],
                     ids=[(b"GPU-aaaa-1111", b"00000000:3b:00.0"), ("GPU-bbbb-2222", "00000000:AF:00.0")])
    gpus, status = nvml_gpus(fake)
    assert status == "ok"
    assert [(g.uuid, g.pci_bus_id) for g in gpus] == [("GPU-aaaa-1111", "00000000:3B:00.0"),
                                                      ("GPU-bbbb-2222", "00000000:AF:00.0")]


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
def test_has_bf16_from_gpu_compute_capability(cc, expected, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the one fake GPU is the one trials see
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


# --- which GPU a cuda device is --------------------------------------------------------------------------------
# NVML lists every GPU; CUDA numbers only the ones CUDA_VISIBLE_DEVICES shows, in its order. Fake rows as
# Hardware.gpus holds them: NVML lists the T4 first here, but the A100 sits on the lower PCI bus.

T4 = {"index": 0, "name": "Tesla T4", "memory_total_mb": 15360.0, "driver": "550.54.15",
      "compute_capability": "7.5", "uuid": "GPU-7a1b0000-0000-0000-0000-000000000001", "pci_bus_id": "00000000:AF:00.0"}
A100 = {"index": 1, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mb": 40960.0, "driver": "550.54.15",
        "compute_capability": "8.0", "uuid": "GPU-a1000000-0000-0000-0000-000000000002",
        "pci_bus_id": "00000000:3B:00.0"}
TWO = [T4, A100]


def names(gpus) -> list[str]:
    return [g["name"] for g in gpus]


@pytest.mark.parametrize("device, visible, expected", [
    ("cuda", None, ["NVIDIA A100-SXM4-40GB"]),        # CUDA's 0 is the lowest bus id, not NVML's first row
    ("cuda:0", None, ["NVIDIA A100-SXM4-40GB"]),
    ("cuda:1", None, ["Tesla T4"]),
    ("cuda:2", None, []),
    ("cuda", "1", ["Tesla T4"]),                      # CUDA index 1 = the T4 (bus order)
    ("cuda", "1,0", ["Tesla T4"]),
    ("cuda:1", "1,0", ["NVIDIA A100-SXM4-40GB"]),
    ("cuda:1", "1", []),                              # hidden
    ("cuda", "", []),                                 # nothing visible
    ("cuda", "GPU-7a1b", ["Tesla T4"]),               # a unique UUID prefix is enough
    ("cuda:1", "GPU-a1000000-0000-0000-0000-000000000002,GPU-7a1b", ["Tesla T4"]),
    ("cuda", "GPU-", []),                             # a prefix of both: names no one GPU, the list ends
    ("cuda", "GPU-ffff", []),                         # no such GPU
    ("cuda:1", "0,-1,1", []),                         # CUDA reads up to the first invalid entry: only 0
    ("cuda:1", "0,7,1", []),
    ("cuda:1", "0,0", []),                            # a GPU listed twice is not a second device
    ("cuda", " 1 ", ["Tesla T4"]),
    ("cuda", "MIG-0c9f", ["Tesla T4", "NVIDIA A100-SXM4-40GB"]),  # a MIG slice: of some GPU, we cannot tell which
])
def test_cuda_device_gpus_in_bus_order(device, visible, expected):
    assert names(cuda_device_gpus(device, TWO, visible=visible, order="PCI_BUS_ID")) == expected


def test_cuda_device_gpus_fastest_first_on_mixed_gpus_cannot_tell_an_index():
    # CUDA's default order ranks by speed with a heuristic NVML does not expose: an index could be either GPU
    for device, visible in (("cuda", None), ("cuda:1", None), ("cuda", "1"), ("cuda", "0,1")):
        assert names(cuda_device_gpus(device, TWO, visible=visible)) == names(TWO), (device, visible)
    assert names(cuda_device_gpus("cuda:2", TWO)) == []
    assert names(cuda_device_gpus("cuda", TWO, visible="GPU-a100")) == ["NVIDIA A100-SXM4-40GB"]  # a UUID is exact
    assert names(cuda_device_gpus("cuda", TWO, visible="FASTEST_FIRST".lower())) == []  # not an entry at all


def test_cuda_device_gpus_of_one_model_are_in_bus_order_whatever_the_order():
    a, b = dict(A100, index=0, pci_bus_id="00000000:AF:00.0"), dict(A100, index=1, uuid="GPU-b",
                                                                     pci_bus_id="00000000:3B:00.0")
    assert cuda_device_gpus("cuda", [a, b]) == [b]
    assert cuda_device_gpus("cuda", [a, b], visible="1", order="FASTEST_FIRST") == [a]


def test_cuda_device_gpus_without_uuid_or_bus_id():
    # an older pynvml (or a stored Hardware from before these were kept): NVML's order, UUIDs unknown
    old = [{k: v for k, v in g.items() if k not in ("uuid", "pci_bus_id")} for g in TWO]
    assert names(cuda_device_gpus("cuda", old, order="PCI_BUS_ID")) == ["Tesla T4"]
    assert names(cuda_device_gpus("cuda", old, visible="GPU-7a1b", order="PCI_BUS_ID")) == names(TWO)


@pytest.mark.parametrize("device", ["cpu", "cuda:x", "cuda:-1", "gpu:0"])
def test_cuda_device_gpus_refuses_a_non_cuda_name(device):
    with pytest.raises(ConfigError, match="use cuda or cuda:N"):
        cuda_device_gpus(device, TWO)


def test_detect_follows_cuda_visible_devices(monkeypatch):
    """bf16 is judged on the GPU the trials will see, not on any GPU NVML lists."""
    fake = fake_nvml([("Tesla T4", 15 * 2**30, (7, 5)), ("NVIDIA A100-SXM4-40GB", 40 * 2**30, (8, 0))],
                     ids=[(T4["uuid"], T4["pci_bus_id"]), (A100["uuid"], A100["pci_bus_id"])])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA's index 1 in bus order: the T4 (NVML's row 0)
    hw = hardware.detect(with_torch=False, nvml=fake)
    assert (hw.cuda_visible_devices, hw.cuda_device_order) == ("1", "PCI_BUS_ID")
    assert names(hw.gpus_for("cuda")) == ["Tesla T4"] and hw.gpus_for("cuda:1") == ()
    assert hw.gpu_has_bf16 is False and hw.gpu_bf16("cuda:0") is False
    assert "CUDA_VISIBLE_DEVICES  1" in hw.describe() and "gpu 0" in hw.describe()
    assert any(row.startswith("cuda is") and row.endswith("gpu 0") for row in hw.describe().splitlines())

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", A100["uuid"])
    hw = hardware.detect(with_torch=False, nvml=fake)
    assert names(hw.gpus_for()) == ["NVIDIA A100-SXM4-40GB"] and hw.gpu_has_bf16 is True

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    hw = hardware.detect(with_torch=False, nvml=fake)
    assert hw.cuda_visible_devices is None and hw.cuda_device_order is None
    assert names(hw.gpus_for()) == names(TWO)  # mixed GPUs, fastest first: either; bf16 only if both have it
    assert hw.gpu_has_bf16 is False
    assert "CUDA_VISIBLE_DEVICES" not in hw.describe()


def test_hardware_round_trip_keeps_cuda_numbering():
    hw = dataclasses.replace(hardware.detect(with_torch=False, nvml=fake_nvml([])), gpus=(T4, A100),
                             cuda_visible_devices="GPU-a100", cuda_device_order=None)
    back = hardware.Hardware.from_dict(hw.to_dict())
    assert back == hw and names(back.gpus_for("cuda")) == ["NVIDIA A100-SXM4-40GB"]
    old = {k: v for k, v in hw.to_dict().items() if k not in ("cuda_visible_devices", "cuda_device_order")}
    assert hardware.Hardware.from_dict(old).cuda_visible_devices is None  # a Hardware stored before these fields


def test_lazy_model_trains_channels_last_on_the_cpu():
    """A model holding lazy modules (``LazyConv2d``, ``LazyLinear``) trains through the trial's ``make_step`` with
    channels_last: torch refuses ``model.to(memory_format=...)`` on an uninitialised parameter (the first GPU run's
    crash); the lazy module converts its own weights once it has made them."""
    import torch
    from torch import nn

    from autotune.config import TrialConfig
    from autotune.machine.device import CPUDevice
    from autotune.trial.worker import make_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyConv2d(5, 3), nn.Flatten(), nn.LazyLinear(2))
    with pytest.raises(ValueError, match="uninitialized parameter"):
        nn.Sequential(nn.LazyLinear(2)).to(memory_format=torch.channels_last)  # what the trial used to do
    step = make_step(model, nn.CrossEntropyLoss(), TrialConfig(batch_size=4, channels_last=True), CPUDevice(),
                     train=True)
    batch = (torch.randn(4, 3, 12, 12), torch.tensor([0, 1, 0, 1]))
    losses = [float(step(batch).loss) for _ in range(5)]
    assert model[1].weight.is_contiguous(memory_format=torch.channels_last)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert losses[-1] < losses[0]  # it trains: the optimizer holds the materialised parameters
