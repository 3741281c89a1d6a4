"""What a DataLoader may hold in flight on this machine, and the one rule that says whether a loader fits it.

A DataLoader with workers hands every batch to the training process through shared memory: a worker collates its
batch straight into a shared segment (``default_collate`` allocates it there), and the training process maps it.
Both of torch's sharing strategies keep those segments in ``/dev/shm``: ``file_descriptor`` (Linux's default)
unlinks each one at once and passes an open descriptor, one per shared tensor; ``file_system`` keeps it named. So
the size of ``/dev/shm`` binds either way (measured: under a 64 MiB ``/dev/shm`` the same loader dies with either
strategy), and the open-file limit binds ``file_descriptor`` only.

**In flight.** The loader keeps ``num_workers x prefetch_factor`` batches requested; the loop holds one more (or the
pin thread copies it). While the loop waits for data, about one batch is in shared memory at a time, which is all a
trial sees; while the loop pauses (a checkpoint, an evaluation), the workers fill the queue. Measured with
``benchmarks/paused_loader.py`` (2 workers, prefetch 2, 36.75 MiB batches): /dev/shm peaked at 183.8 MiB, 5 batches,
``in_flight_batches(2, 2)``. With N ranks on one host each rank's loader holds as much, in the one ``/dev/shm``.

**Pinned pages.** With ``pin_memory`` the pin thread copies each batch into page-locked host memory: up to as many
batches again, which the kernel cannot swap. CUDA's host allocator (``CachingHostAllocator``) rounds each block up
to a power of two and keeps it cached after use, so a batch's tensors pin up to twice their bytes and the pool stays
at its peak (``pinned_bytes`` counts that bound). They are charged to host RAM (a share of what is available,
``LOADER_RAM_SHARE``). The locked-memory limit (``RLIMIT_MEMLOCK``, 64 KiB to 8 MiB in containers) is read and
shown but not applied: CUDA's pinned allocations (``cudaHostAlloc``, what ``pin_memory`` uses) are pinned by the
NVIDIA driver, which by every report we found does not charge them to it (containers with the default limit pin
gigabytes); what does charge it is RDMA's memory registration (InfiniBand, NCCL's GPUDirect), hence ``--ulimit
memlock=-1`` for several nodes. Not yet checked on a GPU here:
``tests/machine/test_gpu.py::test_pinned_memory_is_not_charged_to_the_locked_memory_limit`` does, where one is,
and ``test_pinned_batches_stay_within_the_counted_bound`` measures the rounding and the cache.

**Outside the rule: NCCL's shared memory.** DDP ranks on one host without a direct GPU path (P2P off, or
containers that cannot see each other's GPUs) move tensors through NCCL's shared-memory transport, segments in
``/dev/shm`` whose size NCCL decides (its buffer size, channels and peers), not the loader. They are not counted
here: ``MARGIN`` is all that is left for them, and on a 64 MB ``/dev/shm`` that is too little; NCCL's own error
(``failed to extend /dev/shm/nccl-...``) names the size it wanted. ``tests/machine/test_gpu.py::
test_nccl_shared_memory_of_two_ranks_is_measured`` measures it where two GPUs are (``docs/loader-memory.md``).

The rule is pure arithmetic on numbers (``in_flight_bytes``, ``pinned_bytes``, ``LoaderLimits.problems``,
``LoaderLimits.largest``); ``detect_limits`` reads the machine. Every figure here is per host: a loader's batch
bytes come from the workload (``autotune.workloads.probe.batch_footprint``), the probe's worst case or measured.

>>> batch = 64 * 3 * 224 * 224 * 4                     # a batch of 64 crops at 224 px: 38.5 MB
>>> in_flight_batches(2, 2), in_flight_bytes(batch, 2, 2) / 1e6
(5, 192.67584)
>>> small = LoaderLimits(shm_free_bytes=64 * 2**20)   # a default container's /dev/shm
>>> bool(small.problems(batch, 2, 2, 2)), small.largest(batch // 2, 2, 2, 2)  # batch 32: prefetch 1 first
(True, (2, 1))
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable

__all__ = ["SHM_PATH", "MARGIN", "FD_RESERVE", "LOADER_RAM_SHARE", "DEFAULT_PREFETCH", "PINNED_ROUNDING",
           "in_flight_batches", "in_flight_bytes", "pinned_bytes", "LoaderLimits", "detect_limits", "failure_kind",
           "shm_size_flag", "format_bytes", "check_loader", "LOADER_TIMEOUT_S"]

SHM_PATH = "/dev/shm"
# The share of the free shared memory a loader leaves to everything else there: other processes' segments, NCCL's
# shared-memory transport between ranks, a batch larger than the first (variable lengths).
MARGIN = 0.10
# Descriptors a training process holds besides its loader's (libraries, sockets, logs, the dataset's files).
FD_RESERVE = 256
# The most of the host memory available that a loader's pinned batches in flight may take: the rest is the model's,
# the optimizer's and the page cache's (pinned pages cannot be swapped or reclaimed).
LOADER_RAM_SHARE = 0.25
DEFAULT_PREFETCH = 2  # torch's prefetch_factor with workers, when none is given
# The DataLoader ``timeout`` (seconds to wait for one batch) that ``Recommendation.dataloader_kwargs`` gives a loader
# with workers: a worker whose queue could not move a batch into /dev/shm prints the error and drops the batch, and
# without a timeout the loop waits for it for ever (issue 52). No batch the trials measured came near it; a loop that
# waits this long ends with torch's "DataLoader timed out after 300 seconds" and the worker's error above it.
LOADER_TIMEOUT_S = 300
# CUDA's host allocator rounds each pinned block up to a power of two (``PowerOf2Ceil`` in ATen's
# CachingHostAllocator) and caches it: a tensor of n bytes pins less than 2n, so a batch is counted at twice its bytes
PINNED_ROUNDING = 2.0


def in_flight_batches(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches a loader holds in shared memory at most: ``num_workers x prefetch_factor`` requested, plus the one
    the loop holds or the pin thread copies; 0 without workers (the training process loads, nothing is shared)."""
    if num_workers <= 0:
        return 0
    return num_workers * (prefetch_factor or DEFAULT_PREFETCH) + 1


