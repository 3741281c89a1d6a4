"""Who gets a finalist round, and how long a finalist run is: the finalists' rounds cost the budget the search
would otherwise spend (issue 50), so a config whose search figure lost beyond the noise gets none (``contenders``,
``lost_gap``), and the windows of a run are sized by the noise the search trials' windows showed
(``window_noise``, read by ``search.budget.finalist_windows``).

May import what the rest of ``choose`` may (``search.budget``, ``search.record`` and below).
"""

from __future__ import annotations

import math

from autotune.search.record import trials as keys

__all__ = ["contenders", "lost_gap", "window_noise"]


def contenders(ranked: list, *, k: int, gap: float) -> tuple[list, tuple[str, ...]]:
    """``(the finalists, a note on those left out)``: the first ``k`` of ``ranked`` (feasible trials, best first),
    less those whose search figure lost to the best's by more than ``gap`` (``lost_gap``: beyond what two fresh
    processes of one config differ by); their rounds would buy nothing but time the search spends better (issue
    50). The best always stays.

    >>> from types import SimpleNamespace as T
    >>> top, note = contenders([T(number=3, value=100.0), T(number=7, value=90.0), T(number=1, value=80.0)],
    ...                        k=3, gap=0.123)
    >>> [t.number for t in top], len(note)
    ([3, 7], 1)
    >>> note[0].split(", ")[1]
    'beyond the 12% that two fresh processes of one config differ by'
    """
    top = list(ranked[: max(1, k)])
    if not top or not top[0].value:
        return top, ()
    best = top[0]
    out = [t for t in top[1:] if (t.value or 0.0) < best.value * (1.0 - gap)]
    notes = tuple(f"no finalist round for trial {t.number}: its search figure was "
                  f"{100 * (1 - (t.value or 0.0) / best.value):.0f}% below the best (trial {best.number}), beyond "
                  f"the {100 * gap:.0f}% that two fresh processes of one config differ by" for t in out)
    return [t for t in top if t not in out], notes


def lost_gap(trials: list) -> float:
    """How far below the best a config's one search trial must be to have lost beyond the noise: the one-sided 95%
    bound of the ratio of two fresh processes of one config, ``exp(1.645 * sqrt(2) * s) - 1``, ``s`` the spread
    between processes (sd of log) pooled over the configs ``trials`` measured more than once (repeats, reruns), at
    least ``budget.PROCESS_SPREAD`` (12.3% then): a window's spread says nothing of it (each process has its own
    level), so a gap within it leaves the order to the finalists' rounds.

    >>> from types import SimpleNamespace as T
    >>> round(lost_gap([]), 3)
    0.123
    >>> t = lambda v, bs: T(value=v, user_attrs={"config": {"batch_size": bs}})
    >>> round(lost_gap([t(100.0, 8), t(80.0, 8), t(50.0, 16), t(40.0, 16)]), 2)   # two configs 20% apart twice
    0.44
    """
    from autotune.search.budget import PROCESS_SPREAD

    groups: dict[str, list[float]] = {}
    for t in trials:
        if t.value and t.user_attrs.get(keys.CONFIG):
            groups.setdefault(repr(sorted(t.user_attrs[keys.CONFIG].items())), []).append(math.log(t.value))
    sq, dof = 0.0, 0
    for logs in groups.values():
        if len(logs) > 1:
            mean = sum(logs) / len(logs)
            sq, dof = sq + sum((x - mean) ** 2 for x in logs), dof + len(logs) - 1
    spread = max(PROCESS_SPREAD, math.sqrt(sq / dof) if dof else 0.0)
    return math.exp(1.645 * math.sqrt(2.0) * spread) - 1.0


def window_noise(trials: list) -> float | None:
    """The median relative IQR of ``trials``' windows (``finalist_windows`` sizes the finalists' runs by it); None
    when none says."""
    from autotune.measure import median_or_none

    return median_or_none([t.user_attrs[keys.REL_IQR] for t in trials
                           if isinstance(t.user_attrs.get(keys.REL_IQR), (int, float))])
