"""When the sampler's search may stop by itself: ``K`` of its trials in a row have not improved the best
feasible config by more than the measured noise, where ``K`` is where one more trial is expected to cost more
than it saves.

The rule before this one waited a fixed number of trials (twice log2 of the space's size: 28 on the stock CPU
space), whatever each cost: with 90 s trials that was 40 minutes of waiting, and issue 25's run never got there.
Now the patience is worked out from what a trial costs and what it can still buy:

* a gain the sampler could still find is worth ``run_s x gain`` seconds of the user's training (``run_s``: the
  planned run, ``payback.RunLength``, an hour when not stated; ``gain``: the median of the gains the sampler's
  own trials found so far, else the noise, the smallest gain that counts);
* after ``since`` trials without one, the chance that the next finds one is about ``1 / (since + 2)`` (Laplace's
  rule of succession after ``since`` misses);
* a trial costs ``trial_s``, the median wall time of the study's measured trials.

One more trial is worth it while ``run_s x gain / (since + 2) > trial_s``, so the search stops after
``K = ceil(run_s x gain / trial_s - 2)`` trials without a gain, kept within ``MIN_PATIENCE`` and
``MAX_PATIENCE``. On a 2-core EPYC with ~25 s trials and an hour's run that is 6; with 5 s trials, 34.

Only the sampler's trials count (the planned search's queued trials are a fixed plan: ``coordinate``), and
only once that plan is done (``ready``); a gain found by any trial restarts the count. "Improved" means above
the old best by more than the noise: the median relative IQR of the study's measured windows, but never under
``NOISY_REL_IQR`` (5%), since windows within one process spread less than the same config in fresh processes
minutes apart. The count runs over the study's measured trials on this hardware, so a resumed run carries on
where the last stopped; copies and answers from the study are not measurements. A patience given explicitly
(``--patience K``) is used as it is; 0 never stops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
import statistics
from dataclasses import dataclass

from autotune.search.record import trials as keys
from autotune.search.record.trials import noise_of

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["MIN_PATIENCE", "MAX_PATIENCE", "PLANNED_ROLES", "patience", "noise_of", "Convergence", "convergence"]

MIN_PATIENCE = 3
MAX_PATIENCE = 40
# statuses of a trial that ran (was measured), whether or not it finished
_RAN = ("ok", "pruned", "timeout", "oom", "over_memory", "shm", "crashed", "error")
# roles of queued trials (the planned search, warm starts, re-runs): not the sampler's, so not counted
PLANNED_ROLES = keys.ROLES + (keys.REQUEUE_OF,)


def patience(run_s: float, gain: float, trial_s: float | None) -> int:
    """``K``: the sampler's trials without a gain after which one more is expected to cost more than it saves.

    >>> patience(3600, 0.05, 25.0), patience(3600, 0.05, 5.0), patience(3600, 0.05, 200.0), patience(3600, 0.05, None)
    (6, 34, 3, 40)
    """
    if not trial_s or trial_s <= 0:
        return MAX_PATIENCE
    return max(MIN_PATIENCE, min(MAX_PATIENCE, math.ceil(run_s * gain / trial_s - 2)))


@dataclass(frozen=True)
class Convergence:
    """Where a search stands: ``since`` sampler trials since the best feasible value last rose by more than
    ``noise`` (a fraction), against ``patience``; ``best`` and ``best_trial`` are that best. ``ready``: the
    planned search is done (before, the search never counts as converged); ``trial_s``, ``gain`` and
    ``run_label`` are what the patience was worked out from (``fixed``: it was given)."""

    since: int
    patience: int
    noise: float
    best: float | None
    best_trial: int | None
    ready: bool = True
    trial_s: float | None = None
    gain: float | None = None
    run_label: str = ""
    fixed: bool = False

    @property
    def converged(self) -> bool:
        return self.ready and self.patience > 0 and self.best is not None and self.since >= self.patience

    def progress(self) -> str:
        """For the progress bar: "3 of 6 trials without a gain > 5%"."""
        return f"{self.since} of {self.patience} trials without a gain > {100 * self.noise:.0f}%"

    def why(self) -> str:
        """For the closing summary."""
        text = (f"converged: {self.since} sampler trials in a row without beating trial {self.best_trial}'s "
                f"{self.best:.1f} samples/s by more than the noise ({100 * self.noise:.0f}%)")
        if not self.fixed and self.trial_s:
            text += (f"; at ~{self.trial_s:.0f} s a trial, one more is expected to save less than it costs over the "
                     f"{self.run_label or 'planned'} run")
        return text


def convergence(study: Study, *, patience_k: int | None, fingerprint: str, limit: keys.MemoryLimit,
                run_s: float = 3600.0, ready: bool = True, run_label: str = "") -> Convergence:
    """Read the study's measured trials (of ``fingerprint``'s hardware) in the order they finished;
    ``patience_k`` None works the patience out from ``run_s`` (the planned run's seconds) and the trials."""
    from optuna.trial import TrialState

    ran = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                               TrialState.FAIL))
           if t.user_attrs.get(keys.STATUS) in _RAN and t.user_attrs.get(keys.DUPLICATE_OF) is None
           and t.user_attrs.get(keys.FINGERPRINT, fingerprint) == fingerprint and t.datetime_complete]
    ran.sort(key=lambda t: t.datetime_complete)
    noise = noise_of(ran)
    best = best_trial = None
    since = 0
    gains: list[float] = []
    for t in ran:
        sampler = all(t.user_attrs.get(r) is None or t.user_attrs.get(r) is False for r in PLANNED_ROLES)
        if t.state == TrialState.COMPLETE and keys.is_feasible(t, limit) and t.value is not None \
                and (best is None or t.value > best * (1 + noise)):
            if sampler and best:
                gains.append(t.value / best - 1)
            best, best_trial, since = t.value, t.number, 0
        elif sampler:
            since += 1
    walls = [t.user_attrs[keys.WALL_S] for t in ran if isinstance(t.user_attrs.get(keys.WALL_S), (int, float))]
    trial_s = statistics.median(walls) if walls else None
    gain = statistics.median(gains) if gains else noise
    k = patience(run_s, gain, trial_s) if patience_k is None else patience_k
    return Convergence(since=since, patience=k, noise=noise, best=best, best_trial=best_trial, ready=ready,
                       trial_s=trial_s, gain=gain, run_label=run_label, fixed=patience_k is not None)
