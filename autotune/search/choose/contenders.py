"""Who gets a finalist round, and how long a finalist run is: the finalists' rounds cost the budget the search
would otherwise spend (issue 50), so a config whose search figure lost beyond the noise gets none (``contenders``,
``lost_gap``), and the windows of a run are sized by the noise the search trials' windows showed
(``search.record.trials.window_noise``, read by ``search.budget.finalist_windows``).

May import what the rest of ``choose`` may (``search.budget``, ``search.record`` and below).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from autotune.config import TrialConfig
from autotune.search.record import trials as keys

__all__ = ["Contenders", "contenders", "with_near", "planned_trial", "near_misses", "lighter_sibling", "lost_gap",
           "LOSER_SPREAD", "NEAR_MISSES"]

# The spread between fresh processes of one config (sd of log) ``lost_gap`` assumes at least: the middle of what these
# VMs show (5-20%; 17-36% between processes of 0.3 s windows under load, benchmarks/results/coverage-windows-*).
LOSER_SPREAD = 0.10
# At most this many of the planned search's near misses (``near_misses``) get a finalist place, after the others.
NEAR_MISSES = 2


class Contenders(NamedTuple):
    """Who gets a finalist round: ``top`` (best first), the notes on those left out (``left_out``), the best config's
    lighter sibling where it was added (``sibling``, None where not) with its note, the planned search's best
    where it was added (``planned``) with its note, and its near misses added (``near``) with theirs."""

    top: list
    left_out: tuple[str, ...] = ()
    sibling: Any = None
    sibling_note: tuple[str, ...] = ()
    planned: Any = None
    planned_note: tuple[str, ...] = ()
    near: tuple = ()
    near_notes: tuple[str, ...] = ()

    def notes_for(self, ran: list) -> tuple[str, ...]:
        """The notes a recommendation keeps, ``ran`` the finalists whose rounds ran: those left out, and each added
        finalist's where it had rounds."""
        return (self.left_out + (self.planned_note if self.planned is not None and self.planned in ran else ())
                + (self.sibling_note if self.sibling is not None and self.sibling in ran else ())
                + tuple(n for t, n in zip(self.near, self.near_notes) if t in ran))


def with_near(chosen: Contenders, near: list, *, k: int, base=None, planned=None, gap: float,
              fits: Callable[[list], bool] | None = None) -> Contenders:
    """``chosen`` with the planned search's near misses (``near_misses``: ``(trial, OneDraw)``, nearest first) after
    its finalists, at most ``NEAR_MISSES`` of them, each not among them already, not the baseline and within ``gap``
    of the best (``lost_gap``). Only beside the config they missed: ``planned`` (the plan's best, its trial) among
    the finalists or the baseline's config (re-measured in every round), and ``k`` >= 2 (a user who asks for one
    finalist gets one). ``fits(trials)``: whether a round of those trials' configs may still take turns (where
    a round of ``chosen``'s does, a near miss that would end it gets no place). Last, so the finalists' plan drops
    them first where the time left is short (``finalists.plan``); the search keeps no time back for them
    (``Budget.finalists_reserve_s``): they run where its reserve has room, or the search ended early (converged)."""
    top = list(chosen.top)
    plain = base.user_attrs.get(keys.CONFIG) if base is not None else None
    beside = planned is not None and (any(planned is t for t in top) or planned.user_attrs.get(keys.CONFIG) == plain)
    if k < 2 or not beside or not top or not top[0].value:
        return chosen
    bases = [base] if base is not None else []
    turns = fits is not None and fits(top + bases)
    added, notes = [], []
    for t, d in near:
        if (len(added) < NEAR_MISSES and all(t is not x for x in top) and t.user_attrs.get(keys.CONFIG) != plain
                and t.value and top[0].value / t.value <= 1.0 + gap and (not turns or fits(top + added + [t] + bases))):
            added.append(t)
            knobs = ", ".join(f"{k}={v}" for k, v in d.knobs.items())
            notes.append(f"finalist trial {t.number}: {knobs} on the planned search's best, put out of the plan on one "
                         f"trial within the noise below it ({100 * d.gap:+.1f}%): a finalist, so the rounds measure it "
                         "again, paired")
    return chosen._replace(top=top + added, near=tuple(added), near_notes=tuple(notes))


