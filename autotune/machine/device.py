"""The device seam: every line that differs between CPU and CUDA lives here, and nowhere else.

``get_device(name)`` returns a small object with the handful of operations a trial needs (autocast, the fp16
GradScaler, synchronisation, a step timer, peak memory, cudnn.benchmark). ``nvml_gpus()`` lists NVIDIA GPUs
through pynvml; ``cuda_device_gpus()`` says which of them a torch device name (``cuda:N``) is, as CUDA numbers
them.
Nothing here imports torch at module import time, so the CLI and the parent process stay light.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError

__all__ = ["channels_last_model", "CPUDevice", "CUDADevice", "get_device", "nvml_gpus", "GPUInfo",
           "autocast_dtype_name", "cuda_device_gpus", "HostStepTimer", "EventStepTimer"]


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


def channels_last_model(model: Any, memory_format: Any = None) -> Any:
    """``model.to(memory_format=torch.channels_last)``, for a model holding lazy modules too (``LazyLinear``,
    ``LazyConv2d``): torch refuses to touch an uninitialised parameter, so the initialised 4-D parameters and
    buffers are converted now, and each lazy module converts its own just before its first forward, once it has
    materialised them (its pre-hook runs before ours: it was registered when the module was made).
    ``memory_format`` another format (``torch.contiguous_format``: undoing it; a later call's hook runs after an
    earlier one's, so the last format asked is the one a lazy module ends in).

    >>> import torch
    >>> nn = torch.nn
    >>> m = channels_last_model(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2)))
    >>> m[0].weight.is_contiguous(memory_format=torch.channels_last)
    True
    """
    import torch
    from torch.nn.parameter import is_lazy

    def lazy(m: Any) -> bool:
        return any(is_lazy(t) for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))

    fmt = torch.channels_last if memory_format is None else memory_format
    lazies = [m for m in model.modules() if lazy(m)]
    if not lazies:
        return model.to(memory_format=fmt)

    def convert(m: Any) -> None:
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)):
            if not is_lazy(t) and t.dim() == 4:
                t.data = t.data.contiguous(memory_format=fmt)

    for m in model.modules():
        convert(m)
    for m in lazies:
        handles: list = []

        def once(mod: Any, args: Any, h: list = handles) -> None:
            convert(mod)
            h[0].remove()

        handles.append(m.register_forward_pre_hook(once))
    return model


class CPUDevice:
    type = "cpu"

    def __init__(self, name: str = "cpu") -> None:
        self.name = name

    def torch_device(self):
        import torch

        return torch.device("cpu")

    def prepare(self, config, *, memory_cap_mb: float | None = None) -> None:
        """Process-wide settings for this device; CPU has none beyond the threads the worker sets (the host's
        memory cap is the parent's to enforce: it watches the whole process tree)."""

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

    def peak_allocated_mb(self) -> float | None:
        return None

    def release_cached_memory(self) -> None:
        """Hand what the allocator caches back to the device (CUDA); nothing to do on the CPU."""

    def to_device(self, tensor, *, non_blocking: bool = False, channels_last: bool = False):
        import torch

        if channels_last and tensor.dim() == 4:
            return tensor.contiguous(memory_format=torch.channels_last)
        return tensor


class CUDADevice(CPUDevice):
    """A CUDA device, ``cuda`` (the current device) or ``cuda:N``.

    Every call into torch.cuda names the device by its integer index (``index``): several of them reject a
    ``torch.device("cuda")`` without one (``set_device`` and ``set_per_process_memory_fraction`` raise
    ValueError, ``reset_peak_memory_stats`` resolves it to -1 without a current device), and the error comes
    after CUDA's lazy initialisation, so it never shows on a machine without a driver. tests/machine/test_device.py
    calls each operation here with the real torch and asserts it fails only for want of the driver.
    """

    type = "cuda"

    def __init__(self, name: str = "cuda") -> None:
        super().__init__(name)
        kind, _, ordinal = name.partition(":")
        if kind != "cuda" or not (ordinal == "" or ordinal.isdigit()):
            raise ConfigError(f"device={name!r} is not a CUDA device; use cuda or cuda:N")
        self._index: int | None = int(ordinal) if ordinal else None
        self.memory_cap_mb: float | None = None  # the allocator's limit once ``prepare`` set one

    @property
    def index(self) -> int:
        """The device's ordinal: N for ``cuda:N``; for ``cuda``, the current device (0 in a fresh process, or
        what a training script chose with ``torch.cuda.set_device``), read once."""
        if self._index is None:
            import torch

            self._index = torch.cuda.current_device()
        return self._index

    def torch_device(self):
        import torch

        return torch.device("cuda", self.index)

    def prepare(self, config, *, memory_cap_mb: float | None = None) -> None:
        """Make this the current device, set cudnn.benchmark from ``config``, and with ``memory_cap_mb`` limit
        PyTorch's caching allocator to it (``torch.cuda.set_per_process_memory_fraction``): an allocation past
        the cap raises torch.OutOfMemoryError inside the trial, so an over-cap config fails as ``oom`` while it
        runs, not judged afterwards from a peak that counts the allocator's cache. The CUDA context and the
        libraries' own memory lie outside the allocator and outside the cap."""
        import torch

        torch.cuda.set_device(self.index)
        # cudnn.benchmark picks the fastest conv algorithm per input shape; shapes are fixed in a trial.
        torch.backends.cudnn.benchmark = bool(config.cudnn_benchmark)
        if memory_cap_mb is not None:
            total_mb = torch.cuda.get_device_properties(self.index).total_memory / 2**20
            torch.cuda.set_per_process_memory_fraction(min(1.0, float(memory_cap_mb) / total_mb), self.index)
            self.memory_cap_mb = min(float(memory_cap_mb), total_mb)

    def grad_scaler(self, amp: str):
        import torch

        # fp16 has a narrow exponent: small gradients underflow to zero without loss scaling.
        return torch.amp.GradScaler("cuda") if amp == "fp16" else None

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)  # kernels are async: time only after they finish

    def step_timer(self) -> HostStepTimer:
        return EventStepTimer(self)

    def new_event(self):
        """A timing event on the current stream (a fake device returns its own)."""
        import torch

        return torch.cuda.Event(enable_timing=True)

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.index)

    def peak_memory_mb(self) -> float | None:
        """The most the caching allocator held from the device (its cache and cuDNN's workspaces included)."""
        import torch

        return torch.cuda.max_memory_reserved(self.index) / 2**20

    def peak_allocated_mb(self) -> float | None:
        """The most memory tensors held at once: what the config needs, the allocator's cache aside."""
        import torch

        return torch.cuda.max_memory_allocated(self.index) / 2**20

    def release_cached_memory(self) -> None:
        import gc

        import torch

        gc.collect()  # a model freed in a reference cycle holds its tensors until the collector runs
        torch.cuda.empty_cache()

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

    def resume(self) -> None:
        """The time since the last mark is neither (the trial waited for its turn, ``trial.windows.Turns``)."""
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
    uuid: str | None = None  # "GPU-8932f937-...": CUDA_VISIBLE_DEVICES may name a GPU by it
    pci_bus_id: str | None = None  # "00000000:3B:00.0": CUDA_DEVICE_ORDER=PCI_BUS_ID numbers GPUs by it
    memory_free_mb: float | None = None  # free when read: other processes and MIG slices hold the rest

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
            gpus.append(GPUInfo(i, _text(nvml.nvmlDeviceGetName(h)), mem.total / 2**20, driver, cc,
                                uuid=_optional(lambda: _text(nvml.nvmlDeviceGetUUID(h))),
                                pci_bus_id=_optional(lambda: _text(nvml.nvmlDeviceGetPciInfo(h).busId).upper()),
                                memory_free_mb=mem.free / 2**20))
        return gpus, "ok"
    except Exception as exc:  # a GPU in a bad state (Xid errors, lost device): report it, never crash `env`
        return [], f"NVML error while listing GPUs ({_text(exc) or type(exc).__name__})"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()



