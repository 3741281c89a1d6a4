"""Whether this torch can use the GPU a trial is asked to run on, decided before any trial starts, and the
one-line reading of a GPU failure that is the workload's fault, not the config's.

The decisions read NVML's rows (``Hardware.gpus``) and a description of the torch build (``CudaBuild``), so each
branch is testable without the GPU it is about (tests/machine/test_cuda_checks.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import ConfigError

__all__ = ["MIN_DRIVER_FOR_CUDA", "CudaBuild", "cuda_problem", "check_cuda_usable", "cuda_in_forked_worker"]


# The oldest Linux driver each CUDA major release runs on (NVIDIA's minor-version compatibility: a build for
# CUDA 12.x runs on any driver from 525.60.13 on). Older drivers make torch.cuda.is_available() False.
MIN_DRIVER_FOR_CUDA = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


@dataclass(frozen=True)
class CudaBuild:
    """What this torch can run on: its version, the CUDA it was built for (None: a CPU-only build), the GPU
    architectures compiled in (``sm_75`` runs on compute 7.5; ``compute_75`` is PTX a newer GPU can JIT), and
    whether it found a usable GPU."""

    torch: str
    cuda: str | None
    arch_list: tuple[str, ...]
    available: bool

    @classmethod
    def read(cls) -> "CudaBuild":
        import torch

        try:
            arch = tuple(torch.cuda.get_arch_list())  # compiled in: known without a driver in torch >= 2.5
        except (RuntimeError, AssertionError, AttributeError):
            arch = ()
        return cls(torch.__version__, torch.version.cuda, arch, bool(torch.cuda.is_available()))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def cuda_problem(device: str, gpus: Sequence[dict], build: CudaBuild) -> str | None:
    """Why a trial on ``device`` cannot run on ``gpus`` (the GPUs it may run on, NVML's rows) with ``build``,
    in one line naming the build, the driver and the fix; None when nothing is wrong that can be told up front.

    >>> t4 = {"index": 0, "name": "Tesla T4", "compute_capability": "7.5", "driver": "470.82.01"}
    >>> cuda_problem("cuda", [t4], CudaBuild("2.14.1+cu130", "13.0", ("sm_75", "sm_90"), False))[:60]
    'Tesla T4 has NVIDIA driver 470.82.01, but torch 2.14.1+cu130'
    """
    if not gpus:
        return None
    gpu = gpus[0]
    name = gpu.get("name", "the GPU")
    if build.cuda is None:
        return (f"torch {build.torch} is a CPU-only build, so it cannot use the {name} NVML sees: install a "
                "CUDA build of torch (see pytorch.org's install selector), or use --device cpu")
    driver = str(gpu.get("driver") or "")
    need = MIN_DRIVER_FOR_CUDA.get(_version(build.cuda)[0]) if _version(build.cuda) else None
    if driver and need and _version(driver) < need:
        return (f"{name} has NVIDIA driver {driver}, but torch {build.torch} (CUDA {build.cuda}) needs driver "
                f"{'.'.join(map(str, need))} or newer: update the driver, or install a torch built for an older "
                "CUDA that this driver supports")
    cc_text = gpu.get("compute_capability")
    sms = sorted(int(a[3:]) for a in build.arch_list if a.startswith("sm_") and a[3:].isdigit())
    ptx = sorted(int(a[8:]) for a in build.arch_list if a.startswith("compute_") and a[8:].isdigit())
    if cc_text and sms:
        major, _, minor = cc_text.partition(".")
        cc = int(major) * 10 + int(minor or 0)
        runs = any(s // 10 == cc // 10 and s <= cc for s in sms) or any(p <= cc for p in ptx)
        if cc < sms[0] and not runs:
            return (f"{name} has compute capability {cc_text}, but torch {build.torch} (CUDA {build.cuda}) is "
                    f"built for {sms[0] // 10}.{sms[0] % 10} and newer ({' '.join(build.arch_list)}): install a "
                    f"torch build that lists sm_{cc} in torch.cuda.get_arch_list() (an older CUDA's), or use "
                    "--device cpu")
    if not build.available:
        return (f"torch {build.torch} (CUDA {build.cuda}) finds no usable GPU though NVML lists {name} "
                f"(driver {driver or 'unknown'}): check `nvidia-smi` and CUDA_VISIBLE_DEVICES, or use --device cpu")
    return None


def check_cuda_usable(device: str, hardware, *, amp: str | None = None, build: CudaBuild | None = None) -> None:
    """Refuse, in one line, a CUDA device this torch cannot use (``cuda_problem``), and bf16 on a GPU below
    compute 8.0 (no bf16 tensor cores: it runs, emulated, slower than fp32), before any trial starts. A no-op
    for the CPU."""
    if device == "cpu":
        return
    gpus = list(hardware.gpus_for(device))
    if not gpus:
        visible = getattr(hardware, "cuda_visible_devices", None)
        raise ConfigError(f"--device {device} names no GPU here"
                          + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
                          + "; see `autotune env`")
    problem = cuda_problem(device, gpus, build or CudaBuild.read())
    if problem:
        raise ConfigError(problem)
    if amp == "bf16" and not hardware.gpu_bf16(device):
        g = gpus[0]
        raise ConfigError(f"--amp bf16 needs compute capability 8.0 or newer; {g.get('name')} is "
                          f"{g.get('compute_capability')}: use --amp fp16")


# torch/cuda/__init__.py's _lazy_init, in a process forked after its parent initialised CUDA
_FORKED_CUDA = "Cannot re-initialize CUDA in forked subprocess"


def cuda_in_forked_worker(exc: BaseException) -> str | None:
    """The one-line workload error for a dataset (or collate_fn) that touches CUDA in a forked DataLoader
    worker, else None. DataLoader re-raises the worker's error in the trial with the worker's traceback in its
    text, so the text is read whole, not its first line."""
    if _FORKED_CUDA not in str(exc):
        return None
    return ("WorkloadError: the workload's dataset or collate_fn uses CUDA inside a DataLoader worker, which "
            "DataLoader forks after CUDA is initialised: keep the data on the CPU (autotune moves each batch to "
            "the device), or it runs only with num_workers=0")
