"""The device seam: every line that differs between CPU and CUDA lives here, and nowhere else.

``get_device(name)`` returns a small object with the handful of operations a trial needs (autocast, the fp16
GradScaler, synchronisation, a step timer, peak memory, cudnn.benchmark). ``nvml_gpus()`` lists NVIDIA GPUs
through pynvml.
Nothing here imports torch at module import time, so the CLI and the parent process stay light.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["CPUDevice", "CUDADevice", "get_device", "nvml_gpus", "GPUInfo", "autocast_dtype_name",
           "HostStepTimer", "EventStepTimer"]


def autocast_dtype_name(device_type: str, amp: str) -> str | None:
    """The autocast dtype a config asks for on a device type, or None for full precision.

    fp16 autocast is refused on CPU: it is slower there than fp32 on every CPU we know of, and the search
    space never offers it (the caller gets a ConfigError naming the fix).
    """
    if amp == "off":
        return None
    if amp == "fp16" and device_type == "cpu":
        raise ConfigError("amp='fp16' is not supported on the CPU; use amp='bf16' or amp='off'")
    return {"bf16": "bfloat16", "fp16": "float16"}[amp]


class CPUDevice:
    type = "cpu"

    def __init__(self, name: str = "cpu") -> None:
        self.name = name

    def torch_device(self):
        import torch

        return torch.device("cpu")

    def prepare(self, config) -> None:
        """Process-wide settings for this device; CPU has none beyond the threads the worker sets."""

    def autocast(self, amp: str):
        import torch

        dtype = autocast_dtype_name(self.type, amp)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.type, dtype=getattr(torch, dtype))

    def grad_scaler(self, amp: str):
        # bf16 keeps fp32's exponent range: no loss scaling needed, on any device.
        return None

    def synchronize(self) -> None:
        """CPU kernels are synchronous: a step's end time is already honest."""

    def step_timer(self) -> HostStepTimer:
        """Times the data wait and compute of the steps of a window (see ``HostStepTimer``)."""
        return HostStepTimer(self)

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_mb(self) -> float | None:
        return None  # host memory is sampled by the parent, which sees DataLoader workers too

    def to_device(self, tensor, *, non_blocking: bool = False, channels_last: bool = False):
        import torch

        if channels_last and tensor.dim() == 4:
            return tensor.contiguous(memory_format=torch.channels_last)
        return tensor


class CUDADevice(CPUDevice):
    type = "cuda"

    def __init__(self, name: str = "cuda") -> None:
        super().__init__(name)

    def torch_device(self):
        import torch

        return torch.device(self.name)

    def prepare(self, config) -> None:
        import torch

        torch.cuda.set_device(self.torch_device())
        # cudnn.benchmark picks the fastest conv algorithm per input shape; shapes are fixed in a trial.
        torch.backends.cudnn.benchmark = bool(config.cudnn_benchmark)

    def grad_scaler(self, amp: str):
        import torch

        # fp16 has a narrow exponent: small gradients underflow to zero without loss scaling.
        return torch.amp.GradScaler("cuda") if amp == "fp16" else None

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.torch_device())  # kernels are async: time only after they finish

    def step_timer(self) -> HostStepTimer:
        return EventStepTimer(self)

    def new_event(self):
        """A timing event on the current stream (a fake device returns its own)."""
        import torch

        return torch.cuda.Event(enable_timing=True)

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.torch_device())

    def peak_memory_mb(self) -> float | None:
        import torch

        return torch.cuda.max_memory_reserved(self.torch_device()) / 2**20

    def to_device(self, tensor, *, non_blocking: bool = False, channels_last: bool = False):
        import torch

        fmt = torch.channels_last if channels_last and tensor.dim() == 4 else torch.contiguous_format
        return tensor.to(self.torch_device(), non_blocking=non_blocking, memory_format=fmt)


