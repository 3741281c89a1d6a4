"""What a recommendation says of its loader's memory: the shared memory it needs, whether it fits, what more buys.

The recommendation's YAML keeps it as ``loader_memory:`` and ``run``'s closing lines say its ``line``::

    loader memory: 2 worker(s) x prefetch_factor 1 + 1 = 3 batches of 18.4 MiB, 55.1 MiB in flight when the loop
    pauses: fits /dev/shm (64.0 MiB free, 57.6 MiB less 10%); /dev/shm held the search to this at batch 32 (the space
    offers 2 worker(s) x prefetch 4): with docker run --shm-size=1g it could try them

A batch's bytes are the recommended trial's first batch, as its DataLoader worker shared it (``trial.loader_watch``),
else the probe's estimate (``workloads.probe.footprint_at``); the limits are those the space was held to
(``search.space.loader_fit``, stored with the study's space), else this machine's. The options are named, never
applied: ``Recommendation.dataloader_kwargs`` refuses, where it is applied, a loader that does not fit there.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotune.machine.loader_memory import (LoaderLimits, detect_limits, format_bytes, in_flight_batches,
                                            in_flight_bytes, MARGIN)
from autotune.workloads.probe import footprint_at

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["statement", "recorded", "loader_shape", "loader_line", "applied_kwargs"]


def loader_shape(workers: int, prefetch: int | None) -> str:
    """``2 worker(s) x prefetch_factor 4``, or ``no workers``."""
    return f"{workers} worker(s) x prefetch_factor {prefetch or 2}" if workers else "no workers"


def statement(config: Any, batch: tuple[float, int] | None, *, measured: bool, limits: LoaderLimits | None,
              ranks: int = 1, offered: tuple[int, int | None] | None = None) -> dict[str, Any] | None:
    """The ``loader_memory`` section for ``config`` (a ``TrialConfig``) with batches of ``batch`` (bytes, tensors;
    ``measured`` on the trial's first batch or estimated), against ``limits``, with ``ranks`` loaders on the host.
    ``offered``: the largest loader (workers, prefetch) the space offered at this batch; where it does not fit,
    the limit held the search and ``options`` say what would lift it. None when the batch is unknown."""
    if batch is None:
        return None
    size, tensors = batch
    w, p, pin = config.num_workers, config.prefetch_factor, config.pin_memory
    need = in_flight_bytes(size, w, p, ranks)
    problems = limits.problems(size, tensors, w, p, pin_memory=pin, ranks=ranks) if limits is not None else []
    out: dict[str, Any] = {
        "batch_bytes": int(size), "batch_tensors": int(tensors), "batch_measured": measured,
        "in_flight_batches": in_flight_batches(w, p), "ranks": ranks, "in_flight_bytes": need,
        "shm_path": limits.shm_path if limits else None, "shm_free_bytes": limits.shm_free_bytes if limits else None,
        "margin": MARGIN, "fits": not problems, "problems": problems, "limited": False, "options": [],
    }
    if limits is not None and offered is not None and offered[0] > 0:
        ow, op = offered
        if limits.problems(size, tensors, ow, op, pin_memory=pin, ranks=ranks) and (ow, op or 2) != (w, p or 2):
            out.update(limited=True, offered={"num_workers": ow, "prefetch_factor": op},
                       options=limits.fixes(size, tensors, ow, op, pin_memory=pin, ranks=ranks))
    out["line"] = _line(out, config, limits)
    return out


def _line(s: dict[str, Any], config: Any, limits: LoaderLimits | None) -> str:
    w, p = config.num_workers, config.prefetch_factor
    est = "" if s["batch_measured"] else " (estimated before the trials, by the workload's probe)"
    ranks = f", x{s['ranks']} ranks" if s["ranks"] > 1 else ""
    if w:
        head = (f"loader memory: {loader_shape(w, p)} + 1 = {s['in_flight_batches']} batches of "
                f"{format_bytes(s['batch_bytes'])}{est}{ranks}, {format_bytes(s['in_flight_bytes'])} in flight when "
                "the loop pauses")
    else:
        head = "loader memory: no workers, so nothing in shared memory (the training process loads)"
    if limits is not None and limits.shm_budget_bytes is not None and w:
        head += (f": {'fits' if s['fits'] else 'does NOT fit'} {limits.shm_path} "
                 f"({format_bytes(limits.shm_free_bytes)} free, {format_bytes(limits.shm_budget_bytes)} less "
                 f"{MARGIN:.0%})")
    if not s["fits"]:
        head += f" ({'; '.join(s['problems'])})"
    if s["limited"]:
        o = s["offered"]
        head += (f"; the machine's limits held the search to this at batch {config.batch_size} (the space offers "
                 f"{loader_shape(o['num_workers'], o['prefetch_factor'])}): with {' or '.join(s['options'])} it "
                 "could try them")
    return head


def _offered(space: dict[str, Any], fixed_prefetch: int | None) -> tuple[int, int | None]:
    """The largest loader the stored space (``SearchSpace.to_dict``) runs: its most workers within a rank's cores,
    its largest prefetch."""
    params, fixed = space.get("parameters") or {}, space.get("fixed") or {}

    def most(name: str, default: int | None) -> int | None:
        values = [c for c in (params.get(name) or {}).get("choices") or [fixed.get(name)] if isinstance(c, int)]
        return max(values) if values else default

    workers = most("num_workers", 0) or 0
    if not space.get("oversubscribe") and space.get("usable_cores"):
        workers = min(workers, max(1, int(space["usable_cores"]) // max(1, int(space.get("ranks") or 1))))
    return workers, most("prefetch_factor", fixed_prefetch)


def recorded(study: Study, rec: Any) -> Any:
    """``rec`` (a Recommendation) with its ``loader_memory`` statement: the recommended trial's first batch (else
    the probe's estimate), the limits the space was held to (else this machine's), what the space offered."""
    from autotune.search.record import trials as keys

    config = rec.config
    ua = next((t.user_attrs for t in study.get_trials(deepcopy=False) if t.number == rec.trial_number), {})
    batch: tuple[float, int] | None = None
    if ua.get(keys.BATCH_BYTES) and (ua.get(keys.CONFIG) or {}).get("batch_size") == config.batch_size:
        batch, measured = (float(ua[keys.BATCH_BYTES]), int(ua.get(keys.BATCH_TENSORS) or 1)), True
    else:  # the probe's estimate (a workload the tuner was given unchecked was probed for its space)
        from autotune.workloads.build import profile

        batch, measured = footprint_at(profile(rec.workload), config.batch_size), False
    space = study.user_attrs.get(keys.STUDY_SPACE) or {}
    stored = (space.get("loader_memory") or {}).get("limits")
    limits = LoaderLimits.from_dict(stored) if stored else detect_limits()
    said = statement(config, batch, measured=measured, limits=limits, ranks=rec.world_size,
                     offered=_offered(space, config.prefetch_factor) if stored else None)
    return dataclasses.replace(rec, loader_memory=said) if said is not None else rec


def loader_line(said: dict | None) -> list[str]:
    """The line a person reads of a recommendation's ``loader_memory`` (none without one)."""
    return [said["line"]] if said and said.get("line") else []