def _optional(read) -> str | None:
    try:
        return read() or None
    except Exception:  # NVMLError_NotSupported, or an older pynvml without the call
        return None


def cuda_device_gpus(device: str, gpus: Sequence[dict], *, visible: str | None = None,
                     order: str | None = None) -> list[dict]:
    """The GPUs (rows of ``Hardware.gpus``, as NVML lists them) that torch's ``device`` may run on: one when
    CUDA's numbering can be told, every GPU it could be when it cannot, none when there is no such device.

    CUDA numbers GPUs its own way. ``visible`` (CUDA_VISIBLE_DEVICES; None when unset) hides and reorders
    them: a comma-separated list of indices or UUIDs (``GPU-...``, a unique prefix is enough), read up to the
    first entry that names no GPU; ``cuda:N`` is the N-th GPU of that list (``cuda`` is ``cuda:0``, the
    current device of a fresh process). Indices follow ``order`` (CUDA_DEVICE_ORDER): PCI_BUS_ID numbers
    GPUs by bus id; the default, FASTEST_FIRST, is that same order only when every GPU is the same model (ties
    go by bus id), so on a mixed machine an index could be any GPU. A MIG slice (``MIG-...``) could be on any.

    >>> a100 = {"index": 0, "name": "A100", "compute_capability": "8.0", "uuid": "GPU-aa", "pci_bus_id": "1"}
    >>> t4 = {"index": 1, "name": "T4", "compute_capability": "7.5", "uuid": "GPU-bb", "pci_bus_id": "2"}
    >>> [g["name"] for g in cuda_device_gpus("cuda", [a100, t4], visible="GPU-bb")]
    ['T4']
    >>> [g["name"] for g in cuda_device_gpus("cuda:1", [a100, t4], visible="1,0", order="PCI_BUS_ID")]
    ['A100']
    >>> [g["name"] for g in cuda_device_gpus("cuda", [a100, t4], visible="1")]  # fastest first: A100 or T4
    ['A100', 'T4']
    """
    name, _, ordinal_text = device.partition(":")
    if name != "cuda" or not (ordinal_text == "" or ordinal_text.isdigit()):
        raise ConfigError(f"device={device!r} is not a CUDA device; use cuda or cuda:N")
    ordinal = int(ordinal_text or 0)
    gpus = list(gpus)
    if all(g.get("pci_bus_id") for g in gpus):  # NVML's own order carries no promise; the bus id does
        by_bus = sorted(gpus, key=lambda g: g["pci_bus_id"])
    else:
        by_bus = sorted(gpus, key=lambda g: g["index"])
    one_model = len({(g.get("name"), g.get("compute_capability")) for g in gpus}) <= 1
    cuda_order: list[dict] | None = by_bus if (order or "").strip() == "PCI_BUS_ID" or one_model else None
    # CUDA's device list: a known GPU, or None where CUDA's numbering cannot be told from NVML
    seen: list[dict | None]
    if visible is None:
        seen = list(cuda_order) if cuda_order is not None else [None] * len(gpus)
    else:
        seen = []
        for entry in (e.strip() for e in visible.split(",")):
            if entry.isdigit() and int(entry) < len(gpus):
                gpu = cuda_order[int(entry)] if cuda_order is not None else None
            elif entry.startswith("GPU-") and all(g.get("uuid") for g in gpus):
                hits = [g for g in gpus if g["uuid"].startswith(entry)]
                if len(hits) != 1:
                    break  # names no GPU (or several): CUDA stops reading the list here
                gpu = hits[0]
            elif entry.startswith(("GPU-", "MIG-")):
                gpu = None  # a UUID NVML did not give us, or a MIG slice: some GPU, we cannot tell which
            else:
                break  # "-1", "", a typo: CUDA ignores it and every entry after it
            if gpu is not None and any(g is gpu for g in seen):
                break  # a GPU listed twice: not a second device
            seen.append(gpu)
    if ordinal >= len(seen):
        return []
    return [seen[ordinal]] if seen[ordinal] is not None else gpus