def contenders(ranked: list, *, k: int, gap: float, base=None, planned=None) -> Contenders:
    """The finalists: the first ``k`` of ``ranked`` (feasible trials, best first), less those the best outran by
    more than ``gap`` (``lost_gap``: best / it > 1 + gap, beyond what two fresh processes of one config differ by);
    their rounds would buy nothing but time the search spends better (issue 50). The best always stays. With
    ``base`` (the baseline trial) and ``k`` >= 2, the best config's ``lighter_sibling`` comes second where it is not
    among them already, the last making room when there are ``k``: the finalists' plan drops from the end when
    time is short, so the sibling stays longer than the search's third. Before it (so the sibling needs ``k`` >= 3
    then) comes ``planned``, the planned search's best config (its trial, ``keys.PLAN_KEPT``), where it is not among
    them, not the baseline (re-measured in every round anyway) and not beyond ``gap``: its place rests on one-knob
    decisions, the close ones measured twice (``coordinate``), the search's fastest trials on one draw each, and a
    spell of the machine lifts several trials in a row (2026-11-30, tiny_vit at 10 minutes: three sampler trials
    at 415-419 samples/s took every finalist place from the plan's 394; the one recommended ran 325-362 re-measured).

    >>> from types import SimpleNamespace as T
    >>> c = contenders([T(number=3, value=100.0), T(number=7, value=90.0), T(number=1, value=70.0)], k=3, gap=0.262)
    >>> [t.number for t in c.top], len(c.left_out), c.sibling
    ([3, 7], 1, None)
    >>> c.left_out[0].split(": ")[1]
    'the best (trial 3) measured x1.43 its figure in the search'
    """
    top = list(ranked[: max(1, k)])
    if not top or not top[0].value:
        return Contenders(top)
    best = top[0]
    out = [t for t in top[1:] if not t.value or best.value / t.value > 1.0 + gap]
    notes = tuple(f"no finalist round for trial {t.number}: the best (trial {best.number}) measured "
                  f"x{best.value / t.value:.2f} its figure in the search: beyond the x{1 + gap:.2f} that two fresh "
                  "processes of one config differ by at 95%" for t in out if t.value)
    top = [t for t in top if t not in out]
    at, added, pushed = 1, (), []  # where the sibling goes: after the planned search's best, where that is added
    if (k >= 2 and planned is not None and planned.value and all(t is not planned for t in top)
            and best.value / planned.value <= 1.0 + gap
            and (base is None or planned.user_attrs.get(keys.CONFIG) != base.user_attrs.get(keys.CONFIG))):
        pushed = top[k - 1:]
        top, at = [best, planned] + top[1:k - 1], 2
        added = (f"finalist trial {planned.number}: the planned search's best config, beside the search's fastest "
                 f"trial (trial {best.number}), which measured x{best.value / planned.value:.2f} its figure on one "
                 "draw",)
    sib = lighter_sibling(ranked, base, gap=gap) if k >= 2 else None
    if sib is None or any(t is sib for t in top) or at >= k:
        if added and pushed:  # no sibling after it: it took the search's next best's place
            added = (added[0] + f" (in place of trial {pushed[0].number}, the search's next best)",)
        return Contenders(top, notes, planned=planned if added else None, planned_note=added)
    kept = (top[:at] + [sib] + top[at:])[:k]
    dropped = [t for t in top if t not in kept]
    apart = _apart(top[0].user_attrs[keys.CONFIG], sib.user_attrs[keys.CONFIG])
    one = len(apart) == 1
    note = (f"finalist trial {sib.number}: the best (trial {top[0].number}) with {', '.join(apart)} as the baseline "
            f"has {'it' if one else 'them'}, so the rounds measure what {'it buys' if one else 'they buy'}, paired"
            + (f" (in place of trial {dropped[0].number}, the search's next best)" if dropped else ""))
    return Contenders(kept, notes, sib, (note,), planned if added else None, added)


def planned_trial(study, feasible: dict):
    """The trial of the config the planned search keeps as its best (``keys.PLAN_KEPT``) in ``feasible`` (config key ->
    trial, ``trials.feasible_by_config``); None where the plan kept none or that config is not among them."""
    kept = study.user_attrs.get(keys.PLAN_KEPT)
    return feasible.get(TrialConfig.from_dict(kept).key()) if kept else None


def near_misses(kept, feasible: dict, one_draw) -> list:
    """``(trial, OneDraw)`` of each config the planned search put out on one trial within the noise below the config
    it keeps as its best (``coordinate.Plan.one_draw`` compared with ``kept``, that config's trial: ``planned_trial``),
    nearest first, its trial from ``feasible`` (config key -> trial). Why: one trial against another minutes apart is
    the weakest comparison the search makes (fresh processes of one config differ by 5-20% here), and the near misses
    of the config the search settled on are where a finalist round buys the most: 2026-11-30g, tiny_vit at 10
    minutes, bf16 put out at -2.1% on its trial, x1.075 in the rounds of the 4-minute run that kept it."""
    if kept is None:
        return []
    kept_key, out = keys.config_of(kept).key(), []
    for d in sorted(one_draw, key=lambda d: -d.gap):
        t = feasible.get(d.key) if d.against == kept_key else None
        if t is not None and all(t is not x for x, _ in out):
            out.append((t, d))
    return out


