"""The provisional pick among search trials the pipeline can tell apart where one measurement each cannot.

A step is a pipeline (``search.record.ceilings``): it runs no faster than the slower of the model and the loader.
Two trials that ran the same loader (batch size, workers, prefetch, pinning, persistence, allocator, affinity,
bucketing) differ only in the model's knobs (AMP, channels_last, cuDNN's autotuner, compile, threads). One that
waited for data ``WAITED`` of its step or more ran at the loader's rate: its model is faster than that. One that
barely waited ran at its model's rate, which is at most the loader's. So where the one that barely waited measured
faster, by less than two single measurements of one rate differ (``PLATEAU``: a process's own level moves 5%), the
measurement says the noise, and the pipeline says the one that waited is at least as fast; its model also has
headroom the loader can still use.

Only the provisional recommendation reads this (no finalist round fitted the budget, so nothing re-measured the
two): where the finalists ran, their interleaved rounds decide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from autotune.search.record import trials as keys
from autotune.search.record.ceilings import PLATEAU

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

__all__ = ["LOADER_KNOBS", "WAITED", "provisional_best"]

# The knobs that set the loader's own rate: trials equal in these ran the same data path.
LOADER_KNOBS = ("batch_size", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "malloc",
                "affinity", "bucket_by_length")
# The share of a step spent waiting for data above which the trial ran at the loader's rate (the TF profiler's
# "highly input-bound", as ``plan.ceiling_runs.INPUT_BOUND_SHARE``).
WAITED = 0.20


def provisional_best(trials: Iterable[FrozenTrial]) -> FrozenTrial:
    """The fastest of ``trials`` (feasible, finished), unless it barely waited for data and a trial on the same
    loader that waited ``WAITED`` or more measured within ``PLATEAU`` of it: then the fastest of those.

    >>> from optuna.trial import create_trial
    >>> t = lambda v, wait, amp: create_trial(value=v, user_attrs={keys.DATA_WAIT_SHARE: wait, keys.CONFIG: {
    ...     "batch_size": 64, "num_workers": 15, "amp": amp}})
    >>> provisional_best([t(3650.0, 0.02, "off"), t(3400.0, 0.5, "bf16")]).params == {} and \\
    ...     provisional_best([t(3650.0, 0.02, "off"), t(3400.0, 0.5, "bf16")]).value
    3400.0
    >>> provisional_best([t(3650.0, 0.02, "off"), t(3200.0, 0.5, "bf16")]).value  # 12% behind: not within the noise
    3650.0
    """
    trials = list(trials)
    best = max(trials, key=lambda t: t.value or 0)
    if _wait(best) is None or _wait(best) >= WAITED:
        return best
    loader = _loader(best)
    waited = [t for t in trials if _loader(t) == loader and (_wait(t) or 0.0) >= WAITED
              and (t.value or 0) >= (1 - PLATEAU) * (best.value or 0)]
    return max(waited, key=lambda t: t.value or 0) if waited else best


def _wait(t: FrozenTrial) -> float | None:
    wait = t.user_attrs.get(keys.DATA_WAIT_SHARE)
    return float(wait) if isinstance(wait, (int, float)) else None


def _loader(t: FrozenTrial) -> tuple:
    config = t.user_attrs.get(keys.CONFIG) or {}
    return tuple(config.get(k) for k in LOADER_KNOBS)
