"""The host allocator knob: whether glibc's malloc keeps freed memory for reuse, and on what size of page, or
another allocator preloaded in its place (jemalloc, tcmalloc).

A training step allocates and frees the same large activation buffers every step. glibc serves blocks above
its mmap threshold with a fresh ``mmap`` and returns them to the kernel on ``free``, and trims the heap top
back to the kernel; the next step faults the same pages in again and the kernel zeroes each one. On this
project's VM that was 13-16% of the training process's CPU time spent in the kernel (resnet18, 128 px, batch 64,
fp32), and ~8x more minor page faults than with the settings below, which took it from 36 to 43 samples/s.

``retain`` raises the mmap threshold to glibc's maximum (32 MiB: larger blocks are still mmapped) and stops
trimming, so freed memory is reused instead of faulted in again. Its cost is memory: freed blocks stay
resident, which the runner's PSS measurement counts, so the tuner sees it against the cap. PyTorch's CPU
performance guides reach the same effect by preloading jemalloc or tcmalloc; ``retain`` needs nothing installed.

``hugepages`` is ``retain`` plus PyTorch's own switch ``THP_MEM_ALLOC_ENABLE=1``: c10's CPU allocator then aligns
blocks of 2 MiB and more to 2 MiB and asks for transparent huge pages (``madvise(MADV_HUGEPAGE)``). What ``retain``
leaves is a block over glibc's 32 MiB mmap limit that does not fit the heap top when it is asked for: mapped anew
and handed back every step (resnet18 at batch 64 and 128 px: its 64 MiB first activation, 16,384 faults a step);
with huge pages that is 32 faults (the kernel still zeroes the memory). Measured on this project's Sapphire Rapids VM
(resnet18, 128 px, batch 64, fp32; 8 fresh processes per mode, interleaved, ``benchmarks/spread.py``): glibc's defaults
125-178k page faults per step (how many depends on the process's own heap history) and 8-12% of CPU time in the kernel;
``retain`` 1.1-17k faults (mostly 16,386: the one 64 MiB block above), 0.2-1.5%; ``hugepages`` 0-120 faults,
0.1-1.1%. Both were 1.105x the defaults' throughput (median of per-round ratios), hugepages / retain 1.018
(0.98-1.04): equal within the VM's noise on that workload. Its cost is memory: huge pages are resident whole
(peak 1.73-1.91 GiB vs 1.36-1.41 GiB with ``retain``), which the tuner measures against the cap like any other.
So ``retain`` is the likely winner the tuner tries first, and ``hugepages`` a choice it measures.
PyTorch reads the switch at its first allocation, so only a new process can get it: the exported
recommendation lists it under ``environment`` for the launch script.

``jemalloc`` and ``tcmalloc`` replace glibc's malloc altogether, as PyTorch's own CPU launcher
(``torch.backends.xeon.run_cpu``) and Intel's tuning guides do: the library is preloaded (``LD_PRELOAD``), and
jemalloc gets the launcher's settings (``MALLOC_CONF``: huge allocations straight from the OS, purging in a
background thread). Offered where the library is installed (Debian: ``libjemalloc2``, ``libtcmalloc-minimal4``;
``PRELOAD_LIBS`` lists the names looked for); a preload can only be given to a new process, so
``apply_in_process`` cannot switch it on and the exported recommendation lists the variables.

Only glibc has the first settings (musl and macOS do not); elsewhere the knob is trimmed out of the search space,
``hugepages`` also where the kernel's transparent huge pages are off (``never``), and a preloaded allocator
where its library is not found.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
import sysconfig
from pathlib import Path

from autotune.config import MALLOC_MODES

__all__ = ["MALLOC_MODES", "ENV", "THP_ENV", "PRELOAD_LIBS", "JEMALLOC_CONF", "available", "thp_mode", "env_for",
           "preload_path", "install_hint", "apply_in_process"]


# The libraries a preloaded allocator is looked for as, first found wins (Debian/Ubuntu, Fedora, conda).
PRELOAD_LIBS = {"jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
                "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so",
                             "libtcmalloc.so")}
_PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}
# torch.backends.xeon.run_cpu's settings for jemalloc: huge allocations from the OS directly, purging in a
# background thread, transparent huge pages for its metadata where the kernel allows
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"

# PyTorch's c10 CPU allocator: 2 MiB alignment and MADV_HUGEPAGE for blocks >= 2 MiB (read once, at its first
# allocation, i.e. while torch is imported).
THP_ENV = "THP_MEM_ALLOC_ENABLE"
_THP_SYSFS = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# glibc reads these at the process's first malloc: the child gets them in its environment.
ENV = {
    "retain": {
        "MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),    # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
        "MALLOC_TRIM_THRESHOLD_": str(1 << 40),              # never give the heap top back
        "MALLOC_TOP_PAD_": str(512 * 1024 * 1024),           # grow the heap in large steps (address space only)
    },
}
ENV["hugepages"] = {**ENV["retain"], THP_ENV: "1"}

# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def available() -> bool:
    """True where the knob means something: Linux with glibc."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def thp_mode(path: Path = _THP_SYSFS) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise`` or ``never``), None where unknown.

    ``hugepages`` needs ``always`` or ``madvise`` (PyTorch asks with madvise).

    >>> import tempfile; f = Path(tempfile.mkdtemp()) / "enabled"; _ = f.write_text("always [madvise] never\\n")
    >>> thp_mode(f)
    'madvise'
    """
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _lib_dirs() -> list[Path]:
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    dirs = [Path(sys.prefix) / "lib", Path("/usr/lib") / multiarch, Path("/lib") / multiarch, Path("/usr/lib64"),
            Path("/usr/local/lib"), Path("/usr/lib")]
    return list(dict.fromkeys(dirs))


def preload_path(mode: str) -> str | None:
    """The library to preload for ``jemalloc`` / ``tcmalloc``, or None where it is not installed (or the mode
    preloads nothing)."""
    for name in PRELOAD_LIBS.get(mode, ()):
        for d in _lib_dirs():
            if (d / name).is_file():
                return str(d / name)
    return None


def install_hint(mode: str) -> str:
    """How to install the library of a preloaded allocator, for a message."""
    return f"apt-get install {_PACKAGES[mode]} on Debian/Ubuntu" if mode in _PACKAGES else ""


def env_for(mode: str) -> dict[str, str]:
    """Environment variables that give a new process this malloc mode (empty for ``default``). A preloaded
    allocator whose library is not installed here is named by its file name, which the loader looks for in
    the standard directories (``preload_path``: the runner refuses to run it where it is missing)."""
    if mode not in MALLOC_MODES:
        raise ValueError(f"malloc mode {mode!r}: expected one of {', '.join(MALLOC_MODES)}")
    if mode in PRELOAD_LIBS:
        env = {"LD_PRELOAD": preload_path(mode) or PRELOAD_LIBS[mode][0]}
        return {**env, "MALLOC_CONF": JEMALLOC_CONF} if mode == "jemalloc" else env
    return dict(ENV.get(mode, {}))


def apply_in_process(mode: str) -> str | None:
    """Give the running process this malloc mode through ``mallopt``. None when done; else why it was not,
    fully or at all (a short phrase for a warning).

    It stays for the life of the process: glibc cannot return to its dynamic mmap threshold once one is set.
    Blocks already allocated keep where they came from; new ones follow the new settings. The huge-page half
    of ``hugepages`` cannot be switched on in a running process (PyTorch read it at import): without
    ``THP_MEM_ALLOC_ENABLE=1`` in the environment the process started with, this applies ``retain`` and
    says so.
    """
    settings = env_for(mode)
    if not settings:
        return None
    if mode in PRELOAD_LIBS:
        preloaded = os.environ.get("LD_PRELOAD", "")
        if Path(settings["LD_PRELOAD"]).name in {Path(p).name for p in preloaded.replace(":", " ").split()}:
            return None
        return "another allocator can only be preloaded when the process starts"
    if not available():
        return "it needs glibc"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    values = {_M_MMAP_THRESHOLD: settings["MALLOC_MMAP_THRESHOLD_"],
              _M_TRIM_THRESHOLD: settings["MALLOC_TRIM_THRESHOLD_"], _M_TOP_PAD: settings["MALLOC_TOP_PAD_"]}
    ok = True
    for param, value in values.items():
        # mallopt takes an int; the "never trim" threshold saturates to INT_MAX, which glibc reads the same way
        ok &= bool(libc.mallopt(ctypes.c_int(param), ctypes.c_int(min(int(value), 2**31 - 1))))
    if not ok:
        return "glibc's mallopt refused the settings"
    if THP_ENV in settings and os.environ.get(THP_ENV) != settings[THP_ENV]:
        return f"PyTorch reads {THP_ENV} when it is imported, so only the retain half was applied"
    return None
