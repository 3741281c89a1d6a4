"""One trial's DataLoader as its memory goes: the first batch's bytes, and a loader that ran out of memory named.

The trial child (``worker.run``) makes a ``LoaderWatch`` before its first batch: it reads this machine's limits as the
loader will meet them (the child's own ``/dev/shm``, open-file limit), keeps the first batch's footprint (bytes and
tensors, ``workloads.probe.batch_footprint``; any structure), and, used as a context manager around the steps, turns
a failure that ``machine.loader_memory.failure_kind`` recognises into a ``LoaderMemoryFailure``: the trial's outcome
is then ``shm`` (``TrialResult`` status), with one line that says what ran out, what the loader needed and the
workload's own message::

    DataLoader worker ran out of shared memory (/dev/shm 64.0 MiB free; this loader needs ~184 MiB in flight:
    2 worker(s) x prefetch_factor 2 + 1 batches of 36.8 MiB): RuntimeError: unable to allocate shared memory(shm) ...

The search treats it as a memory failure (infeasible, not proposed again, larger batches of it not run).

Two failures no exception carries (issue 52). Where nothing before the trial sized the batches (a ``collate_fn`` of
the workload's own, no ``length``), ``check_full_batch`` collates a full batch before the workers start and refuses
a loader that would not fit. And a worker whose queue could not move a batch into /dev/shm prints the error from its
feeder thread and drops the batch, so the child would wait for it until the time limit: the parent reads the log
for it (``LostBatchWatch``, through ``CappedLog``'s ``scan``) and ends the trial ``shm`` within seconds.
"""

from __future__ import annotations

import re
import time
from typing import Any

from autotune.machine.loader_memory import (FD_RESERVE, detect_limits, failure_kind, format_bytes, in_flight_batches,
                                            in_flight_bytes)
from autotune.workloads.probe import batch_footprint, footprint_at

__all__ = ["LoaderWatch", "LoaderMemoryFailure", "LostBatchWatch", "loader_line", "LOST_BATCH_GRACE_S"]

# How long the parent lets a trial child whose log shows a loader-memory error end on its own: a worker's failed
# collate reaches the child as an exception within milliseconds; a batch lost in a worker's queue never does
LOST_BATCH_GRACE_S = 2.0


class LoaderMemoryFailure(Exception):
    """A DataLoader ran out of shared memory or of descriptors: ``trial_kind`` "shm" makes it the trial's status
    (``worker.main``, ``ddp``), its text the trial's one-line reason."""

    trial_kind = "shm"


class LoaderWatch:
    """The trial's loader (``config``: its workers, prefetch and batch; ``ranks``: loaders on this host at once)."""

    def __init__(self, config: Any, data: dict | None, *, ranks: int = 1, built: Any = None) -> None:
        self.config, self.ranks, self.built = config, ranks, built
        self.limits = detect_limits()  # before the loader fills it: what was free for it
        self.estimate = footprint_at(data, config.batch_size)  # the probe's, until a batch is seen
        self.estimate_first = self.estimate  # the probe's, kept when a full batch replaces it (check_full_batch)
        self.probed = (data or {}).get("items")
        self.first: tuple[int, int] | None = None

    def _batch(self) -> tuple[float, int] | None:
        """The first batch's footprint, else the probe's estimate; a workload run unchecked (the Python API) is probed
        now, on its first items (``workloads.probe``), so that the message can say what the loader needed."""
        if self.first or self.estimate or self.built is None:
            return self.first or self.estimate
        from autotune.workloads.probe import probe

        try:
            return footprint_at(probe(self.built), self.config.batch_size)
        except Exception:  # noqa: BLE001 - the message can do without it; the failure must not be masked
            return None

    def seen(self, batch: Any) -> None:
        """Keep the footprint of the first batch (later ones cost nothing)."""
        if self.first is None:
            self.first = batch_footprint(batch)

    def figures(self) -> dict[str, int | None]:
        """``batch_bytes`` and ``batch_tensors`` of the first batch (None before one was seen)."""
        return {"batch_bytes": self.first[0] if self.first else None,
                "batch_tensors": self.first[1] if self.first else None}

    def __enter__(self) -> LoaderWatch:
        return self

    def __exit__(self, et, exc, tb) -> None:
        kind = failure_kind(exc) if isinstance(exc, Exception) and not isinstance(exc, LoaderMemoryFailure) else None
        if kind is not None:
            raise LoaderMemoryFailure(self.message(kind, exc)) from exc

    def message(self, kind: str, exc: BaseException) -> str:
        """The one line: what ran out, the limit, what this loader holds in flight, the workload's own message."""
        size, tensors = self._batch() or (None, None)
        return loader_line(kind, self.config, self.limits, (size, tensors), self.ranks, own_message(exc))

    def check_full_batch(self, loader: Any) -> None:
        """Before ``loader``'s workers start, where nothing before the trial sized its batches (a ``collate_fn`` of
        the workload's own, no ``length``, no ``worst_case_batch``: ``probe.sized_before``): collate one full batch
        of its first items here and refuse (``LoaderMemoryFailure``, status ``shm``) a loader whose batches in flight
        would overrun the limits, instead of letting its workers fill /dev/shm. The batch is kept as the footprint."""
        from autotune.workloads.probe import sized_before
        from autotune.workloads.worst_case import make_batch

        if (self.built is None or getattr(loader, "num_workers", 0) <= 0 or sized_before(self.built)
                or self.limits.shm_budget_bytes is None):
            return
        size, tensors = batch_footprint(make_batch(self.built, self.config.batch_size)[0])
        w, p = self.config.num_workers, self.config.prefetch_factor
        over = self.limits.problems(size, tensors, w, p, pin_memory=self.config.pin_memory, ranks=self.ranks)
        self.estimate = (size, tensors)
        if over:
            first = (f"; the first {self.probed} items gave {format_bytes(self.estimate_first[0])}"
                     if self.estimate_first else "")
            raise LoaderMemoryFailure(loader_line(
                "shm" if over[0].startswith("needs") else "fds", self.config, self.limits, (size, tensors), self.ranks,
                f"a full batch of {self.config.batch_size} measured before the workers started{first}: "
                f"not started (it {over[0]})"))