def in_flight_bytes(batch_bytes: float, num_workers: int, prefetch_factor: int | None, ranks: int = 1) -> int:
    """Bytes a loader (one per rank, ``ranks`` on the host) holds in shared memory at most, for batches of
    ``batch_bytes``."""
    return int(math.ceil(batch_bytes * in_flight_batches(num_workers, prefetch_factor) * max(1, ranks)))


def pinned_bytes(batch_bytes: float, num_workers: int, prefetch_factor: int | None, ranks: int = 1) -> int:
    """Page-locked host bytes a ``pin_memory`` loader holds at most: its batches in flight (at least the one in hand,
    without workers), each block rounded up to a power of two by CUDA's host allocator (``PINNED_ROUNDING``, the
    bound) and kept in its cache at the peak."""
    batches = max(1, in_flight_batches(num_workers, prefetch_factor))
    return int(math.ceil(batch_bytes * PINNED_ROUNDING * batches * max(1, ranks)))


def format_bytes(n: float | None) -> str:
    """``38.5 MB``-style figures in MiB/GiB, as the rest of autotune writes memory."""
    if n is None:
        return "-"
    mib = n / 2**20
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.1f} MiB" if mib < 100 else f"{mib:.0f} MiB"


def shm_size_flag(need_bytes: float, margin: float = MARGIN) -> str:
    """The ``docker run`` flag that gives a container the shared memory to hold ``need_bytes`` with the margin:
    whole GiB (``--shm-size=2g``), at least 1."""
    return f"--shm-size={max(1, math.ceil(need_bytes / (1 - margin) / 2**30))}g"


