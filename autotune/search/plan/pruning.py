"""When to stop a trial early: the one pruning rule, used by the local loop (as an Optuna pruner) and by the
Ray backend (as Tune's scheduler decision)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.search.record import trials as keys
from autotune.measure import NOISY_REL_IQR, summarize
from autotune.search.record.trials import MemoryLimit, is_feasible

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

__all__ = ["NoHopePruner", "as_optuna_pruner"]


class NoHopePruner:
    """Prune a trial whose best window so far, even ``margin`` faster, cannot beat the best feasible trial.

    Optimistic on purpose: on a noisy machine a config is dropped only when its best window is clearly
    below the best median. Needs ``min_windows`` windows first; the baseline trial is never pruned, nor a repeat
    (``repeat_of``): the plan measures a config again where one trial came within the noise of another, and its
    decision reads both repeats' medians side by side (``coordinate.better``), so a repeat cut short would decide
    it on the moment the machine had. Never
    decides on windows whose own spread is above the noise threshold (their IQR over their median above
    ``measure.NOISY_REL_IQR``, the figure `show` flags as noisy): a stall (another program, a slow data
    batch) then says nothing about the config, so the trial measures on, and is pruned at a later window once
    its windows agree, or finishes with its median.
    """

    def __init__(self, *, margin: float = 0.15, min_windows: int = 2, limit: MemoryLimit | None = None,
                 noisy_rel_iqr: float = NOISY_REL_IQR) -> None:
        self.margin = margin
        self.min_windows = min_windows
        self.noisy_rel_iqr = noisy_rel_iqr  # windows spread wider than this are no evidence
        self.limit = limit  # which trials set the bar: those that fit this memory limit (None: as recorded)

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        from optuna.trial import TrialState

        values = trial.intermediate_values
        if len(values) < self.min_windows or trial.user_attrs.get(keys.BASELINE) \
                or trial.user_attrs.get(keys.REPEAT_OF) is not None:
            return False
        if summarize(list(values.values())).rel_iqr > self.noisy_rel_iqr:
            return False
        best = None
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.value and is_feasible(t, self.limit):
                best = t.value if best is None else max(best, t.value)
        if best is None:
            return False
        return max(values.values()) * (1 + self.margin) < best


def as_optuna_pruner(rule: NoHopePruner):
    """``rule`` as an ``optuna.pruners.BasePruner`` (Optuna is imported only when a study is made)."""
    import optuna

    class _Pruner(optuna.pruners.BasePruner):
        def prune(self, study: Study, trial: FrozenTrial) -> bool:  # noqa: D401 - Optuna's interface
            return rule.prune(study, trial)

    return _Pruner()
