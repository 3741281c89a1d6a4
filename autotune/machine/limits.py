"""Memory limits: the default cap and the checks that refuse a cap this machine cannot honour."""

from __future__ import annotations

from autotune._units import format_mb
from autotune.errors import ConfigError

__all__ = ["MIN_MEMORY_CAP_MB", "MIN_CUDA_MEMORY_CAP_MB", "min_memory_cap_mb", "DEFAULT_CAP_SHARE",
           "default_memory_cap_mb", "check_min_cap", "check_cap_against_machine", "MIN_DEVICE_MEMORY_CAP_MB",
           "default_device_memory_cap_mb", "check_device_cap", "with_default_caps"]

# A child that imports torch (CUDA build) and builds a small model already holds ~0.8 GiB: a lower cap would
# kill every trial before it measures anything.
MIN_MEMORY_CAP_MB = 1024.0
# A trial on a GPU holds more host memory before its first step: the CUDA context's host side (driver state,
# the caching host allocator for pinned batches) and the file-backed pages of the CUDA libraries it touches
# (libtorch_cuda, cuBLAS(Lt), cuDNN: hundreds of MiB each), which the memory watch charges to the trial's main
# process in full, as when it runs alone (memwatch.MemoryWatch). An estimate, not yet measured here (no GPU):
# tests/machine/test_gpu.py::test_a_cuda_trial_fits_the_minimum_host_cap checks it wherever a GPU is (docs/gpu.md).
MIN_CUDA_MEMORY_CAP_MB = 3072.0
# Without a cap from the user, trials may use this share of the memory available when the run starts: the
# rest is the safety margin that keeps the kernel's OOM killer away from the tuner and the desktop.
DEFAULT_CAP_SHARE = 0.85


def _hw(hardware):
    if hardware is None:
        from autotune.machine.hardware import detect

        hardware = detect(with_torch=False)
    return hardware


def default_memory_cap_mb(hardware=None) -> float:
    hw = _hw(hardware)
    return max(MIN_MEMORY_CAP_MB, round(hw.ram_available_mb * DEFAULT_CAP_SHARE))


def with_default_caps(measure, hardware, device: str):
    """``measure`` (a ``MeasureSpec``) with the caps it leaves unset filled in for ``hardware``: the host memory cap
    (``default_memory_cap_mb``) and, off the CPU, the device memory cap (``default_device_memory_cap_mb``)."""
    if measure.memory_cap_mb is None:
        measure = measure.replace(memory_cap_mb=default_memory_cap_mb(hardware))
    if measure.device_memory_cap_mb is None and device != "cpu":
        measure = measure.replace(device_memory_cap_mb=default_device_memory_cap_mb(hardware, device))
    return measure


def min_memory_cap_mb(device: str = "cpu") -> float:
    """The least host memory cap a trial on ``device`` can start under."""
    return MIN_MEMORY_CAP_MB if device == "cpu" else MIN_CUDA_MEMORY_CAP_MB


def check_min_cap(cap_mb: float | None, device: str = "cpu") -> None:
    """Refuse a cap below what a trial on ``device`` needs to start (None: no cap)."""
    least = min_memory_cap_mb(device)
    if cap_mb is not None and cap_mb < least:
        what = "Python and torch" if device == "cpu" else "Python, torch and the CUDA context"
        raise ConfigError(f"memory cap {format_mb(cap_mb)} is below the {format_mb(least)} a trial on {device} "
                          f"needs just to start {what}; give at least {least / 1024:g}GiB")


def check_cap_against_machine(cap_mb: float | None, hardware=None, device: str = "cpu") -> None:
    """Refuse a cap below what a trial needs to start, or above the memory this process may use."""
    if cap_mb is None:
        return
    check_min_cap(cap_mb, device)
    hw = _hw(hardware)
    if cap_mb > hw.ram_total_mb:
        raise ConfigError(
            f"memory cap {format_mb(cap_mb)} is larger than this machine's {format_mb(hw.ram_total_mb)}; "
            f"give at most {format_mb(hw.ram_available_mb * DEFAULT_CAP_SHARE)} (85% of what is available now)"
        )


# What a CUDA context (the driver, cuBLAS and cuDNN handles and their workspaces) holds on the device outside
# PyTorch's caching allocator: 300-600 MiB on current drivers. The default device memory cap leaves it free.
CUDA_CONTEXT_MB = 512.0

# Below this a CUDA trial cannot hold even a small model, its optimizer state and cuDNN's smallest workspace.
MIN_DEVICE_MEMORY_CAP_MB = 256.0


def default_device_memory_cap_mb(hardware, device: str) -> float | None:
    """The device memory cap when the user gives none: the free memory of the GPU ``device`` runs on, as NVML
    reads it now (other processes and MIG slices hold the rest), less what the CUDA context takes outside
    PyTorch's allocator. The smallest GPU's where CUDA's numbering cannot tell which; None on the CPU or when
    no GPU is known."""
    if device == "cpu":
        return None
    gpus = hardware.gpus_for(device)
    if not gpus:
        return None
    free = min(g.get("memory_free_mb") or g["memory_total_mb"] for g in gpus)
    return max(MIN_DEVICE_MEMORY_CAP_MB, round(free - CUDA_CONTEXT_MB))


def check_device_cap(cap_mb: float | None, hardware, device: str) -> None:
    """Refuse a device memory cap off a GPU, below what a trial needs, or above the GPU's memory."""
    if cap_mb is None:
        return
    if device == "cpu":
        raise ConfigError("--device-memory-cap applies to a GPU; on the CPU use --memory-cap")
    if cap_mb < MIN_DEVICE_MEMORY_CAP_MB:
        raise ConfigError(f"device memory cap {format_mb(cap_mb)} is below the {format_mb(MIN_DEVICE_MEMORY_CAP_MB)} "
                          "a GPU trial needs; give at least 256MiB")
    gpus = hardware.gpus_for(device)
    total = min((g["memory_total_mb"] for g in gpus), default=None)
    if total is not None and cap_mb > total:
        raise ConfigError(f"device memory cap {format_mb(cap_mb)} is larger than the {format_mb(total)} of the GPU "
                          f"{device} runs on; give at most {format_mb(total)}")
