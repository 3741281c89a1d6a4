"""The claim a recommendation states comes from rounds that did not choose it.

Among configs within the noise of each other, the one whose measurements came out high wins the selection (the
search trials, the finalists' rounds) and would then report those high measurements: the winner's curse of any
selection. Re-measured by an independent loop, a claim of x1.66 was x1.48 (CPU) and x1.12 was x1.00 (H200) on
2026-11-26. So once the finalists have chosen, the winner and the baseline run again in fresh processes,
interleaved (A B, B A, A B, ...), in rounds the choice never saw, and the claim (samples/s, the speedup over the
baseline, its 95% interval) comes from these rounds alone (``Confirmation``).

How many rounds is fixed before the first one runs, never from the rounds themselves: stopping once an interval
came out narrow keeps the lucky narrow ones (stopped at 2 rounds that way, a "95%" interval covered 50-69%). The
count (``planned_rounds``) is the fewest, at least ``MIN_ROUNDS``, whose expected 95% interval is within
+/-``TARGET``, from an estimate of the noise the confirmation never sees (the finalists' own paired rounds,
``settle.round_spread``), at most ``MAX_ROUNDS``; time alone can cut it short: a round starts only if it is expected
to end within the budget (the first priced by ``Budget.run_s``, each later one as long as the last) or, with no
budget, while the rounds past the first two take at most ``NO_BUDGET_SHARE`` of the run so far. Each round is short
(``budget.confirm_measure``: 3 windows): the interval is over rounds, so more short rounds narrow it more than fewer
long ones. The interval is ``settle.ratio_interval`` (Student's t over the rounds' log ratios), whose coverage at
every round count this stops at is shown by ``benchmarks/coverage.py`` (docs/claims.md). When not even
``MIN_ROUNDS`` rounds fit the time left, none runs and the claim says how long a --timeout would confirm it
(``Budget.confirm_timeout_s``). A claim whose interval is wider than +/-``NOISY`` says "noisy" in its headline.

When the confirmation disagrees with the choice (the winner no faster than the baseline, or slower), the headline
says so and no gain is reported that the confirmation did not see; a winner the confirmation measured slower than
the baseline beyond the noise (and not noisy itself) is not recommended: the baseline is (``apply``). When it
fails (a run out of memory, crashed or timed out, or no round fitted), the claim's figures (samples/s, baseline,
speedup) are left empty, the selection's kept apart in ``selection``: the recommendation states no figure that
the confirmation did not measure. One round (the budget ended before the second) is no claim either: its ratio has
no interval, so the figures are left empty the same way, the round's ratio is kept in the confirmation record as
``one_round_ratio``, and the claim line says so (``unconfirmed: one round only, x1.20 in it and no interval``).

>>> c = Confirmation(rounds=({"winner": [150.0, 152.0], "baseline": [100.0, 101.0]},
...                          {"winner": [149.0, 151.0], "baseline": [99.0, 100.0]}), ratio=1.5, low=1.47, high=1.53)
>>> c.headline()
'x1.50 (95% interval x1.47 to x1.53), confirmed over 2 interleaved rounds'
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from autotune.measure import summarize

__all__ = ["Confirmation", "confirm", "confirmed", "expected_round_s", "plan_finalists", "planned_rounds",
           "MIN_ROUNDS", "MAX_ROUNDS", "TARGET", "NOISY", "NO_BUDGET_SHARE", "unconfirmed_line", "apply",
           "selection_record", "format_timeout"]

MIN_ROUNDS = 2      # A B, B A: one round each way, so neither always runs first
MAX_ROUNDS = 10     # the most confirmation rounds (20 short runs): the interval then ~0.1x as wide as two rounds'
TARGET = 0.05       # rounds planned for an expected 95% interval within +/-5% ...
NOISY = 0.10        # ... and a claim wider than +/-10% says "noisy" in its headline
NO_BUDGET_SHARE = 0.10  # with no --timeout, rounds past two may take this share of the run so far
LEVEL = 0.95        # the claim's interval


@dataclass(frozen=True)
class Confirmation:
    """The confirmation rounds (each ``{"winner": windows, "baseline": windows}``, in the order run) and the claim
    from them alone: the ratio of the winner's median to the baseline's and its 95% interval; ``status`` is
    ``confirmed`` (>= 2 rounds), ``unconfirmed`` (one: the budget; its ratio is said, never as a claim) or
    ``failed`` (a run did not finish: ``why``)."""

    rounds: tuple[dict, ...]
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    status: str = "confirmed"
    why: str = ""
    rule: str = ""  # how many rounds it could take, and why
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:  # held as the record keeps them (4 decimals): a headline read back is the same
        for name in ("ratio", "low", "high"):
            x = getattr(self, name)
            if x is not None:
                object.__setattr__(self, name, round(float(x), 4))

    @property
    def winner_median(self) -> float | None:
        xs = [x for r in self.rounds for x in r.get("winner", ())]
        return summarize(xs).median if xs else None

    @property
    def baseline_median(self) -> float | None:
        xs = [x for r in self.rounds for x in r.get("baseline", ())]
        return summarize(xs).median if xs else None

    @property
    def half_width(self) -> float | None:
        if self.low is None or self.high is None or not self.ratio:
            return None
        return max(self.high / self.ratio - 1, 1 - self.low / self.ratio)

    @property
    def noisy(self) -> bool:
        return self.half_width is not None and self.half_width > NOISY

    def headline(self) -> str:
        """The claim in one line: ``x1.47 (95% interval x1.38 to x1.57)``, said noisy, unconfirmed or failed."""
        if self.status == "failed" or self.ratio is None:
            return f"unconfirmed: {self.why or 'no confirmation round finished'}"
        n = len(self.rounds)
        interval = (f" (95% interval x{self.low:.2f} to x{self.high:.2f})"
                    if self.low is not None and self.high is not None and n > 1 else "")
        head = f"x{self.ratio:.2f}{interval}"
        if self.status == "unconfirmed":  # a figure with no interval: said, never as the claim
            return f"unconfirmed: one round only, x{self.ratio:.2f} in it and no interval: one round is no claim " \
                   f"({self.why})"
        head += f", confirmed over {n} interleaved rounds"
        if self.noisy:
            head += f", noisy (+/-{100 * self.half_width:.0f}%)"
        if self.high is not None and self.high < 1:
            head += ": slower than the baseline"
        elif self.low is not None and self.low <= 1:
            head += ": no gain over the baseline shown"
        return head

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        # one round's ratio is kept under its own name: a reader of ``speedup_vs_baseline`` finds no claim there
        one = self.status == "unconfirmed"
        return {"status": self.status, "why": self.why, "rule": self.rule, "notes": list(self.notes),
                "speedup_vs_baseline": None if one else r(self.ratio), "interval": [r(self.low), r(self.high)],
                **({"one_round_ratio": r(self.ratio)} if one else {}),
                "median_samples_per_s": r(self.winner_median), "baseline_samples_per_s": r(self.baseline_median),
                "rounds": [{k: [round(x, 3) for x in v] for k, v in rd.items()} for rd in self.rounds],
                "headline": self.headline()}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Confirmation | None:
        if not d:
            return None
        low, high = (d.get("interval") or [None, None])[:2]
        ratio = d.get("speedup_vs_baseline", d.get("one_round_ratio"))
        ratio = d.get("one_round_ratio") if ratio is None else ratio
        return cls(rounds=tuple(d.get("rounds") or ()), ratio=ratio, low=low, high=high,
                   status=str(d.get("status", "confirmed")), why=str(d.get("why", "")), rule=str(d.get("rule", "")),
                   notes=tuple(d.get("notes") or ()))


def unconfirmed_line(*, provisional: bool = False) -> str:
    """What a recommendation without confirmation rounds says of its claim: a provisional one (the budget left no
    finalist round, so nothing was confirmed), or one from before confirmation rounds (autotune before 2026-11-27)."""
    if provisional:
        return ("unconfirmed: provisional, the figures are its search trial's own (no finalist round ran: a run "
                "that finishes, or `autotune run --trials 0` with time for the finalists, confirms it)")
    return "unconfirmed: the figures are the selection's own (no confirmation rounds: autotune before 2026-11-27)"


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


def format_timeout(seconds: float) -> str:
    """A --timeout as the CLI takes it: ``6m``, ``1h30m``, ``45s``."""
    s = int(round(seconds))
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v) or "0s"


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
            spread: float | None = None) -> Confirmation:
    """Run the confirmation rounds (module docstring) of ``winner`` against ``baseline`` (``TrialConfig``s), each
    run a fresh child through ``runner`` measured by ``measure`` (``budget.confirm_measure``): ``planned_rounds(
    spread)`` of them, fixed now, cut short only by time: ``budget`` (``search.budget.Budget``) with a deadline,
    a round starts only if it would end before it (the first as long as ``round_s``, its estimate:
    ``expected_round_s``; each later one as long as the last); without one, rounds past ``MIN_ROUNDS`` take at most
    ``NO_BUDGET_SHARE`` of the run so far. None starts when ``MIN_ROUNDS`` would not fit (the claim says what
    --timeout would confirm it)."""
    from autotune.search.choose.finalist_rounds import run_line, run_log

    planned, deadline, search_s = planned_rounds(spread), budget.deadline, budget.elapsed_s()
    limit = ("the time left in the budget" if deadline is not None else
             f"{NO_BUDGET_SHARE:.0%} of the run so far ({NO_BUDGET_SHARE * search_s:.0f} s) past the first two")
    rule = (f"{planned} rounds of {measure.windows} windows, fixed before the first "
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
        for role, c in order:
            kw = {"log_path": run_log(log_dir, f"confirm-{len(rounds)}", c)} if log_dir is not None else {}
            res = runner(workload, c, measure, **kw)
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


def selection_record(rec: Any) -> dict[str, Any]:
    """What chose the recommendation, kept apart from the claim: the finalists' figures and rounds."""
    return {**(rec.selection or {}),  # what the finalists kept there (their rounds' spread, ``finalists.choose``)
            "median_samples_per_s": rec.median_samples_per_s, "iqr_samples_per_s": rec.iqr_samples_per_s,
            "samples_per_s": list(rec.samples_per_s), "baseline_samples_per_s": rec.baseline_samples_per_s,
            "speedup_vs_baseline": rec.speedup_vs_baseline, "finalist_rounds": rec.finalist_rounds,
            "search_round_pooled": rec.search_round_pooled, "trial": rec.trial_number,
            "margin_vs_runner_up": rec.margin_vs_runner_up,
            "margin_interval": list(rec.margin_interval) if rec.margin_interval else None}