class HostStepTimer:
    """Splits the steps between ``start()`` and ``finish()`` into waiting for data and computing, by the host's clock.

    Honest where kernels run synchronously (the CPU): a step's host time is its cost. The step calls
    ``fetched()`` once the batch is in hand and ``done()`` once its work is issued; the time from the previous
    ``done()`` (or ``start()``) to ``fetched()`` is waiting, from ``fetched()`` to ``done()`` computing.
    ``finish()`` synchronises the device once and returns the totals in seconds.

    >>> t = HostStepTimer(CPUDevice()); t.start(); t.fetched(); t.done()
    >>> [x >= 0 for x in t.finish()]
    [True, True]
    """

    def __init__(self, device: CPUDevice) -> None:
        self._device = device
        self._wait = self._compute = 0.0
        self._last = time.perf_counter()

    def start(self) -> None:
        self._wait = self._compute = 0.0
        self._last = time.perf_counter()

    def fetched(self) -> None:
        now = time.perf_counter()
        self._wait += now - self._last
        self._last = now

    def done(self) -> None:
        now = time.perf_counter()
        self._compute += now - self._last
        self._last = now

    def finish(self) -> tuple[float, float]:
        self._device.synchronize()
        return self._wait, self._compute


class EventStepTimer(HostStepTimer):
    """The same split by the device's clock: an event is recorded at ``start()``, ``fetched()`` and ``done()``,
    and ``finish()`` synchronises once and reads the gaps between them.

    Kernels run asynchronously: while the host waits for the next batch, the device may still be running the
    previous step, and that wait costs nothing. On the device's timeline, the gap from the previous step's
    last kernel to the point the next batch was in hand is the time the device really sat waiting for data;
    from there to the step's last kernel is its compute. The two add up to the window's device time, so no
    step needs a synchronisation of its own.
    """

    def __init__(self, device: CPUDevice) -> None:
        self._device = device
        self._events: list = []

    def _mark(self) -> None:
        event = self._device.new_event()
        event.record()
        self._events.append(event)

    def start(self) -> None:
        self._events = []
        self._mark()

    fetched = done = _mark

    def finish(self) -> tuple[float, float]:
        self._device.synchronize()
        ev = self._events
        gaps = [a.elapsed_time(b) / 1e3 for a, b in zip(ev, ev[1:])]  # elapsed_time is in ms
        return sum(gaps[0::2]), sum(gaps[1::2])


def get_device(name: str) -> CPUDevice:
    """``cpu`` or ``cuda``/``cuda:N``; CUDA without a usable GPU is a ConfigError naming the fix."""
    if name == "cpu":
        return CPUDevice()
    if name == "cuda" or name.startswith("cuda:"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} but torch sees no CUDA GPU here; use --device cpu")
        return CUDADevice(name)
    raise ConfigError(f"device={name!r} is not supported; use cpu, cuda or cuda:N")


@dataclass(frozen=True)
class GPUInfo:
    index: int
    name: str
    memory_total_mb: float
    driver: str
    compute_capability: str | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def nvml_gpus(nvml: Any = None) -> tuple[list[GPUInfo], str]:
    """NVIDIA GPUs as pynvml sees them, and a one-line status ("ok", "pynvml not installed", "no driver").

    No pynvml or no driver is not an error: it returns ``([], reason)``. ``nvml`` may be passed in (tests use
    a fake module with the same functions).
    """
    if nvml is None:
        try:
            import pynvml as nvml  # the nvidia-ml-py package
        except ImportError:
            return [], "pynvml not installed (pip install nvidia-ml-py)"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: a machine without NVIDIA GPUs
        return [], f"no NVIDIA driver ({_text(exc) or type(exc).__name__})"
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
                cc = f"{major}.{minor}"
            except Exception:
                cc = None
            gpus.append(GPUInfo(i, _text(nvml.nvmlDeviceGetName(h)), mem.total / 2**20, driver, cc))
        return gpus, "ok"
    except Exception as exc:  # a GPU in a bad state (Xid errors, lost device): report it, never crash `env`
        return [], f"NVML error while listing GPUs ({_text(exc) or type(exc).__name__})"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()

