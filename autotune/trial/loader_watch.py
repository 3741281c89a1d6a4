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
"""

from __future__ import annotations

import re
from typing import Any

from autotune.machine.loader_memory import (FD_RESERVE, detect_limits, failure_kind, format_bytes, in_flight_batches,
                                            in_flight_bytes)
from autotune.workloads.probe import batch_footprint, footprint_at

__all__ = ["LoaderWatch", "LoaderMemoryFailure"]


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
        w, p = self.config.num_workers, self.config.prefetch_factor
        size, tensors = self._batch() or (None, None)
        n = in_flight_batches(w, p)
        shape = f"{w} worker(s) x prefetch_factor {p or 2} + 1 batches" + (f" of {format_bytes(size)}" if size else "")
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        own = lines[-1] if lines and "DataLoader worker process" in lines[0] else (lines[0] if lines else "")
        own = (own if re.match(r"^[A-Za-z_.]*(Error|Exception): ", own) else f"{type(exc).__name__}: {own}")[:400]
        ranks = f", in each of {self.ranks} ranks" if self.ranks > 1 else ""
        if kind == "shm":
            need = f"~{format_bytes(in_flight_bytes(size, w, p, self.ranks))}" if size else "more"
            return (f"DataLoader worker ran out of shared memory ({self.limits.shm_path} "
                    f"{format_bytes(self.limits.shm_free_bytes)} free; this loader needs {need} in flight: "
                    f"{shape}{ranks}): {own}")
        limit = self.limits.nofile_soft
        return (f"DataLoader ran out of file descriptors (open-file limit {limit or 'unknown'}, {FD_RESERVE} kept for "
                f"the rest; this loader holds ~{n * (tensors or 1)} in flight, one per shared tensor: {shape}): {own}")
