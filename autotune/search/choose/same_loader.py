"""The provisional pick among search trials the pipeline can tell apart where one measurement each cannot.

On a GPU a step is a pipeline (``search.record.ceilings``): it runs no faster than the slower of the model (on the
device) and the loader (the workers, on the host's cores). Two trials that ran the same loader and the same
training process's threads (batch size, workers, prefetch, pinning, persistence, allocator, affinity, bucketing,
intra- and inter-op threads: ``LOADER_KNOBS``) differ only in the model's knobs (AMP, channels_last, cuDNN's
autotuner, compile). One that waited for data ``INPUT_BOUND_SHARE`` of its step or more ran at the loader's rate:
its model is faster than that. One that barely waited ran at its model's rate, which is at most the loader's. So
where the one that barely waited measured faster, by less than two single measurements of one rate differ
(``PLATEAU``: a process's own level moves 5%), the measurement says the noise, and the pipeline says the one that
waited is at least as fast; its model also has headroom the loader can still use. On a CPU the model and the
loader share the cores, so a model's knobs move the loader's rate too: there the fastest is taken.

Only the provisional recommendation reads this (no finalist round re-measured the two: the budget left none, or the
run stopped before them); where the finalists ran, their interleaved rounds decide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from autotune.search.record import trials as keys
from autotune.search.record.ceilings import INPUT_BOUND_SHARE, PLATEAU

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

__all__ = ["LOADER_KNOBS", "provisional_best"]

# The knobs that set the loader's own rate, the training process's threads included (they share the host's cores
# with the workers): trials equal in these ran the same data path.
LOADER_KNOBS = ("batch_size", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "malloc",
                "affinity", "bucket_by_length", "intra_op_threads", "inter_op_threads")


def provisional_best(trials: Iterable[FrozenTrial], *, device: str = "cuda") -> tuple[FrozenTrial, str]:
    """``(the trial to recommend provisionally, a note when it is not the fastest)``: the fastest of ``trials``
    (feasible, finished), unless on a GPU it barely waited for data and a trial on the same loader that waited
    ``INPUT_BOUND_SHARE`` or more measured within ``PLATEAU`` of it: then the fastest of those.

    >>> from optuna.trial import create_trial
    >>> t = lambda v, wait, amp: create_trial(value=v, user_attrs={keys.DATA_WAIT_SHARE: wait, keys.CONFIG: {
    ...     "batch_size": 64, "num_workers": 15, "amp": amp}})
    >>> provisional_best([t(3650.0, 0.02, "off"), t(3400.0, 0.5, "bf16")])[0].value  # the noise: bf16 waited
    3400.0
    >>> provisional_best([t(3650.0, 0.02, "off"), t(3200.0, 0.5, "bf16")])[0].value  # 12% behind: beyond the noise
    3650.0
    >>> provisional_best([t(3650.0, 0.02, "off"), t(3400.0, 0.5, "bf16")], device="cpu")[0].value  # one set of cores
    3650.0
    """
    trials = list(trials)
    best = max(trials, key=lambda t: t.value or 0)
    loader = _loader(best)
    if device == "cpu" or loader is None or _wait(best) is None or _wait(best) >= INPUT_BOUND_SHARE:
        return best, ""
    waited = [t for t in trials if _loader(t) == loader and (_wait(t) or 0.0) >= INPUT_BOUND_SHARE
              and (t.value or 0) >= (1 - PLATEAU) * (best.value or 0)]
    if not waited:
        return best, ""
    pick = max(waited, key=lambda t: t.value or 0)
    gap = best.value / pick.value - 1
    return pick, (f"trial {pick.number} over trial {best.number} ({best.value:.1f} samples/s, {pick.value:.1f} here): "
                  f"on the same loader trial {best.number} waited for data {100 * _wait(best):.0f}% of its step (its "
                  f"model bound it) and this one {100 * _wait(pick):.0f}% (the loader bound it), so the {gap:.0%} "
                  f"between them is within the noise of one measurement each ({PLATEAU:.0%}), and a model-bound "
                  "config cannot pass the loader that feeds it")


def _wait(t: FrozenTrial) -> float | None:
    wait = t.user_attrs.get(keys.DATA_WAIT_SHARE)
    return float(wait) if isinstance(wait, (int, float)) else None


def _loader(t: FrozenTrial) -> tuple | None:
    """The trial's loader knobs (``LOADER_KNOBS``), from its config as the package reads it (defaults filled in for a
    config an older version stored); None without a config."""
    config = t.user_attrs.get(keys.CONFIG) and keys.config_of(t)
    return tuple(getattr(config, k) for k in LOADER_KNOBS) if config is not None else None
