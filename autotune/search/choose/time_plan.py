"""The finalists' time plan: how the time a run has left after its search is split between the finalists' rounds,
the checks of the winner and the confirmation's rounds (``plan_finalists``), and what one confirmation round is
expected to take (``expected_round_s``), both priced by the budget's one estimate (``search.budget.Budget``) from
what one more run of a trial's config costs (``rerun_wall_s``: its search trial's wall, where that trial compiled,
with the compile a run that finds the study's inductor cache pays).

Who of the top trials gets a round at all is ``contenders``; which of them fit the time, and for how many rounds,
``finalists.plan``, which ``plan_finalists`` asks.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["plan_finalists", "expected_round_s", "rerun_wall_s", "CACHED_COMPILE_SHARE"]

# What a run of a compile config pays for compiling once the study's inductor cache holds its graphs
# (``Tuner.compile_cache_dir``: the finalists and the confirmation run with it), as a share of the first, cold
# compile: dynamo still traces, inductor loads its FX graphs and kernels. Measured (benchmarks/cached_compile.py,
# 2-core Xeon with AMX, 2026-11-28, 32 px, batch 64, mode default): resnet18 86.6 s cold, 2.9 s cached (3.4%);
# mobilenet_v3_small 141.0 s cold, 5.8-6.1 s cached (4.1-4.3%); priced at about twice the most seen. Until then a
# re-run was priced at the cold trial's wall: a 10-minute run kept 162 s for two confirmation rounds that took ~28 s
# each, and so no finalist round fitted. A run that misses the cache (another machine's trial, on Ray) costs more.
CACHED_COMPILE_SHARE = 0.10


def plan_finalists(top: list, base: Any, *, plan: Callable[..., Any], budget: Any, checks_s: float,
                   log: Callable[[str], None]) -> tuple[Any, Any]:
    """``(the finalists' deadline, plan(...))`` for the top trials ``top`` and the baseline trial ``base``, ``plan``
    being ``finalists.plan``, within the run's ``budget`` (``search.budget.Budget``): the finalists get the time to
    its end less ``checks_s`` (numerics, worst case) and the confirmation's rounds (``Budget.confirm_rounds_s``,
    priced from the likely winner's and the baseline's walls; none without a baseline trial, which leaves nothing to
    confirm against), their rounds priced ``RUN_MARGIN`` longer. When that leaves them not even one round, the
    confirmation comes first: no finalist round runs, the best search trial is recommended provisionally and its
    claim confirmed (``(deadline, None)``: a confirmed claim of the likely best says more than one round of the top
    few would; the issue's 4-minute run left its time unused that way). Only when the confirmation keeps nothing
    back (its two rounds do not fit) do the finalists get all the time; None when not even then does a round fit."""
    import functools

    from autotune.search.budget import RUN_MARGIN

    plan = functools.partial(plan, budget=budget, rounds=budget.rounds)
    deadline = budget.deadline
    if deadline is None:
        return None, plan(top, base, left_s=None, log=log)
    one = expected_round_s([top[0], base], budget) if top and base is not None else 0.0
    keep = budget.confirm_rounds_s(one)
    finalists_end = deadline - checks_s - keep
    said: list[str] = []
    # planned to end before their deadline though each run takes RUN_MARGIN longer than priced: the confirmation
    # after them keeps its rounds
    chosen = plan(top, base, left_s=max(0.0, finalists_end - time.monotonic()) / RUN_MARGIN, log=said.append)
    if chosen is None and keep > 0 and top[0] is not base:  # the claim first (the docstring)
        log(f"no finalist round fits beside the confirmation's {keep:.0f} s: the best search trial is recommended, "
            "provisional, and its claim confirmed in rounds of its own")
        return finalists_end, None
    if chosen is None:
        finalists_end = deadline - checks_s
        return finalists_end, plan(top, base, left_s=max(0.0, finalists_end - time.monotonic()) / RUN_MARGIN,
                                   log=log)
    for line in said:
        log(line)
    return finalists_end, chosen


def expected_round_s(pair: list, budget: Any) -> float:
    """A confirmation round's expected time: a run of each of the two trials in ``pair`` (the winner's and the
    baseline's search trials) as the confirmation measures it (``budget.confirm_measure``), priced by the
    ``budget``'s one estimate (``Budget.round_s``)."""
    from autotune.search.budget import confirm_measure

    walls = [rerun_wall_s(t) for t in pair if t is not None]
    return budget.round_s(walls, confirm_measure(budget.measure) if budget.measure is not None else None)


def rerun_wall_s(trial: Any) -> float:
    """What one more run of ``trial``'s config costs, as ``Budget.run_s`` takes it: the trial's wall (0 where it has
    none), less what its compile took beyond ``CACHED_COMPILE_SHARE`` of it: the finalists' and the confirmation's
    runs load the study's inductor cache that this trial (or the first of its graph) filled.

    >>> from types import SimpleNamespace as T
    >>> rerun_wall_s(T(user_attrs={"wall_s": 20.0}))
    20.0
    >>> rerun_wall_s(T(user_attrs={"wall_s": 100.0, "compile_s": 80.0}))   # 20 s of the run, 8 s of cached compile
    28.0
    """
    from autotune.search.record import trials as keys

    ua = trial.user_attrs
    wall = float(ua.get(keys.WALL_S) or 0.0)
    compile_s = ua.get(keys.COMPILE_S)
    if not isinstance(compile_s, (int, float)) or compile_s <= 0:
        return wall
    return max(0.0, wall - (1.0 - CACHED_COMPILE_SHARE) * min(float(compile_s), wall))
