"""What this machine is: CPU, usable cores, memory, GPUs, software versions, and a stable fingerprint.

Usable cores and memory honour what the process may really use (sched affinity, cgroup v1/v2 quotas), not what
the host has: a container with a 2-core quota on a 64-core host tunes for 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from autotune.machine.device import cuda_device_gpus, nvml_gpus
from autotune.machine.loader_memory import detect_limits
from autotune.machine.malloc import thp_mode
from autotune.machine.versions import package_version, torch_build

__all__ = ["Hardware", "detect", "cgroup_cpu_quota", "cgroup_memory_limit_mb", "torch_facts", "remember_torch_facts",
           "loader_limits_now"]

# torch_facts() as a child of this process answered them (the check child): detect() then need not import torch
_TORCH_FACTS: dict[str, str | None] = {}

# CPU flags that change which kernels torch can use for the knobs we tune.
PERF_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
              "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cgroup_cpu_quota(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPU quota in cores from cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``; None when unlimited."""
    root = Path(root)
    v2 = _read(root / "cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    q, p = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if q and p and int(q) > 0:
        return int(q) / int(p)
    return None


def cgroup_memory_limit_mb(root: str | Path = "/sys/fs/cgroup") -> tuple[float | None, float | None]:
    """(limit, current usage) in MiB from cgroup v2 ``memory.max`` or v1; None where unlimited/unknown."""
    root = Path(root)
    v2 = _read(root / "memory.max")
    if v2 is not None:
        cur = _read(root / "memory.current")
        limit = None if v2 == "max" else int(v2) / 2**20
        return limit, (int(cur) / 2**20 if cur else None)
    v1 = _read(root / "memory" / "memory.limit_in_bytes")
    if v1 is not None:
        cur = _read(root / "memory" / "memory.usage_in_bytes")
        limit = int(v1) / 2**20
        if limit > 2**40:  # v1 writes a huge number for "unlimited"
            limit = None
        return limit, (int(cur) / 2**20 if cur else None)
    return None, None


def _cgroup_dirs(base: str | Path = "/sys/fs/cgroup") -> list[Path]:
    """This process's cgroup v2 folder and its ancestors up to ``base`` (limits may be set at any level;
    without a cgroup namespace, e.g. a systemd slice, our folder is not ``base`` itself)."""
    base = Path(base)
    dirs = [base]
    text = _read("/proc/self/cgroup") or ""
    for line in text.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip().lstrip("/")
            d = base / rel if rel else base
            while d != base and base in d.parents:
                dirs.insert(0, d)
                d = d.parent
    return dirs


def _cpuinfo() -> tuple[str, list[str]]:
    model, flags = platform.processor() or platform.machine(), []
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = value.split()
    return model, flags


@dataclass(frozen=True)
class Hardware:
    """A snapshot of the machine as it matters for performance. ``fingerprint`` ignores software versions
    so a torch upgrade finds the old study (and is warned about); it changes when the hardware does."""

    cpu_model: str
    cpu_flags: tuple[str, ...]
    logical_cores: int
    physical_cores: int | None
    usable_cores: int
    affinity_cores: int
    cgroup_cpu_quota: float | None
    ram_total_mb: float
    ram_available_mb: float
    cgroup_memory_limit_mb: float | None
    gpus: tuple[dict, ...]
    gpu_status: str
    os: str
    python: str
    torch: str | None
    torchvision: str | None
    cuda: str | None
    cudnn: str | None
    torch_cpu_capability: str | None
    compiler: str | None
    libc: str | None = None  # "glibc 2.36": the malloc knob needs glibc
    # transparent huge pages: always / madvise / never (malloc=hugepages needs one of the first two)
    thp: str | None = None
    # How CUDA numbers the GPUs for this process and the trials it starts (they inherit the environment); None
    # when unset. Kept with the snapshot so a Ray node's Hardware answers for that node's worker, not ours.
    cuda_visible_devices: str | None = None
    cuda_device_order: str | None = None
    # Python.h, which inductor's CPU kernels and Triton's GPU launcher are compiled against; None: not checked
    python_headers: bool | None = None
    # what a DataLoader may hold in flight here: /dev/shm, the open-file and locked-memory limits, torch's sharing
    # strategy (``machine.loader_memory.LoaderLimits.to_dict``); None in a snapshot from before they were read
    loader_memory: dict | None = None
    extra: dict = field(default_factory=dict)

    @property
    def cpu_has_bf16(self) -> bool:
        """The CPU computes bf16 natively (AVX512-BF16, AMX or Arm's BF16): bf16 autocast is worth trying."""
        return any(f in self.cpu_flags for f in ("avx512_bf16", "amx_bf16", "bf16"))

    @property
    def cpu_kind(self) -> str:
        """Which kind of CPU this is for what wins on it (``search_spaces/likely.yaml``): ``amx`` (AMX-BF16),
        ``avx512_bf16``, ``avx2``, ``arm`` (Arm's SIMD) or ``other``. What won on one kind lost on another
        (bf16 on a Xeon with AMX and on an EPYC with AVX-512 bf16), so the kind is detected, never assumed."""
        flags = set(self.cpu_flags)
        for kind, flag in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx2", "avx2"), ("arm", "asimd")):
            if flag in flags:
                return kind
        return "other"

    def gpus_for(self, device: str = "cuda") -> tuple[dict, ...]:
        """The GPU a trial on ``device`` (``cuda``, ``cuda:N``) runs on, after CUDA_VISIBLE_DEVICES and
        CUDA_DEVICE_ORDER renumbered them: one, or every GPU it could be when NVML cannot tell, or none when
        there is no such device (``autotune.machine.device.cuda_device_gpus``)."""
        return tuple(cuda_device_gpus(device, self.gpus, visible=self.cuda_visible_devices,
                                      order=self.cuda_device_order))

    def gpu_bf16(self, device: str = "cuda") -> bool:
        """The GPU ``device`` runs on has compute capability >= 8.0 (Ampere or newer), where bf16 runs on
        tensor cores. Where that GPU cannot be told, every GPU it could be must have it."""
        gpus = self.gpus_for(device)
        return bool(gpus) and all(int((g.get("compute_capability") or "0").split(".")[0]) >= 8 for g in gpus)

    @property
    def gpu_has_bf16(self) -> bool:
        """The GPU a plain ``cuda`` device runs on has native bf16 (see ``gpu_bf16``)."""
        return self.gpu_bf16("cuda")

    @property
    def has_bf16(self) -> bool:
        return self.cpu_has_bf16 or self.gpu_has_bf16

    @property
    def can_compile(self) -> bool:
        """torch.compile needs a C++ compiler and Python's headers (inductor's CPU kernels, and Triton's launcher
        on a GPU, are built against Python.h; a slim image or a python without its -dev package lacks them):
        without either, every compiled trial would fail."""
        return self.compiler is not None and self.python_headers is not False

    def visible_gpus(self) -> tuple[dict, ...]:
        """The GPUs this process and its trials may use: all that NVML lists, less those CUDA_VISIBLE_DEVICES
        hides (when it names them in a way NVML can match; otherwise all, as CUDA's order cannot be told)."""
        if self.cuda_visible_devices is None:
            return self.gpus
        seen: list[dict] = []
        for i in range(len(self.gpus)):
            for g in self.gpus_for(f"cuda:{i}"):
                if not any(g is s for s in seen):
                    seen.append(g)
        return tuple(sorted(seen, key=lambda g: g["index"]))

    @property
    def loader_limits(self):
        """``LoaderLimits`` read with this snapshot (``machine.loader_memory``), or None where they were not read."""
        from autotune.machine.loader_memory import LoaderLimits

        return LoaderLimits.from_dict(self.loader_memory)

    @property
    def fingerprint(self) -> str:
        key = {
            "cpu": self.cpu_model,
            "flags": sorted(f for f in self.cpu_flags if f in PERF_FLAGS),
            "usable_cores": self.usable_cores,
            "ram_gib": round(self.ram_total_mb / 1024),
            "gpus": sorted((g["name"], round(g["memory_total_mb"] / 1024)) for g in self.visible_gpus()),
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu_flags"] = list(self.cpu_flags)
        d["gpus"] = list(self.gpus)
        d["fingerprint"] = self.fingerprint
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Hardware":
        """Back from ``to_dict`` (another machine's, e.g. a Ray node's): derived and unknown keys are dropped."""
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        d["cpu_flags"] = tuple(d.get("cpu_flags") or ())
        d["gpus"] = tuple(d.get("gpus") or ())
        return cls(**d)

    def summary_line(self) -> str:
        gpu = ", ".join(g["name"] for g in self.gpus) or "no GPU"
        return (f"{self.cpu_model} ({self.usable_cores} usable cores), "
                f"{self.ram_total_mb / 1024:.0f} GiB RAM, {gpu}, torch {self.torch}")

    def describe(self) -> str:
        """The block `autotune env` prints: everything a bug report needs."""
        from autotune._units import format_mb

        flags = [f for f in PERF_FLAGS if f in self.cpu_flags]
        quota = "none" if self.cgroup_cpu_quota is None else f"{self.cgroup_cpu_quota:g} cores"
        mem_limit = "none" if self.cgroup_memory_limit_mb is None else format_mb(self.cgroup_memory_limit_mb)
        rows = [
            ("fingerprint", self.fingerprint),
            ("cpu", self.cpu_model),
            ("cpu flags", " ".join(flags) or "-"),
            ("cores", f"{self.usable_cores} usable ({self.logical_cores} logical, "
                      f"{self.physical_cores or '?'} physical, affinity {self.affinity_cores}, cgroup quota {quota})"),
            ("memory", f"{format_mb(self.ram_total_mb)} total, {format_mb(self.ram_available_mb)} available "
                       f"(cgroup limit {mem_limit})"),
        ]
        if self.gpus:
            for g in self.gpus:
                rows.append((f"gpu {g['index']}", f"{g['name']}, {format_mb(g['memory_total_mb'])}, "
                                                  f"driver {g['driver']}, compute {g['compute_capability']}"))
        else:
            rows.append(("gpu", f"none ({self.gpu_status})"))
        for var, value in (("CUDA_VISIBLE_DEVICES", self.cuda_visible_devices),
                           ("CUDA_DEVICE_ORDER", self.cuda_device_order)):
            if value is not None:
                rows.append((var, value))
        if self.gpus and (self.cuda_visible_devices is not None or self.cuda_device_order is not None):
            cuda = [str(g["index"]) for g in self.gpus_for("cuda")]
            rows.append(("cuda is", "no GPU (none visible)" if not cuda else f"gpu {cuda[0]}" if len(cuda) == 1
                         else f"one of gpu {', '.join(cuda)} (CUDA_DEVICE_ORDER=PCI_BUS_ID would tell which)"))
        rows += self.loader_limits.rows() if self.loader_memory else []
        rows += [
            ("os", f"{self.os}, {self.libc or 'C library unknown'}, transparent huge pages "
                   f"{self.thp or 'unknown'}"),
            ("python", self.python),
            ("torch", f"{self.torch} (cpu kernels: {self.torch_cpu_capability}, cuda {self.cuda or 'none'}, "
                      f"cudnn {self.cudnn or 'none'})"),
            ("torchvision", str(self.torchvision)),
            ("torch.compile", f"available (C++ compiler {self.compiler})" if self.can_compile
                              else "unavailable: no C++ compiler found (install g++)" if not self.compiler
                              else "unavailable: Python.h not found (install your Python's headers, e.g. python3-dev)"),
            ("bf16", "native" if self.has_bf16 else "not native (bf16 autocast is emulated and usually slower)"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def torch_facts() -> dict[str, str | None]:
    """What only an imported torch tells: the CPU kernels it dispatches to (``AVX2``, ``AVX512``...) and cuDNN's
    version where CUDA is usable. Imports torch: called in a process that has it or pays for it."""
    import torch

    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        cap = None
    cudnn = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None
    return {"cpu_capability": cap, "cudnn": cudnn, "sharing_strategy": torch.multiprocessing.get_sharing_strategy()}


def remember_torch_facts(facts: dict | None) -> None:
    """Keep ``torch_facts()`` as a child of this process (same interpreter, same environment) answered them, so
    that ``detect()`` here reads them instead of importing torch (3-9 s of CPU on a 2-core machine)."""
    if facts and "cpu_capability" in facts:
        _TORCH_FACTS.update(cpu_capability=facts.get("cpu_capability"), cudnn=facts.get("cudnn"),
                            sharing_strategy=facts.get("sharing_strategy"))


def detect(*, with_torch: bool = True, nvml: Any = None) -> Hardware:
    """Detect this machine. ``with_torch=False`` skips torch (versions then read None). With it, torch's and
    torchvision's versions are read from their ``version.py`` (``versions.py``), and the CPU kernels and cuDNN from
    ``torch_facts()``: the torch this process imported, what a child answered (``remember_torch_facts``), or an
    import of torch here.

    >>> hw = detect(with_torch=False)
    >>> hw.usable_cores >= 1
    True
    """
    import psutil

    model, flags = _cpuinfo()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False)
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = logical
    quotas = [q for q in (cgroup_cpu_quota(d) for d in _cgroup_dirs()) if q is not None]
    quota = min(quotas) if quotas else None
    usable = affinity if quota is None else max(1, min(affinity, math.floor(quota + 1e-9) or 1))
    vm = psutil.virtual_memory()
    limit_mb = current_mb = None
    for d in _cgroup_dirs():  # the tightest limit on the way up, with its own usage
        lim, cur = cgroup_memory_limit_mb(d)
        if lim is not None and (limit_mb is None or lim < limit_mb):
            limit_mb, current_mb = lim, cur
    total_mb = vm.total / 2**20
    avail_mb = vm.available / 2**20
    if limit_mb is not None:
        total_mb = min(total_mb, limit_mb)
        if current_mb is not None:
            avail_mb = min(avail_mb, max(0.0, limit_mb - current_mb))
    gpus, gpu_status = nvml_gpus(nvml)

    torch_v = tv_v = cuda_v = cudnn_v = cap = strategy = None
    if with_torch:
        build = torch_build()
        if build is None:  # a version.py of another shape: the import tells
            import torch

            build = (str(torch.__version__), torch.version.cuda)
        torch_v, cuda_v = build
        facts = _TORCH_FACTS if _TORCH_FACTS and "torch" not in sys.modules else torch_facts()
        cap, cudnn_v, strategy = facts["cpu_capability"], facts["cudnn"], facts.get("sharing_strategy")
        tv_v = package_version("torchvision")  # read, not imported: importing it costs seconds (versions.py)
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")
    return Hardware(
        cpu_model=model, cpu_flags=tuple(flags), logical_cores=logical, physical_cores=physical,
        usable_cores=usable, affinity_cores=affinity, cgroup_cpu_quota=quota,
        ram_total_mb=total_mb, ram_available_mb=avail_mb, cgroup_memory_limit_mb=limit_mb,
        gpus=tuple(g.to_dict() for g in gpus), gpu_status=gpu_status,
        os=f"{platform.system()} {platform.release()}", python=platform.python_version(),
        torch=torch_v, torchvision=tv_v, cuda=cuda_v, cudnn=cudnn_v, torch_cpu_capability=cap,
        compiler=compiler, libc=" ".join(platform.libc_ver()).strip() or None, thp=thp_mode(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=os.environ.get("CUDA_DEVICE_ORDER"),
        python_headers=python_headers(),
        loader_memory=detect_limits(ram_available_bytes=int(avail_mb * 2**20), sharing_strategy=strategy).to_dict(),
    )


def loader_limits_now():
    """This machine's loader limits (``machine.loader_memory.LoaderLimits``) as a training process meets them now:
    the memory available (cgroup aware) and, where this process imported torch, the sharing strategy it set."""
    hw = detect(with_torch=False)
    strategy = None
    if "torch" in sys.modules:
        import torch

        strategy = torch.multiprocessing.get_sharing_strategy()
    return detect_limits(ram_available_bytes=int(hw.ram_available_mb * 2**20), sharing_strategy=strategy)


def python_headers() -> bool:
    """This Python's C headers are installed (``Python.h`` in sysconfig's include directory)."""
    import sysconfig

    include = sysconfig.get_paths().get("include")
    return bool(include) and os.path.isfile(os.path.join(include, "Python.h"))