class LostBatchWatch:
    """The parent's eyes on a DataLoader worker's error that no event carries (issue 52): a worker whose queue could
    not move a batch into /dev/shm prints it from its feeder thread (``multiprocessing.queues._feed``), drops the
    batch and lives on, so the trial child waits at 0% CPU for a batch that never comes, until the time limit.

    ``feed`` reads the trial's log as it is written (``CappedLog(scan=...)``) for the texts of
    ``machine.loader_memory.failure_kind``; ``verdict`` then gives the child ``LOST_BATCH_GRACE_S`` to end on its
    own (a worker's collate that fails is raised in the child, which names it better), after which the parent ends
    the trial as ``shm``. A trial that finished anyway lost a batch on the way: ``shm`` too (the user's loop would
    wait for it)."""

    def __init__(self, config: Any, data: dict | None, *, ranks: int = 1) -> None:
        self.config, self.ranks = config, ranks
        self.limits = detect_limits()  # before the trial's loader fills /dev/shm
        self.estimate = footprint_at(data, config.batch_size)
        self.kind: str | None = None
        self.line = ""
        self.at: float | None = None
        self._carry = b""
        # the trial's own clock: a child of a round by turns stands stopped between its turns, and cannot end on its
        # own then (``run_trial`` gives the round's clock: the wall less the time stopped)
        self.clock = time.monotonic

    def feed(self, chunk: bytes) -> None:
        if self.kind is not None:
            return
        *lines, self._carry = (self._carry + chunk).split(b"\n")
        self._carry = self._carry[-4096:]  # a line without an end (a progress bar) is read in part
        for raw in lines:
            line = raw.decode(errors="replace").strip()
            kind = failure_kind(line)
            if kind is not None:
                self.kind, self.line, self.at = kind, line[:400], self.clock()
                return

    def verdict(self, now: float, batch: tuple[float, int] | None = None, *, ended: bool = False) -> str | None:
        """The ``shm`` reason once the grace has passed (or the child ``ended`` without naming it), else None.
        ``batch``: the trial's first batch when the child measured one, else the probe's estimate is said."""
        if self.at is None or (not ended and now - self.at < LOST_BATCH_GRACE_S):
            return None
        waited = "" if ended else f"; ended {now - self.at:.0f} s after it, the loader waiting for it for ever"
        return loader_line(self.kind or "shm", self.config, self.limits, batch or self.estimate or (None, None),
                           self.ranks, f"a worker's queue lost a batch{waited}: {self.line}")


def own_message(exc: BaseException) -> str:
    """The workload's (torch's) own message in one line: a worker's error's last line, else the first."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    own = lines[-1] if lines and "DataLoader worker process" in lines[0] else (lines[0] if lines else "")
    return (own if re.match(r"^[A-Za-z_.]*(Error|Exception): ", own) else f"{type(exc).__name__}: {own}")[:400]


def loader_line(kind: str, config: Any, limits: Any, batch: tuple[float | None, int | None], ranks: int,
                own: str) -> str:
    """What ran out (``kind``: shm, fds), the limit, what the loader holds in flight (``batch``: bytes and tensors,
    None where unknown), and ``own``: the workload's message or what was seen."""
    w, p = config.num_workers, config.prefetch_factor
    size, tensors = batch
    shape = f"{w} worker(s) x prefetch_factor {p or 2} + 1 batches" + (f" of {format_bytes(size)}" if size else "")
    on = f", in each of {ranks} ranks" if ranks > 1 else ""
    if kind == "shm":
        need = f"~{format_bytes(in_flight_bytes(size, w, p, ranks))}" if size else "more"
        return (f"DataLoader worker ran out of shared memory ({limits.shm_path} {format_bytes(limits.shm_free_bytes)} "
                f"free; this loader needs {need} in flight: {shape}{on}): {own}")
    return (f"DataLoader ran out of file descriptors (open-file limit {limits.nofile_soft or 'unknown'}, {FD_RESERVE} "
            f"kept for the rest; this loader holds ~{in_flight_batches(w, p) * (tensors or 1)} in flight, one per "
            f"shared tensor: {shape}): {own}")