def applied_kwargs(rec: Any, *, fit: bool = False) -> dict[str, Any]:
    """``rec.dataloader_kwargs()``: the config's DataLoader arguments, judged where they are applied. Its
    ``workers x prefetch_factor + 1`` batches in flight (x the ranks) must fit the free shared memory, the open-file
    limit and the pinned-memory share read here and now (``hardware.loader_limits_now``); one that does not is
    refused with a one-line ``ConfigError`` naming the options, or with ``fit`` the largest loader that fits here
    is given (a smaller prefetch, then fewer workers), with a warning: it is not the one measured. A batch's bytes
    are the recommended trial's first batch's, else the probe's estimate; unknown, nothing is judged. With workers,
    ``timeout`` (``_timed``) ends a loop whose batch was lost instead of hanging it."""
    import warnings

    from autotune.config import TrialConfig
    from autotune.machine.hardware import loader_limits_now
    from autotune.machine.loader_memory import check_loader

    c, lm = rec.config, rec.loader_memory or {}
    batch = ((float(lm["batch_bytes"]), int(lm.get("batch_tensors") or 1)) if lm.get("batch_bytes")
             else footprint_at(rec.workload.data, c.batch_size))
    if batch is None or not c.num_workers:  # nothing in shared memory, or nothing known of it: nothing to judge
        return _timed(c.dataloader_kwargs())
    fitted = check_loader(c.batch_size, c.num_workers, c.prefetch_factor, batch, limits=loader_limits_now(),
                          pin_memory=c.pin_memory, ranks=rec.world_size, fit=fit)
    if fitted is None:
        return _timed(c.dataloader_kwargs())
    w, p = fitted
    warnings.warn(f"dataloader_kwargs(fit=True): {w} worker(s) x prefetch_factor {p} instead of the measured "
                  f"{c.num_workers} x {c.prefetch_factor or 2}, to fit this machine's shared memory", stacklevel=3)
    return _timed(TrialConfig.from_dict({**c.to_dict(), "num_workers": w, "prefetch_factor": p}).dataloader_kwargs())


def _timed(kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` with DataLoader's ``timeout`` where workers run (``LOADER_TIMEOUT_S``): a batch a worker's queue lost
    in a full /dev/shm (it prints the error and lives on) ends the user's loop with torch's "DataLoader timed out"
    instead of a wait for ever."""
    from autotune.machine.loader_memory import LOADER_TIMEOUT_S

    return {**kw, "timeout": LOADER_TIMEOUT_S} if kw.get("num_workers") else kw