def apply(rec: Any, conf: Confirmation, baseline: Any, *, reproduce: Callable[[Any], str] | None = None,
          base_figures: dict | None = None) -> Any:
    """``rec`` (a Recommendation) with its claim from ``conf``: the confirmed samples/s, baseline and speedup, the
    selection's own figures kept apart; when the confirmation saw the winner slower than the baseline beyond the
    noise, the baseline's config is recommended instead, with both figures said, and every figure of the record
    is the baseline's (its windows from the confirmation, its peaks from ``base_figures``, its search trial's user
    attributes) or left out, never the winner's."""
    selection = selection_record(rec)
    notes = list(rec.notes)
    record = {**conf.to_dict(), "baseline_config": baseline.to_dict()}  # what the claim is against
    # no figure the confirmation did not measure, nor one round's (no interval: no claim); the selection's stay in
    # ``selection``, the round's ratio in the confirmation record (``one_round_ratio``), the claim line says why
    if conf.ratio is None or conf.status == "unconfirmed":
        return dataclasses.replace(rec, median_samples_per_s=None, iqr_samples_per_s=None, samples_per_s=(),
                                   baseline_samples_per_s=None, speedup_vs_baseline=None, noisy=False,
                                   selection=selection, confirmation=record,
                                   notes=tuple(notes + [f"claim {conf.headline()}"]))
    winner_med, base_med = conf.winner_median, conf.baseline_median
    sel = rec.speedup_vs_baseline
    # the selection's stand-in for the baseline is the selection's only: the claim's baseline ran in these rounds
    notes = [n + "; the claim's baseline is the confirmation's own rounds" if n.startswith("baseline figure from its "
             "search trial") else n for n in notes]
    if sel and conf.high is not None and conf.high < sel and conf.status == "confirmed":
        notes.append(f"the selection measured x{sel:.2f}; rounds that did not choose it measure x{conf.ratio:.2f}: "
                     "the claim is theirs (the selection's luck is left out)")
    # the claim's figures are the confirmation's, its windows too (the selection's are kept in ``selection``)
    won = tuple(x for r in conf.rounds for x in r["winner"])
    spread = summarize(won)
    out = dataclasses.replace(rec, median_samples_per_s=round(winner_med, 3), samples_per_s=won,
                              iqr_samples_per_s=round(spread.iqr, 3), noisy=spread.noisy,
                              baseline_samples_per_s=round(base_med, 3), speedup_vs_baseline=round(conf.ratio, 3),
                              selection=selection, confirmation=record, notes=tuple(notes))
    # slower beyond the noise, and the confirmation not itself noisy (a +/-70% interval on a busy VM says nothing the
    # selection's rounds did not): the defaults stand
    if conf.status == "confirmed" and conf.high is not None and conf.high < 1 and not conf.noisy:
        from autotune.search.record import trials as keys

        ua, windows = base_figures or {}, tuple(x for r in conf.rounds for x in r["baseline"])
        out = dataclasses.replace(
            out, config=baseline, trial_number=None, speedup_vs_baseline=1.0, median_samples_per_s=round(base_med, 3),
            samples_per_s=windows, iqr_samples_per_s=round(summarize(windows).iqr, 3), noisy=summarize(windows).noisy,
            peak_host_mb=ua.get(keys.PEAK), peak_device_mb=ua.get(keys.PEAK_DEVICE),
            peak_device_allocated_mb=ua.get(keys.PEAK_DEVICE_ALLOCATED), margin_vs_runner_up=None,
            margin_interval=None, worst_case=None, latency_ms=None,
            reproduce=reproduce(baseline) if reproduce is not None else "", parity=None, compile=None,
            notes=out.notes + (f"{rec.config.short()} won the selection (x{sel or 0:.2f}) but ran slower than the "
                               f"baseline in the confirmation ({conf.headline()}): PyTorch's defaults are "
                               "recommended",))
        return out
    return dataclasses.replace(out, notes=out.notes + tuple(_runner_up_above(rec, conf, baseline)))


