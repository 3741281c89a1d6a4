"""What one knob did: measured trials that differ in one knob only, and their throughput ratio.

Optuna's parameter importances (fANOVA) fit a random forest to the trials; from a handful of trials the bars
are noise drawn as a finding. What a reader can trust from a small study is a like-for-like comparison:
"channels_last False -> True, same everything else: 1.60x, trials 0 and 1". ``one_knob_effects`` lists them,
``by_change`` groups the pairs of one change (with their median), ``importances_trusted`` says whether the
study has enough measured trials for importances, and ``dashboard_note`` is the same in markdown, saved on
the study at the end of a run (``save_dashboard_note``) where optuna-dashboard shows it.

Only measured trials count: status "ok", not a copy of another trial's figures (``duplicate_of``), with a
config and a throughput, measured on the same kind of machine as the other side of the pair.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from autotune.config import TrialConfig
from autotune.search.record.trials import CONFIG, DUPLICATE_OF, FINGERPRINT, STATUS, one_knob_apart

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["Effect", "Change", "one_knob_effects", "by_change", "measured_trials", "importances_trusted",
           "MIN_TRIALS", "TRIALS_PER_KNOB", "dashboard_note", "save_dashboard_note"]

# Below this many measured trials the importances are not shown as a finding. fANOVA explains the variance of
# the throughput by each knob through a random forest fitted to the trials; with fewer than about ten trials
# per knob varied (the rule of thumb for any regression: ~10 observations per predictor) most knobs are seen
# at each value a couple of times, in different company, and a 5-10% run-to-run spread is enough to rank them
# anyhow (the 9-trial study of issue 17 gave malloc 0.19, compile_mode 0.19, num_workers 0.16). 30 at least,
# whatever the number of knobs, so that even a 2-knob space has each value seen in several combinations.
MIN_TRIALS = 30
TRIALS_PER_KNOB = 10


@dataclass(frozen=True)
class Effect:
    """Trials ``trial_a`` and ``trial_b`` differ only in ``knob`` (``from_value`` -> ``to_value``); ``ratio`` is
    b's throughput over a's."""

    knob: str
    from_value: Any
    to_value: Any
    ratio: float
    trial_a: int
    trial_b: int


@dataclass(frozen=True)
class Change:
    """Every measured pair of one change of one knob: the median ratio and the pairs it is the median of."""

    knob: str
    from_value: Any
    to_value: Any
    median: float
    effects: tuple[Effect, ...]

    @property
    def trials(self) -> str:
        """"trials 0 and 1", or for several pairs "trials 0 → 1, 4 → 6" (from-trial → to-trial)."""
        if len(self.effects) == 1:
            e = self.effects[0]
            return f"trials {e.trial_a} and {e.trial_b}"
        return "trials " + ", ".join(f"{e.trial_a} → {e.trial_b}" for e in self.effects)

    def line(self) -> str:
        """``channels_last False -> True, same everything else: 1.60x, from trials 0 and 1``."""
        many = f"median of {len(self.effects)} pairs, " if len(self.effects) > 1 else ""
        return (f"{self.knob} {self.from_value} -> {self.to_value}, same everything else: {self.median:.2f}x "
                f"({many}{self.trials})")


def measured_trials(trials) -> list:
    """The trials that were measured here: finished with status ok, a config and a throughput; not copies."""
    return [t for t in trials
            if t.state.name == "COMPLETE" and t.user_attrs.get(STATUS) == "ok" and t.user_attrs.get(CONFIG)
            and t.user_attrs.get(DUPLICATE_OF) is None and (t.value or 0) > 0]


def _order(knob: str, a: Any, b: Any) -> bool:
    """True when ``a`` -> ``b`` is the way round to state a change: from PyTorch's default (TrialConfig's) where
    one side is it, else from the smaller value, so every pair of one change reads the same way."""
    default = getattr(TrialConfig(), knob, None)
    if a == default or b == default:
        return a == default
    try:
        return a < b
    except TypeError:  # None against a number (prefetch_factor, thread counts): None (PyTorch's choice) first
        return a is None


def one_knob_effects(trials) -> list[Effect]:
    """Every pair of measured trials (``measured_trials``) whose configs differ in one knob only
    (``trials.one_knob_apart``), stated from the default / smaller value to the other; in trial order."""
    done = sorted(measured_trials(trials), key=lambda t: t.number)
    configs = {t.number: TrialConfig.from_dict(t.user_attrs[CONFIG]) for t in done}
    out = []
    for i, a in enumerate(done):
        for b in done[i + 1:]:
            if a.user_attrs.get(FINGERPRINT) != b.user_attrs.get(FINGERPRINT):
                continue  # two kinds of machine (a Ray cluster): not one knob apart
            knob = one_knob_apart(configs[a.number], configs[b.number])
            if knob is None:
                continue
            in_order = _order(knob, getattr(configs[a.number], knob), getattr(configs[b.number], knob))
            x, y = (a, b) if in_order else (b, a)
            out.append(Effect(knob, getattr(configs[x.number], knob), getattr(configs[y.number], knob),
                              y.value / x.value, x.number, y.number))
    return out


def by_change(effects: list[Effect]) -> list[Change]:
    """The effects grouped by (knob, from, to), each with its median ratio; the largest departure from 1x first."""
    groups: dict[tuple, list[Effect]] = {}
    for e in effects:
        groups.setdefault((e.knob, repr(e.from_value), repr(e.to_value)), []).append(e)
    changes = [Change(g[0].knob, g[0].from_value, g[0].to_value, statistics.median(e.ratio for e in g), tuple(g))
               for g in groups.values()]
    changes.sort(key=lambda c: (-max(c.median, 1 / c.median), c.knob))
    return changes


def importances_trusted(study: Study) -> tuple[bool, int, int]:
    """``(enough, measured, needed)``: whether the study has enough measured trials for parameter importances
    to be a finding: ``MIN_TRIALS``, and ``TRIALS_PER_KNOB`` per knob the measured trials vary."""
    done = measured_trials(study.get_trials(deepcopy=False))
    names = {k for t in done for k in t.params}
    varied = sum(1 for k in names if len({repr(t.params.get(k)) for t in done}) > 1)
    needed = max(MIN_TRIALS, TRIALS_PER_KNOB * varied)
    return len(done) >= needed, len(done), needed


def dashboard_note(study: Study) -> str:
    """The study's note for optuna-dashboard (markdown): whether its importances mean anything yet, and the
    one-knob effects."""
    enough, n, needed = importances_trusted(study)
    lines = ["## What the trials say (autotune)", ""]
    if enough:
        lines.append(f"{n} measured trials: parameter importances are worth a look (at least {needed} needed here).")
    else:
        lines.append(f"**Parameter importances are noise here**: {n} measured trials, and they need at least "
                     f"{needed} ({TRIALS_PER_KNOB} per knob varied, {MIN_TRIALS} at least). Read the one-knob "
                     "comparisons below instead.")
    changes = by_change(one_knob_effects(study.get_trials(deepcopy=False)))
    lines += ["", "### One knob changed, same everything else", ""]
    lines += [f"- {c.line()}" for c in changes] or ["- no two measured trials differ in one knob only yet"]
    lines += ["", "Ratio: median samples/s with the second value over that with the first (several pairs: their "
              "median; trials first -> second). `autotune report` has the same table."]
    return "\n".join(lines) + "\n"


def save_dashboard_note(study: Study, log: Callable[[str], None]) -> bool:
    """Write ``dashboard_note`` on the study for optuna-dashboard; without optuna-dashboard (or with a version
    without ``save_note``), or if the note cannot be written, say so in one line and go on. True when written."""
    try:
        from optuna_dashboard import save_note
    except ImportError:
        log("dashboard note skipped: optuna-dashboard (with save_note) is not installed")
        return False
    try:
        save_note(study, dashboard_note(study))
    except Exception as exc:  # a note is a courtesy: never fail a finished run over it
        log(f"dashboard note skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return False
    return True
