"""When a search with no budget may stop by itself: the best feasible config has not improved by more than
the measured noise for ``K`` measured trials in a row.

``K`` (``patience``) grows with the space: twice log2 of its size, i.e. twice the yes/no questions that name
one config, since TPE narrows the space by splitting it, and each trial without a gain should have had a fair
chance at each split; at least ``MIN_PATIENCE`` (the sampler's random start-up and the first batch walk are
not a model of the space yet) and at most ``MAX_PATIENCE`` (beyond that, more trials buy less than their time:
a flat region stays flat). On the stock CPU space trimmed to a 2-core AMD EPYC (12,960 points) that is 28.

"Improved" means the new best is above the old best by more than the noise: the median relative IQR of the
study's measured windows, but never under ``NOISY_REL_IQR`` (5%): windows within one process spread less than
the same config in fresh processes minutes apart (5-20% on this project's VMs), so a smaller "gain" is as
likely the machine as the config. The count runs over the study's measured trials on this hardware, so a
resumed run carries on counting where the last one stopped; copies and answers from the study are not
measurements and do not count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import trials as keys
from .measure import NOISY_REL_IQR, median_or_none

__all__ = ["MIN_PATIENCE", "MAX_PATIENCE", "patience", "Convergence", "convergence"]

MIN_PATIENCE = 10
MAX_PATIENCE = 40
# statuses of a trial that ran (was measured), whether or not it finished
_RAN = ("ok", "pruned", "timeout", "oom", "over_memory", "crashed", "error")


def patience(space_size: int) -> int:
    """``K``: measured trials without a gain after which the search is taken as converged.

    >>> patience(4608), patience(2), patience(10**30)
    (25, 10, 40)
    """
    return max(MIN_PATIENCE, min(MAX_PATIENCE, math.ceil(2 * math.log2(max(2, space_size)))))


@dataclass(frozen=True)
class Convergence:
    """Where a search stands: ``since`` measured trials since the best feasible value last rose by more than
    ``noise`` (a fraction), against ``patience``; ``best`` and ``best_trial`` are that best."""

    since: int
    patience: int
    noise: float
    best: float | None
    best_trial: int | None

    @property
    def converged(self) -> bool:
        return self.patience > 0 and self.best is not None and self.since >= self.patience

    def progress(self) -> str:
        """For the progress bar: "7 of 25 trials without a gain > 5%"."""
        return f"{self.since} of {self.patience} trials without a gain > {100 * self.noise:.0f}%"

    def why(self) -> str:
        """For the closing summary."""
        return (f"converged: {self.since} measured trials in a row without beating trial {self.best_trial}'s "
                f"{self.best:.1f} samples/s by more than the noise ({100 * self.noise:.0f}%)")


def convergence(study, *, patience_k: int, fingerprint: str, limit: keys.MemoryLimit) -> Convergence:
    """Read the study's measured trials (of ``fingerprint``'s hardware) in the order they finished."""
    from optuna.trial import TrialState

    ran = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                               TrialState.FAIL))
           if t.user_attrs.get(keys.STATUS) in _RAN and t.user_attrs.get(keys.DUPLICATE_OF) is None
           and t.user_attrs.get(keys.FINGERPRINT, fingerprint) == fingerprint and t.datetime_complete]
    ran.sort(key=lambda t: t.datetime_complete)
    noise = max(NOISY_REL_IQR, median_or_none([t.user_attrs["rel_iqr"] for t in ran
                                               if isinstance(t.user_attrs.get("rel_iqr"), (int, float))]) or 0.0)
    best = best_trial = None
    since = 0
    for t in ran:
        if t.state == TrialState.COMPLETE and keys.is_feasible(t, limit) and t.value is not None \
                and (best is None or t.value > best * (1 + noise)):
            best, best_trial, since = t.value, t.number, 0
        else:
            since += 1
    return Convergence(since=since, patience=patience_k, noise=noise, best=best, best_trial=best_trial)
