"""The finalists' rounds, kept in the study as they are measured, so a run killed during the finalists resumes
them instead of losing them all; and their numerics checks (``record_parity``), kept where `show` finds them.

Each finalist run's result is stored (``trials.FINALIST_ROUNDS``: the plan's digest and every run's result) the
moment it returns. A later ``finalize`` with the same plan (the same finalists in the same order, rounds and
measurement: windows, time limit) takes every *complete* round from the store and measures the rest. A round stopped
part-way is measured again whole: a round's configs run back to back, at one moment of the machine, and the
ratio interval (``finalists.ratio_interval``) resamples rounds on that premise; the runs of a stopped round, hours
before the resume, would be compared with runs of another moment. A finished ``finalize`` empties the store, so
a later run measures its finalists afresh.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from autotune.search import trials as keys
from autotune.config import MeasureSpec, TrialConfig, TrialResult

if TYPE_CHECKING:
    from optuna import Study

    from autotune.trial.parity import ParityResult

__all__ = ["SavedRounds", "record_parity"]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


class SavedRounds:
    """The store of one plan's finalist runs, in ``study``'s user attributes (``study=None``: kept nowhere).

    >>> saved = SavedRounds(study, configs, rounds=2, measure=spec)   # doctest: +SKIP
    >>> saved.round(0)      # {config key: TrialResult} of round 0 if it was finished, else None
    """

    def __init__(self, study: Study | None, configs: list[TrialConfig], *, rounds: int, measure: MeasureSpec) -> None:
        self.study = study
        self.configs = list(configs)
        # not the cap: by default a share of the memory free at start, so it moves between runs; ``choose``
        # judges every stored peak against the cap of the run that resumes anyway
        how = {k: v for k, v in measure.to_dict().items() if k != "memory_cap_mb"}
        self.plan = _digest({"configs": [c.to_dict() for c in configs], "rounds": rounds, "measure": how})
        stored = (study.user_attrs.get(keys.FINALIST_ROUNDS) if study is not None else None) or {}
        self.runs: dict[str, dict] = dict(stored.get("runs") or {}) if stored.get("plan") == self.plan else {}

    @staticmethod
    def _key(r: int, config: TrialConfig) -> str:
        return f"{r}:{_digest(config.to_dict())}"

    def round(self, r: int) -> dict[tuple, TrialResult] | None:
        """Round ``r``'s results by config key, when every finalist's run of it is stored; else None."""
        found = [self.runs.get(self._key(r, c)) for c in self.configs]
        if any(x is None for x in found):
            return None
        return {c.key(): TrialResult.from_dict(x) for c, x in zip(self.configs, found)}

    def put(self, r: int, config: TrialConfig, result: TrialResult) -> TrialResult:
        """Store one run's result now (its traceback stays in its log: the study keeps the figures); returns it."""
        if self.study is None:  # nowhere to keep it
            return result
        d = result.to_dict()
        d["traceback"] = None
        self.runs[self._key(r, config)] = d
        self.study.set_user_attr(keys.FINALIST_ROUNDS, {"plan": self.plan, "runs": self.runs})
        return result

    def clear(self) -> None:
        """The finalists are done: a later run measures its own."""
        self.runs = {}
        if self.study is not None and self.study.user_attrs.get(keys.FINALIST_ROUNDS) is not None:
            self.study.set_user_attr(keys.FINALIST_ROUNDS, None)


def record_parity(study: Study, trial_number: int, result: ParityResult) -> None:
    """Keep a finalist's numerics check in the study (its trial is finished, so the study holds it), where
    `show` and the report find it."""
    checks = dict(study.user_attrs.get(keys.PARITY) or {})
    checks[str(trial_number)] = result.to_dict()
    study.set_user_attr(keys.PARITY, checks)