def lighter_sibling(ranked: list, base, *, gap: float):
    """The measured config nearest the best one (``ranked[0]``) among those that are it with some of its knobs back
    at the baseline's values (the batch size the same): the fewest knobs apart from it (one, where the search
    measured the config before a one-knob step or a bundle's revert probes), then the fastest; within ``gap`` of it
    (``lost_gap``), the baseline itself aside (a finalist already). None when there is none. ``base``: the baseline
    trial (None: none measured). Knobs are counted as ``trials.knobs_apart`` counts them (a worker count's
    dependants folded into it).

    Why: the planned search keeps a knob on one trial above the window noise (``coordinate``), and two fresh
    processes of one config differ by more than that, so a knob that does nothing is sometimes kept on one lucky
    trial (``benchmarks/keep_rule.py`` counts how often), and a bundle of likely winners that won keeps its members
    unless reverting one wins. The finalists' rounds are paired, and their rule prefers, within noise, the config
    lighter on memory, then threads, then knobs changed from PyTorch's defaults (``finalists.choose``): with this
    sibling among them, the knob the best added last is measured against its absence before it reaches the
    recommendation.

    >>> from types import SimpleNamespace as T
    >>> t = lambda n, v, **c: T(number=n, value=v, user_attrs={"config": {"batch_size": 32, **c}})
    >>> base, best = t(0, 90.0), t(4, 100.0, malloc="retain", channels_last=True, amp="bf16")
    >>> ranked = [best, t(5, 99.0, malloc="tcmalloc"), t(2, 97.0, channels_last=True),
    ...           t(3, 96.0, channels_last=True, amp="bf16"), base]
    >>> lighter_sibling(ranked, base, gap=0.26).number                  # the best with retain back: one knob apart
    3
    >>> lighter_sibling([best, t(6, 99.0, channels_last=True, batch_size=64), base], base, gap=0.26) is None
    True
    """
    if not ranked or base is None or not ranked[0].value:
        return None
    best = ranked[0].user_attrs[keys.CONFIG]
    plain = base.user_attrs[keys.CONFIG]
    names = set(best) | set(plain)
    found = []  # (knobs apart from the best, rank): the nearest, then the fastest
    for rank, t in enumerate(ranked[1:]):
        c = t.user_attrs.get(keys.CONFIG) or {}
        if not t.value or ranked[0].value / t.value > 1.0 + gap:
            continue
        if c.get("batch_size") != best.get("batch_size") or c in (best, plain):  # the baseline: a finalist already
            continue
        if all(c.get(k) in (best.get(k), plain.get(k)) for k in names | set(c)):
            found.append((len(_apart(best, c)), rank, t))
    return min(found, key=lambda f: f[:2])[2] if found else None


def _apart(a: dict, b: dict) -> list[str]:
    """The knobs two stored configs differ in (``trials.knobs_apart``)."""
    return keys.knobs_apart(TrialConfig.from_dict(a), TrialConfig.from_dict(b))


def lost_gap(trials: list) -> float:
    """How far the best must outrun a config's one search trial for that config to have lost beyond the noise: the
    one-sided 95% bound of the ratio of two fresh processes of one config, ``exp(1.645 * sqrt(2) * s) - 1``, ``s``
    the spread between processes (sd of log) pooled over the configs measured more than once (repeats, reruns;
    measured trials only: status ok, no copies), at least ``LOSER_SPREAD`` (26.2% then). A window's spread says
    nothing of it (each process has its own level), and the best is the luckiest of several, so the floor is the
    middle of what these VMs show, not the least: a config left out here is one the rounds would not have chosen.

    >>> from types import SimpleNamespace as T
    >>> round(lost_gap([]), 3)
    0.262
    >>> t = lambda v, bs: T(value=v, user_attrs={"config": {"batch_size": bs}, "status": "ok"})
    >>> round(lost_gap([t(100.0, 8), t(70.0, 8), t(50.0, 16), t(35.0, 16)]), 2)   # each 100 and 70 in two runs
    0.8
    """
    groups: dict[str, list[float]] = {}
    for t in trials:
        ua = t.user_attrs
        if t.value and ua.get(keys.CONFIG) and ua.get(keys.STATUS) == "ok" and ua.get(keys.DUPLICATE_OF) is None:
            groups.setdefault(repr(sorted(ua[keys.CONFIG].items())), []).append(math.log(t.value))
    sq, dof = 0.0, 0
    for logs in groups.values():
        if len(logs) > 1:
            mean = sum(logs) / len(logs)
            sq, dof = sq + sum((x - mean) ** 2 for x in logs), dof + len(logs) - 1
    spread = max(LOSER_SPREAD, math.sqrt(sq / dof) if dof else 0.0)
    return math.exp(1.645 * math.sqrt(2.0) * spread) - 1.0