def _runner_up_above(rec: Any, conf: Confirmation, baseline: Any) -> list[str]:
    """A note when a runner-up's speedup in the selection (its finalist rounds' median over the baseline's there) is
    above the winner's confirmed interval: the evidence of the two disagrees, and the line says so. The baseline
    among the runners-up is not one (its own speedup is 1 by definition)."""
    from autotune.config import TrialConfig

    base = rec.baseline_samples_per_s  # the selection's, before the claim replaces it
    if conf.status != "confirmed" or conf.high is None or not base:
        return []
    for ru in rec.runners_up:
        m = ru.get("median_samples_per_s")
        if ru.get("config") and TrialConfig.from_dict(ru["config"]).key() == baseline.key():
            continue
        if m and m / base > conf.high:
            return [f"the runner-up {ru.get('short', '?')} measured x{m / base:.2f} over the baseline in the "
                    f"selection, above the confirmed interval of {rec.config.short()} (x{conf.low:.2f} to "
                    f"x{conf.high:.2f}): the evidence of the two disagrees; the recommendation stays the selection's "
                    "choice, its claim the confirmation's (more finalist rounds settle it)"]
    return []


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


def _trial_of(rec: Any, trials: list) -> Any:
    """The search trial of ``rec``'s config among ``trials``; else the longest of them (None without any)."""
    from autotune.search.record import trials as keys

    mine = [t for t in trials if t is not None and t.number == rec.trial_number]
    return mine[0] if mine else max(trials, key=lambda t: t.user_attrs.get(keys.WALL_S) or 0.0, default=None)


def confirmed(rec: Any, base_trial: Any, *, runner: Callable[..., Any], workload: Any, measure: Any, log_dir: Any,
              log: Callable[[str], None], budget: Any, trials: list = ()) -> Any:
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
                   budget=budget, round_s=expected_round_s([_trial_of(rec, trials), base_trial], budget),
                   spread=(rec.selection or {}).get("round_spread"))
    log(f"claim: {conf.headline()}")
    return apply(rec, conf, baseline, reproduce=lambda c: reproduce_command(workload, c, measure.memory_cap_mb),
                 base_figures=dict(base_trial.user_attrs))
