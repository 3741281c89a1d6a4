"""The finalists' time plan: how the time a run has left after its search is split between the finalists' rounds,
the checks of the winner and the confirmation's rounds (``plan_finalists``), and what one confirmation round is
expected to take (``expected_round_s``), both priced by the budget's one estimate (``search.budget.Budget``).

Who of the top trials gets a round at all is ``contenders``; which of them fit the time, and for how many rounds,
``finalists.plan``, which ``plan_finalists`` asks.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["plan_finalists", "expected_round_s"]


def plan_finalists(top: list, base: Any, *, plan: Callable[..., Any], budget: Any, checks_s: float,
                   log: Callable[[str], None]) -> tuple[Any, Any]:
    """``(the finalists' deadline, plan(...))`` for the top trials ``top`` and the baseline trial ``base``, ``plan``
    being ``finalists.plan``, within the run's ``budget`` (``search.budget.Budget``): the finalists get the time
    to its end less ``checks_s`` (numerics, worst case) and the confirmation's rounds (``Budget.confirm_rounds_s``,
    priced from the likely winner's and the baseline's walls; none without a baseline trial, which leaves nothing
    to confirm against). When that leaves them not even one round, the confirmation comes first: no finalist round
    runs, the best search trial is recommended provisionally and its claim confirmed (``(deadline, None)``: a
    confirmed claim of the likely best says more than one round of the top few would; the issue's 4-minute run
    left its time unused that way). Only when the confirmation keeps nothing back (its two rounds do not fit) do the
    finalists get all the time; None when not even then does a round fit."""
    import functools

    plan = functools.partial(plan, budget=budget, rounds=budget.rounds)
    deadline = budget.deadline
    if deadline is None:
        return None, plan(top, base, left_s=None, log=log)
    one = expected_round_s([top[0], base], budget) if top and base is not None else 0.0
    keep = budget.confirm_rounds_s(one)
    finalists_end = deadline - checks_s - keep
    said: list[str] = []
    chosen = plan(top, base, left_s=max(0.0, finalists_end - time.monotonic()), log=said.append)
    if chosen is None and keep > 0 and top[0] is not base:  # the claim first (the docstring)
        log(f"no finalist round fits beside the confirmation's {keep:.0f} s: the best search trial is recommended, "
            "provisional, and its claim confirmed in rounds of its own")
        return finalists_end, None
    if chosen is None:
        finalists_end = deadline - checks_s
        return finalists_end, plan(top, base, left_s=max(0.0, finalists_end - time.monotonic()), log=log)
    for line in said:
        log(line)
    return finalists_end, chosen


def expected_round_s(pair: list, budget: Any) -> float:
    """A confirmation round's expected time: a run of each of the two trials in ``pair`` (the winner's and the
    baseline's search trials) as the confirmation measures it (``budget.confirm_measure``), priced by the
    ``budget``'s one estimate (``Budget.round_s``)."""
    from autotune.search.budget import confirm_measure
    from autotune.search.record import trials as keys

    walls = [t.user_attrs.get(keys.WALL_S) or 0.0 for t in pair if t is not None]
    return budget.round_s(walls, confirm_measure(budget.measure) if budget.measure is not None else None)
