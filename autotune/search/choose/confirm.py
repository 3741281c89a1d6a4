"""The claim a recommendation states comes from rounds that did not choose it.

Among configs within the noise of each other, the one whose measurements came out high wins the selection (the
search trials, the finalists' rounds) and would then report those high measurements: the winner's curse of any
selection. Re-measured by an independent loop, a claim of x1.66 was x1.48 (CPU) and x1.12 was x1.00 (H200) on
2026-11-26. So once the finalists have chosen, the winner and the baseline run again in fresh processes,
interleaved (A B, B A, A B, ...), in rounds the choice never saw, and the claim (samples/s, the speedup over the
baseline, its 95% interval) comes from these rounds alone.

How many rounds is fixed before the first one runs, never from the rounds themselves: stopping once an interval
came out narrow keeps the lucky narrow ones (stopped at 2 rounds that way, a "95%" interval covered 50-69%). The
count (``planned_rounds``) is the fewest, at least ``MIN_ROUNDS``, whose expected 95% interval is within
+/-``TARGET``, from an estimate of the noise the confirmation never sees (the finalists' own paired rounds,
``settle.round_spread``), at most ``MAX_ROUNDS``; time alone can cut it short: a round starts only if it is expected
to end within the budget (the first priced by ``Budget.run_s``, each later one as long as the last) or, with no
budget, while the rounds past the first two take at most ``NO_BUDGET_SHARE`` of the run so far. Each round is short
(``budget.confirm_measure``: 3 windows of 1 s): the interval is over rounds, so more short rounds narrow it more than
fewer long ones. The interval is ``settle.ratio_interval`` (Student's t over the rounds' log ratios), whose coverage at
every round count this stops at is shown by ``benchmarks/coverage.py`` (docs/claims.md). When not even
``MIN_ROUNDS`` rounds fit the time left, none runs and the claim says how long a --timeout would confirm it
(``Budget.confirm_timeout_s``).

What the rounds leave is ``confirmation.Confirmation``; the recommendation rewritten with its claim is
``rewrite.apply``; the time the confirmation keeps back from the finalists, and a round's expected time, are the
finalists' time plan (``time_plan``). ``confirmed`` does the three in turn for the tuner.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from autotune.measure import summarize
from autotune.search.choose.confirmation import LEVEL, Confirmation
from autotune.search.choose.rewrite import apply, selection_record
from autotune.search.choose.time_plan import expected_round_s

__all__ = ["confirm", "confirmed", "planned_rounds", "planning_spread", "MIN_ROUNDS", "MAX_ROUNDS", "TARGET",
           "NO_BUDGET_SHARE", "SPREAD_MIN_DF", "MIN_WINDOW_SHARE", "fit_windows", "format_timeout", "trial_of"]

MIN_ROUNDS = 2      # A B, B A: one round each way, so neither always runs first
MAX_ROUNDS = 10     # the most confirmation rounds (20 short runs): the interval then ~0.1x as wide as two rounds'
TARGET = 0.05       # rounds planned for an expected 95% interval within +/-5%
NO_BUDGET_SHARE = 0.10  # with no --timeout, rounds past two may take this share of the run so far
# The fewest degrees of freedom of the finalists' spread (``settle.round_spread``) the rounds are planned by; below
# it the estimate says nothing: one finalists' round of two configs (and their search trials) gives 1, and on
# 2026-11-28 (tiny_vit, 10 minutes, AMX Xeon) such an estimate planned 2 rounds whose 95% interval was x0.06-x21.9
SPREAD_MIN_DF = 3
# Two rounds that miss the time left by a little run with shorter windows (as many), never under this share of their
# length: on 2026-11-29 a 4-minute run's search overran its share by 3 s and its claim went unconfirmed (~73 s of
# rounds, 70 s left) where windows a few tenths of a second shorter fit. Both configs of a round run the same windows.
MIN_WINDOW_SHARE = 0.5
FIT_SLACK = 0.95  # the shortened rounds are planned to end this share of the time left in, not on the deadline


def _interval(rounds: list[dict]) -> tuple[float, float, float]:
    from autotune.search.choose.settle import ratio_interval

    return ratio_interval([r["winner"] for r in rounds], [r["baseline"] for r in rounds], LEVEL)


def planned_rounds(spread: float | None) -> int:
    """The confirmation's rounds, fixed before the first: the fewest ``n >= MIN_ROUNDS`` whose expected 95% interval
    (``t(n - 1) * spread / sqrt(n)``, the half-width of ``settle.ratio_interval`` in logs) is within +/-``TARGET``,
    ``spread`` being how far one round's log ratio strays, estimated from rounds the confirmation does not see (the
    finalists', ``settle.round_spread``); ``MAX_ROUNDS`` when there is no estimate.

    >>> planned_rounds(0.0), planned_rounds(0.01), planned_rounds(0.028), planned_rounds(0.07), planned_rounds(None)
    (2, 3, 4, 10, 10)
    """
    import math

    from autotune.search.choose.settle import t_quantile

    if spread is None:
        return MAX_ROUNDS
    fits = (n for n in range(MIN_ROUNDS, MAX_ROUNDS + 1)
            if t_quantile((1 + LEVEL) / 2, n - 1) * spread / math.sqrt(n) <= TARGET)
    return next(fits, MAX_ROUNDS)


def planning_spread(selection: dict | None) -> float | None:
    """The finalists' round spread the confirmation plans its rounds by (``planned_rounds``): None (the most rounds
    the time allows) where it rests on fewer than ``SPREAD_MIN_DF`` degrees of freedom, or says none.

    >>> planning_spread({"round_spread": 0.01, "round_spread_df": 1}), planning_spread({"round_spread": 0.01,
    ...                                                                                "round_spread_df": 4})
    (None, 0.01)
    """
    sel = selection or {}
    return sel.get("round_spread") if (sel.get("round_spread_df") or 0) >= SPREAD_MIN_DF else None


def format_timeout(seconds: float) -> str:
    """A --timeout as the CLI takes it: ``6m``, ``1h30m``, ``45s``."""
    s = int(round(seconds))
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v) or "0s"


def fit_windows(budget: Any, measure: Any, round_s: float) -> tuple[Any, float]:
    """``(measure, round_s)`` for the confirmation's ``MIN_ROUNDS`` rounds: as they are when they fit the time the
    ``budget`` has left (or nothing bounds them); else with each window shortened by what the rounds overrun
    (``FIT_SLACK`` of the time left their aim), when that keeps it at least ``MIN_WINDOW_SHARE`` of its length; else
    as they are (``_no_time`` then says what --timeout would confirm it).

    >>> from types import SimpleNamespace as N
    >>> from autotune.config import MeasureSpec
    >>> m = MeasureSpec(windows=3, window_s=3.0)
    >>> budget = lambda left: N(deadline=1.0, left_s=lambda: left)
    >>> fitted, r = fit_windows(budget(70.0), m, 36.5)                  # 73 s of rounds, 70 s left
    >>> round(fitted.window_s, 2), round(r, 2)
    (2.46, 33.25)
    >>> fit_windows(budget(40.0), m, 36.5)[0] is m                      # windows under half their length: no
    True
    """
    left = budget.left_s() if budget.deadline is not None else None
    if left is None or round_s <= 0 or MIN_ROUNDS * round_s <= left:
        return measure, round_s
    # the winner's and the baseline's in each round; by turns a window's second costs 1 + turn_extra of the round's
    per = 1.0 + (budget.turns() if hasattr(budget, "turns") else 0.0)
    windows = MIN_ROUNDS * 2 * measure.windows * per
    cut = (MIN_ROUNDS * round_s - FIT_SLACK * left) / windows
    if measure.window_s - cut < MIN_WINDOW_SHARE * measure.window_s:
        return measure, round_s
    return measure.replace(window_s=measure.window_s - cut), round_s - 2 * measure.windows * cut * per


def _no_time(budget: Any, round_s: float, rule: str, log: Callable[[str], None]) -> Confirmation | None:
    """A failed Confirmation saying what --timeout would confirm the claim, when ``MIN_ROUNDS`` rounds of ``round_s``
    do not fit the time ``budget`` has left; None when they do (or nothing says how long a round takes)."""
    left = budget.left_s()
    if budget.deadline is None or round_s <= 0 or MIN_ROUNDS * round_s <= left:
        return None
    why = (f"no time was left in the budget for the {MIN_ROUNDS} confirmation rounds (~{MIN_ROUNDS * round_s:.0f} s, "
           f"{left:.0f} s left): --timeout {format_timeout(budget.confirm_timeout_s(round_s, left_s=left))} "
           "would confirm it")
    log(f"claim not confirmed: {why}")
    return Confirmation((), status="failed", rule=rule, why=why)


def confirm(winner: Any, baseline: Any, *, runner: Callable[..., Any], workload: Any, measure: Any, log_dir: Any,
            log: Callable[[str], None], budget: Any, round_s: float = 0.0,
            spread: float | None = None, by_turns: bool = False) -> Confirmation:
    """Run the confirmation rounds (module docstring) of ``winner`` against ``baseline`` (``TrialConfig``s), each
    run a fresh child through ``runner`` measured by ``measure`` (``budget.confirm_measure``): ``planned_rounds(
    spread)`` of them, fixed now, cut short only by time: ``budget`` (``search.budget.Budget``) with a deadline,
    a round starts only if it would end before it (the first as long as ``round_s``, its estimate:
    ``expected_round_s``; each later one as long as the last); without one, rounds past ``MIN_ROUNDS`` take at most
    ``NO_BUDGET_SHARE`` of the run so far. None starts when ``MIN_ROUNDS`` would not fit (the claim says what
    --timeout would confirm it). ``by_turns``: each round's two fresh processes alive at once, taking turns
    (``finalist_rounds.run_configs``)."""
    from autotune.search.choose.finalist_rounds import rounds_way, run_configs, run_line, run_log

    planned, deadline, search_s = planned_rounds(spread), budget.deadline, budget.elapsed_s()
    limit = ("the time left in the budget" if deadline is not None else
             f"{NO_BUDGET_SHARE:.0%} of the run so far ({NO_BUDGET_SHARE * search_s:.0f} s) past the first two")
    asked = measure
    measure, round_s = fit_windows(budget, measure, round_s)
    shorter = (f" of {measure.window_s:.1f} s (not {asked.window_s:g} s: the two rounds fit the time left only so)"
               if measure is not asked else f" of {measure.window_s:g} s")
    rule = (f"{planned} rounds of {measure.windows} windows{shorter}"
            + (f", the two {rounds_way(True)}" if by_turns else "") + ", fixed before the first "
            + (f"from the finalists' rounds (one round's ratio strays +/-{100 * spread:.1f}%)" if spread is not None
               else "(no estimate of the noise: the most)") + f", cut short only by {limit}")
    log(f"confirming the claim: {winner.short()} against the baseline {baseline.short()}, interleaved, in fresh "
        f"processes ({rule})")
    none = _no_time(budget, round_s, rule, log)
    if none is not None:
        return none
    rounds: list[dict] = []
    last_s = extra_s = 0.0  # the last round's time; the time of the rounds past MIN_ROUNDS
    while len(rounds) < planned:
        if deadline is not None and rounds and time.monotonic() + last_s > deadline:
            break
        if deadline is None and len(rounds) >= MIN_ROUNDS and extra_s + last_s > NO_BUDGET_SHARE * search_s:
            break
        t0 = time.monotonic()
        order = [("winner", winner), ("baseline", baseline)]
        if len(rounds) % 2:
            order.reverse()
        got: dict[str, list[float]] = {}
        results = run_configs([c for _, c in order], [run_log(log_dir, f"confirm-{len(rounds)}", c)
                                                      if log_dir is not None else None for _, c in order],
                              runner=runner, workload=workload, measure=measure, by_turns=by_turns)
        for (role, c), res in zip(order, results):
            log(run_line(f"confirmation {len(rounds) + 1}", c, res))
            if not res.ok or not res.samples_per_s:
                return Confirmation(tuple(rounds), status="failed", rule=rule,
                                    why=f"the {role}'s run {res.status}" + (f": {res.reason}" if res.reason else ""))
            got[role] = [float(x) for x in res.samples_per_s]
        rounds.append(got)
        last_s = time.monotonic() - t0
        extra_s += last_s if len(rounds) > MIN_ROUNDS else 0.0
    if len(rounds) < MIN_ROUNDS:
        w, b = (summarize(rounds[0][k]).median for k in ("winner", "baseline"))
        return Confirmation(tuple(rounds), ratio=w / b, status="unconfirmed", rule=rule,
                            why="the second round would have run past the budget; a longer --timeout confirms it")
    ratio, lo, hi = _interval(rounds)
    return Confirmation(tuple(rounds), ratio=ratio, low=lo, high=hi, rule=rule)


def trial_of(rec: Any, trials: list) -> Any:
    """The search trial of ``rec``'s config among ``trials``; else the longest of them (None without any)."""
    from autotune.search.record import trials as keys

    mine = [t for t in trials if t is not None and t.number == rec.trial_number]
    return mine[0] if mine else max(trials, key=lambda t: t.user_attrs.get(keys.WALL_S) or 0.0, default=None)


