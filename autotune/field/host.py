"""What changed on the machine while the run trained: this process's memory with its DataLoader workers, the share
of the machine's memory free, and the cores other processes took (psutil); on an NVIDIA GPU, its SM clock, the
reasons NVML gives for holding the clock down, its memory and its temperature (``DeviceSampler``). Sampled in the
field run's own thread, never in the training step.
"""

from __future__ import annotations

import os
import time

__all__ = ["HostSampler", "DeviceSampler", "SLOWDOWNS"]

# NVML's clock-event reasons (``nvmlDeviceGetCurrentClocksEventReasons``; "throttle reasons" before NVML 12.5) that
# hold the GPU's clock below what its load asks for, and how a line names them. Not among them: idle, application
# clock settings, sync boost and the display clock, which are settings or no load rather than a slow-down.
SLOWDOWNS = (("nvmlClocksEventReasonSwPowerCap", "power cap"),
             ("nvmlClocksEventReasonHwSlowdown", "hardware slowdown"),
             ("nvmlClocksEventReasonHwThermalSlowdown", "thermal slowdown (hardware)"),
             ("nvmlClocksEventReasonSwThermalSlowdown", "thermal slowdown (driver)"),
             ("nvmlClocksEventReasonHwPowerBrakeSlowdown", "power brake"))


class HostSampler:
    """``sample()``: ``rss_mb`` (this process and its children), ``avail_share`` (of the machine's memory),
    ``others_cores`` (cores busy with other processes since the last sample: the machine's busy time less this
    process tree's CPU time, over the wall time between samples). Raises only what psutil raises."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process(os.getpid())
        self._last: tuple[float, float, float] | None = None  # wall, machine busy s, our tree's CPU s

    def _tree(self) -> list:
        try:
            return [self._me, *self._me.children(recursive=True)]
        except self._psutil.Error:
            return [self._me]

    def sample(self) -> dict:
        ps = self._psutil
        rss = ours = 0.0
        for p in self._tree():
            try:
                rss += p.memory_info().rss
                t = p.cpu_times()
                ours += t.user + t.system
            except ps.Error:  # a worker that just exited
                continue
        ct = ps.cpu_times()
        busy = sum(ct) - ct.idle - getattr(ct, "iowait", 0.0)
        now = time.monotonic()
        vm = ps.virtual_memory()
        out = {"rss_mb": round(rss / 2**20, 1), "avail_share": round(vm.available / vm.total, 4)}
        if self._last is not None and now - self._last[0] > 0.05:
            wall = now - self._last[0]
            # clamped at 0: a worker that exited took its CPU time with it
            out["others_cores"] = round(max(0.0, (busy - self._last[1]) - (ours - self._last[2])) / wall, 2)
        self._last = (now, busy, ours)
        return out


class DeviceSampler:
    """The GPU torch's CUDA device ``index`` is, read through NVML: ``sample()`` gives ``gpu_sm_mhz`` (the SM clock
    now), ``gpu_sm_max_mhz``, ``gpu_slowdown`` (the ``SLOWDOWNS`` active now, by name), ``gpu_mem_used_mb`` and
    ``gpu_mem_total_mb`` (the whole device's, other processes' too), ``gpu_temp_c``. ``of_cuda(index)`` finds the
    NVML device by the UUID torch reports (its PCI address where NVML knows no such UUID: a MIG slice); it reads
    the device's properties and never initialises CUDA. Raises only what torch and pynvml raise."""

    def __init__(self, nvml, handle) -> None:
        self._nvml, self._h = nvml, handle
        self._reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                         or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        self._max_sm = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)

    @classmethod
    def of_cuda(cls, index: int) -> DeviceSampler:
        import pynvml
        import torch

        props = torch.cuda.get_device_properties(index)
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{props.uuid}")
        except pynvml.NVMLError:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(
                f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0")
        return cls(pynvml, handle)

    def sample(self) -> dict:
        n, h = self._nvml, self._h
        mem = n.nvmlDeviceGetMemoryInfo(h)
        mask = self._reasons(h)
        return {"gpu_sm_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), "gpu_sm_max_mhz": self._max_sm,
                "gpu_slowdown": [name for attr, name in SLOWDOWNS if mask & getattr(n, attr, 0)],
                "gpu_mem_used_mb": round(mem.used / 2**20, 1), "gpu_mem_total_mb": round(mem.total / 2**20, 1),
                "gpu_temp_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)}
