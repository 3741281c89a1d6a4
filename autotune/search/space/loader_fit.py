"""The loader's memory as a constraint of the space: a config whose loader would not fit this machine never runs.

A trial holds about one batch in flight while its loop waits for data; the user's loop pauses (a checkpoint, an
evaluation) and its loader fills ``num_workers x prefetch_factor + 1`` batches (``machine.loader_memory``). So what a
config holds in flight is judged before it runs, whatever a trial would have seen: ``LoaderFit.clamp`` lowers the
prefetch, then the workers, of a config over the machine's shared memory, descriptors or pinned-memory share
(``SearchSpace.effective`` calls it, as it clamps threads to the cores: the clamped config is what runs and is
stored), and ``fit_loader_memory`` adds one note to the space naming the limit and the fix when any config of the
space is clamped. A batch's bytes come from the workload's probe (its first batches of 2 and 4 items,
``workloads.probe.footprint_at``); each trial then measures its own first batch (``trial.loader_watch``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autotune.machine.loader_memory import LoaderLimits, format_bytes
from autotune.workloads.probe import footprint_at

__all__ = ["LoaderFit", "fit_loader_memory", "offered_most"]


@dataclass(frozen=True)
class LoaderFit:
    """The machine's ``limits``, the workload's probed ``data`` (its footprint) and the DDP ``ranks`` on the host."""

    limits: LoaderLimits
    data: dict
    ranks: int = 1

    def batch(self, batch_size: int) -> tuple[float, int] | None:
        """``(bytes, tensors)`` of a batch of ``batch_size``, by the probe; None without a footprint."""
        return footprint_at(self.data, batch_size)

    def clamp(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` (a config's knobs) with its loader within the limits: a smaller prefetch first, then fewer
        workers (``LoaderLimits.largest``); unchanged where it fits or nothing is known."""
        workers = int(values.get("num_workers") or 0)
        fp = self.batch(int(values.get("batch_size") or 64))
        if workers <= 0 or fp is None:
            return values
        prefetch = values.get("prefetch_factor")
        w, p = self.limits.largest(fp[0], fp[1], workers, prefetch, pin_memory=bool(values.get("pin_memory")),
                                   ranks=self.ranks)
        if (w, p) == (workers, prefetch):
            return values
        return {**values, "num_workers": w, "prefetch_factor": p}

    def most_workers(self, values: dict[str, Any], offered: list[int]) -> int:
        """The most of ``offered`` worker counts whose loader fits at ``values``' batch (prefetch lowered as
        ``clamp`` would); 0 when none does."""
        return max((w for w in offered if self.clamp({**values, "num_workers": w})["num_workers"] == w), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"limits": self.limits.to_dict(), "ranks": self.ranks}


def offered_most(space: Any, name: str, default: int = 0) -> int:
    """The largest value of knob ``name`` the space may run: its largest choice, or its fixed value."""
    p = next((p for p in space.params if p.name == name), None)
    values = [c for c in (p.choices if p is not None else (space.fixed.get(name),)) if isinstance(c, int)]
    return max(values, default=default)


def _clamped_line(fit: LoaderFit, space: Any) -> str | None:
    """One line when some config of ``space`` is clamped: what its largest loader overruns, what each batch size
    keeps, and the fix for the largest."""
    batches = sorted({c for p in space.params if p.name == "batch_size" for c in p.choices}
                     or {space.fixed.get("batch_size") or space.baseline.get("batch_size") or 64})
    workers, prefetch = offered_most(space, "num_workers"), offered_most(space, "prefetch_factor", 2) or None
    if not space.oversubscribe:  # as effective() clamps them first
        workers = min(workers, space.rank_cores)
    pin = any(p.name == "pin_memory" and True in p.choices for p in space.params) or bool(space.fixed.get("pin_memory"))
    shrunk = []
    for b in batches:
        w, p = _fitted(fit, b, workers, prefetch, pin)
        if (w, p) != (workers, prefetch):
            shrunk.append(f"batch {b}: {w} worker(s)" + (f" x prefetch {p}" if w else ""))
    fp = fit.batch(batches[-1])
    if not shrunk or fp is None:
        return None
    args = (fp[0], fp[1], workers, prefetch)
    why = fit.limits.problems(*args, pin_memory=pin, ranks=fit.ranks)
    fixes = fit.limits.fixes(*args, pin_memory=pin, ranks=fit.ranks)
    ranks = f", in each of {fit.ranks} ranks" if fit.ranks > 1 else ""
    return (f"loader memory: at batch {batches[-1]} with {workers} workers x prefetch {prefetch or 2} a loader "
            f"{'; '.join(why)} (workers x prefetch_factor + 1 batches of {format_bytes(fp[0])} wait there while the "
            f"training loop pauses{ranks}): configs over it run with a smaller prefetch, then fewer workers ("
            f"{'; '.join(shrunk[:3])}{'; ...' if len(shrunk) > 3 else ''}); to search them all: {' or '.join(fixes)}")


def _fitted(fit: LoaderFit, batch: int, workers: int, prefetch: int | None, pin: bool) -> tuple[int, int | None]:
    out = fit.clamp({"batch_size": batch, "num_workers": workers, "prefetch_factor": prefetch, "pin_memory": pin})
    return out["num_workers"], out.get("prefetch_factor")


def fit_loader_memory(space: Any, workload: Any, hardware: Any) -> Any:
    """``space`` with its loaders held to this machine's limits (``hardware.loader_limits``) for ``workload``'s batches
    (``workload.data``'s footprint), and a note where that clamps any config; as is where a limit or the footprint
    is unknown or no config has workers."""
    from autotune.workloads.build import profile

    limits = getattr(hardware, "loader_limits", None)
    data = workload.data if workload.data is not None else profile(workload)  # fit_workload probed it already
    if limits is None or not data or not data.get("footprint") or offered_most(space, "num_workers") <= 0:
        return space
    fit = LoaderFit(limits, data, ranks=max(1, int(getattr(workload, "nproc_per_node", 1) or 1)))
    fitted = dataclasses.replace(space, loader=fit)
    line = _clamped_line(fit, fitted)
    return dataclasses.replace(fitted, notes=[*space.notes, line]) if line else fitted