def confirmed(rec: Any, base_trial: Any, *, runner: Callable[..., Any], workload: Any, measure: Any, log_dir: Any,
              log: Callable[[str], None], budget: Any, trials: list = (), by_turns: bool = False) -> Any:
    """``rec`` with its claim confirmed (``confirm`` then ``apply``); as it is when there is no recommendation or
    no baseline trial; a recommendation that is the baseline has nothing to confirm, and says so. ``trials``: the
    finalists' search trials, the winner's among them (a round's expected time, ``expected_round_s``: the
    longest of theirs stands in for a winner not found). ``budget`` (``search.budget.Budget``): its end bounds the
    rounds; without one, the run so far does (``confirm``)."""
    from autotune.provenance import reproduce_command
    from autotune.search.record import trials as keys

    if rec is None or base_trial is None:
        return rec
    baseline = keys.config_of(base_trial)
    if baseline.key() == rec.config.key():
        conf = Confirmation((), ratio=1.0, status="baseline", why="the recommendation is PyTorch's defaults")
        return dataclasses.replace(rec, selection=selection_record(rec),
                                   confirmation={**conf.to_dict(), "baseline_config": baseline.to_dict(),
                                                 "headline": "x1.00: the recommendation is PyTorch's defaults "
                                                 "(nothing to confirm)"})
    conf = confirm(rec.config, baseline, runner=runner, workload=workload, measure=measure, log_dir=log_dir, log=log,
                   budget=budget, round_s=expected_round_s([trial_of(rec, trials), base_trial], budget),
                   spread=planning_spread(rec.selection), by_turns=by_turns)
    log(f"claim: {conf.headline()}")
    return apply(rec, conf, baseline, reproduce=lambda c: reproduce_command(workload, c, measure.memory_cap_mb),
                 base_figures=dict(base_trial.user_attrs))