@dataclass(frozen=True)
class LoaderLimits:
    """What this machine lets a DataLoader hold: the shared memory (``/dev/shm``'s size and free space, statvfs),
    the host memory available (cgroup aware: tmpfs pages are charged to the container's memory), the open-file and
    locked-memory limits (soft, hard; None: unlimited or unknown) and torch's sharing strategy (None: not read)."""

    shm_path: str = SHM_PATH
    shm_total_bytes: int | None = None
    shm_free_bytes: int | None = None
    ram_available_bytes: int | None = None
    nofile_soft: int | None = None
    nofile_hard: int | None = None
    memlock_soft: int | None = None
    memlock_hard: int | None = None
    sharing_strategy: str | None = None

    @property
    def shm_budget_bytes(self) -> float | None:
        """Shared memory a loader may fill: the free space of /dev/shm, or the memory available where that is less,
        less the margin; None where neither is known."""
        known = [b for b in (self.shm_free_bytes, self.ram_available_bytes) if b is not None]
        return min(known) * (1 - MARGIN) if known else None

    @property
    def shm_binding(self) -> str:
        """What bounds the shared memory: ``/dev/shm`` or the memory available (a container's limit)."""
        if self.shm_free_bytes is not None and self.ram_available_bytes is not None \
                and self.ram_available_bytes < self.shm_free_bytes:
            return "the memory available"
        return self.shm_path

    @property
    def fd_budget(self) -> int | None:
        """Descriptors a loader's shared tensors may hold (``file_descriptor`` strategy): the soft open-file limit
        less ``FD_RESERVE``; None when unlimited, unknown, or the strategy holds none."""
        if self.nofile_soft is None or self.sharing_strategy == "file_system":
            return None
        return max(0, self.nofile_soft - FD_RESERVE)

    @property
    def pinned_budget_bytes(self) -> float | None:
        return None if self.ram_available_bytes is None else self.ram_available_bytes * LOADER_RAM_SHARE

    def overruns(self, batch_bytes: float, tensors: int, num_workers: int, prefetch_factor: int | None, *,
                 pin_memory: bool = False, ranks: int = 1) -> list[tuple[str, str]]:
        """What a loader would overrun here, as ``(problem, fix)`` phrases, one pair per limit (empty: it fits):
        shared memory, descriptors, pinned host memory. The fixes are named, never applied."""
        out = []
        need = in_flight_bytes(batch_bytes, num_workers, prefetch_factor, ranks)
        budget = self.shm_budget_bytes
        if need and budget is not None and need > budget:
            flag = shm_size_flag(need)
            fix = (f"a /dev/shm of {flag.split('=')[1][:-1]} GiB (docker run {flag})"
                   if self.shm_binding == self.shm_path else "more memory for the container (docker run --memory)")
            out.append((f"needs ~{format_bytes(need)} of shared memory in flight, over the {format_bytes(budget)} "
                        f"{self.shm_binding} leaves ({format_bytes(self.shm_free_bytes)} free, less {MARGIN:.0%})",
                        fix))
        fds = in_flight_batches(num_workers, prefetch_factor) * max(1, tensors)
        if num_workers and self.fd_budget is not None and fds > self.fd_budget:
            out.append((f"holds ~{fds} open descriptors (one per shared tensor), over the open-file limit "
                        f"{self.nofile_soft} less {FD_RESERVE}",
                        f"an open-file limit of {fds + FD_RESERVE} (ulimit -n {fds + FD_RESERVE}) or "
                        "torch.multiprocessing.set_sharing_strategy(\"file_system\")"))
        pinned = pinned_bytes(batch_bytes, num_workers, prefetch_factor, ranks)
        if pin_memory and self.pinned_budget_bytes is not None and pinned > self.pinned_budget_bytes:
            out.append((f"pins up to ~{format_bytes(pinned)} of host memory in flight (blocks rounded up to a power of "
                        f"two), over {LOADER_RAM_SHARE:.0%} of the {format_bytes(self.ram_available_bytes)} available",
                        "pin_memory=False, or more host memory"))
        return out

    def problems(self, batch_bytes: float, tensors: int, num_workers: int, prefetch_factor: int | None, *,
                 pin_memory: bool = False, ranks: int = 1) -> list[str]:
        """What a loader would overrun here, one phrase each (``overruns``; empty: it fits)."""
        return [p for p, _ in self.overruns(batch_bytes, tensors, num_workers, prefetch_factor, pin_memory=pin_memory,
                                            ranks=ranks)]

    def fixes(self, batch_bytes: float, tensors: int, num_workers: int, prefetch_factor: int | None, *,
              pin_memory: bool = False, ranks: int = 1) -> list[str]:
        """What would let the loader fit, one option per limit it overruns (``overruns``), never applied here."""
        return [f for _, f in self.overruns(batch_bytes, tensors, num_workers, prefetch_factor, pin_memory=pin_memory,
                                            ranks=ranks)]

    def largest(self, batch_bytes: float, tensors: int, num_workers: int, prefetch_factor: int | None, *,
                pin_memory: bool = False, ranks: int = 1) -> tuple[int, int | None]:
        """The largest loader with no ``problems``: as asked where it fits; else a smaller prefetch (down to 1,
        keeping the workers, which are the loader's speed), then fewer workers at prefetch 1, down to ``(0, None)``
        (the training process loads; nothing is shared)."""
        w, p = num_workers, prefetch_factor
        while w > 0 and self.problems(batch_bytes, tensors, w, p, pin_memory=pin_memory, ranks=ranks):
            if (p or DEFAULT_PREFETCH) > 1:
                p = (p or DEFAULT_PREFETCH) - 1
            else:
                w, p = w - 1, 1
        return (w, p) if w > 0 else (0, None)

    def rows(self) -> list[tuple[str, str]]:
        """What `autotune env` prints of them."""
        def lim(soft: int | None, hard: int | None, fmt: Callable[[int], str]) -> str:
            return (f"{'unlimited' if soft is None else fmt(soft)} "
                    f"(hard {'unlimited' if hard is None else fmt(hard)})")

        shm = ("not found" if self.shm_total_bytes is None else
               f"{self.shm_path} {format_bytes(self.shm_free_bytes)} free of {format_bytes(self.shm_total_bytes)}"
               + (" (the memory available binds first)" if self.shm_binding != self.shm_path else ""))
        strategy = self.sharing_strategy or "not read"
        return [
            ("shared memory", f"{shm}: DataLoader workers hand their batches over through it"),
            ("open files", lim(self.nofile_soft, self.nofile_hard, str)
             + f": torch's sharing strategy {strategy}"
             + (" holds one per shared tensor" if self.sharing_strategy in (None, "file_descriptor") else "")),
            ("locked memory", lim(self.memlock_soft, self.memlock_hard, format_bytes)
             + ": RDMA (InfiniBand) registers memory against it; pinned batches are held to host memory"),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> LoaderLimits | None:
        if not d:
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _limit(value: int) -> int | None:
    import resource

    return None if value == resource.RLIM_INFINITY or value < 0 else int(value)


def detect_limits(path: str = SHM_PATH, *, ram_available_bytes: int | None = None,
                  sharing_strategy: str | None = None, statvfs: Callable[[str], Any] = os.statvfs,
                  getrlimit: Callable[[int], tuple[int, int]] | None = None) -> LoaderLimits:
    """Read this machine's limits (``statvfs`` and ``getrlimit`` stand in for the real calls in tests)."""
    import resource

    getrlimit = getrlimit or resource.getrlimit
    total = free = None
    try:
        st = statvfs(path)
        total, free = int(st.f_blocks * st.f_frsize), int(st.f_bavail * st.f_frsize)
    except OSError:  # no /dev/shm (macOS, a minimal container): nothing to read, nothing assumed
        pass
    rl: dict[str, tuple[int | None, int | None]] = {}
    for name in ("RLIMIT_NOFILE", "RLIMIT_MEMLOCK"):
        try:
            soft, hard = getrlimit(getattr(resource, name))
            rl[name] = (_limit(soft), _limit(hard))
        except (AttributeError, OSError, ValueError):
            rl[name] = (None, None)
    return LoaderLimits(shm_path=path, shm_total_bytes=total, shm_free_bytes=free,
                        ram_available_bytes=ram_available_bytes, nofile_soft=rl["RLIMIT_NOFILE"][0],
                        nofile_hard=rl["RLIMIT_NOFILE"][1], memlock_soft=rl["RLIMIT_MEMLOCK"][0],
                        memlock_hard=rl["RLIMIT_MEMLOCK"][1], sharing_strategy=sharing_strategy)


# What torch says when a loader ran out of shared memory or descriptors, with where each comes from.
_SHM_TEXTS = (
    "unable to allocate shared memory(shm)",  # c10's MapAllocator, posix_fallocate on /dev/shm failed (ENOSPC)
    "unable to write to file </torch_",  # older torch: the write that grows the segment failed (ENOSPC)
    "out of shared memory",  # torch's SIGBUS hint: "It is possible that dataloader's workers are out of shared memory"
)
_FD_TEXTS = (
    "Too many open files",  # EMFILE, from shm_open or the socket that passes descriptors
    "received 0 items of ancdata",  # multiprocessing's recvfds when the receiver had no descriptor left
)


def failure_kind(exc: BaseException | str) -> str | None:
    """``"shm"`` when ``exc`` (or its text) says a loader ran out of shared memory, ``"fds"`` out of descriptors,
    else None.

    >>> failure_kind(RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_0>: No space left on "
    ...                           "device (28)"))
    'shm'
    >>> failure_kind(RuntimeError("received 0 items of ancdata")), failure_kind(RuntimeError("shape mismatch"))
    ('fds', None)
    """
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    if any(t in text for t in _SHM_TEXTS):
        return "shm"
    if any(t in text for t in _FD_TEXTS):
        return "fds"
    return None


def check_loader(batch_size: int, num_workers: int, prefetch_factor: int | None, batch: tuple[float, int] | None, *,
                 limits: LoaderLimits, pin_memory: bool = False, ranks: int = 1,
                 fit: bool = False) -> tuple[int, int | None] | None:
    """Refuse, in one line (``ConfigError``), a loader whose batches in flight overrun ``limits`` (the machine's it
    is applied on: ``hardware.loader_limits_now``); with ``fit``, return the largest loader that fits instead. None:
    it fits as it is (or its batch, ``(bytes, tensors)``, is unknown: nothing is assumed)."""
    from autotune.errors import ConfigError

    if batch is None or num_workers <= 0:
        return None
    size, tensors = batch
    over = limits.overruns(size, tensors, num_workers, prefetch_factor, pin_memory=pin_memory, ranks=ranks)
    if not over:
        return None
    w, p = limits.largest(size, tensors, num_workers, prefetch_factor, pin_memory=pin_memory, ranks=ranks)
    if fit:
        return w, p
    problems, fixes = [why for why, _ in over], [fix for _, fix in over]
    here = f"{w} worker(s) x prefetch_factor {p}" if w else "0 workers"
    raise ConfigError(
        f"the recommended loader (batch {batch_size}, {num_workers} worker(s) x prefetch_factor "
        f"{prefetch_factor or DEFAULT_PREFETCH}, {num_workers * (prefetch_factor or DEFAULT_PREFETCH) + 1} batches of "
        f"{format_bytes(size)} in flight{f' in each of {ranks} ranks' if ranks > 1 else ''}) does not fit this "
        f"machine: it {'; '.join(problems)}; give it {' or '.join(fixes)}, or take dataloader_kwargs(fit=True) for "
        f"the largest loader that fits here ({here})")
