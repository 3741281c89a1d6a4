"""A run's time budget as one frozen record: when it began, how long it is, and what each phase keeps back.

``autotune run --timeout T`` must end by T (plus a little: a trial is never cut short). The search runs first and
must stop early enough to leave the phases after it their time: the finalists' rounds (at most ``FINALIST_SHARE`` of
the budget, and never so much that the search has no room for its first ``SEARCH_FIRST_TRIALS``), the confirmation's
rounds (three to ``CONFIRM_MAX_RESERVED``, within ``CONFIRM_SHARE``; else three, or two, within
``CONFIRM_MAX_SHARE``, out of the finalists' share, so the search's share shrinks by 5% at most; else none: one
round states no interval) and the winner's numerics check (at most ``NUMERICS_SHARE``). Every one of those is priced
from the same estimate of what one more run of a measured config costs (``Budget.run_s``: its search trial's wall,
with the windows of the run's own measurement in place of the search's), so the search's reserve, the finalists'
plan and the confirmation's rounds agree on what a round takes.

The finalists and the confirmation run short processes: the confirmation ``CONFIRM_WINDOWS`` of ``CONFIRM_WINDOW_S``,
and the finalists, where their rounds take turns, the same (``Budget.finalist_measure``; since 2026-11-30), else
windows as long as a search trial's, only as many as the noise asks for (``finalist_windows``: ``FINALIST_WINDOWS``,
more only where the windows themselves are noisy). Both compare configs over rounds: each fresh process
has its own level (5-20% apart on these VMs), which no window length averages away, so a budget buys a sharper
comparison with more, shorter rounds (Kalibera and Jones, ISMM 2013). Until issue 50 a finalist ran its windows twice as
long as a search trial's: three finalists and the baseline took 37% of a 10-minute budget in two rounds.

The tuner makes one ``Budget`` when a run starts and hands it to the plan (``plan.phases``, ``plan.compile_gate``),
the backends (through ``SearchContext.budget``), the finalists and the confirmation (``choose``); none of them reads
the tuner's state. It imports nothing else in ``search``: every room may read it.

>>> from autotune.config import MeasureSpec
>>> b = Budget.of(300.0, started=0.0, measure=MeasureSpec(windows=5, window_s=1.0), finalists=2, rounds=2)
>>> b.deadline
300.0
>>> b.run_s(10.0)                    # a 10 s search trial (5 windows of 1 s), run again as a finalist: 3 windows
8.0
>>> b.run_s(10.0, confirm_measure(b.measure))  # ... and as a confirmation run: 3 windows of 1 s, not 5
8.0
>>> b.confirm_reserve_s([10.0, 20.0, 30.0])     # the confirmation's 2 rounds of 36 s: over 20% (60 s), within 35%
72.0
>>> b.finalists_reserve_s([10.0, 20.0, 30.0])   # 300 s less those 72 s hold no more than the search's first 12
0.0
>>> long = Budget.of(600.0, started=0.0, measure=b.measure, finalists=2, rounds=2)
>>> long.finalists_reserve_s([10.0, 20.0, 30.0])  # 2 finalists and the baseline, 2 rounds of 54 s: 108 s <= 30%
108.0
>>> long.search_reserve_s([10.0, 20.0, 30.0])     # ... and the confirmation's 3 rounds of 36 s, within its 20%
216.0
>>> Budget.of(200.0, started=0.0, measure=b.measure).confirm_reserve_s([10.0, 20.0, 30.0])   # 72 s > 35%: none
0.0
>>> Budget.of(400.0, started=0.0, measure=b.measure).confirm_reserve_s([10.0, 20.0, 30.0])   # 3 rounds <= 35%
108.0
>>> Budget.of(3600.0, started=0.0, measure=b.measure).confirm_reserve_s([10.0, 20.0, 30.0])  # 6 rounds at most
216.0
>>> b.confirm_timeout_s(36.0, left_s=40.0)   # 2 rounds of 36 s, 40 s left: a budget whose 20% holds them, 6 min
360.0
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from autotune.config import MeasureSpec

__all__ = ["Budget", "FINALIST_SHARE", "NUMERICS_SHARE", "CONFIRM_SHARE", "CONFIRM_MIN_ROUNDS", "CONFIRM_MAX_RESERVED",
           "CONFIRM_MAX_SHARE", "FINALIST_WINDOWS", "FINALIST_MAX_WINDOWS", "PROCESS_SPREAD", "SEARCH_WINDOWS",
           "CONFIRM_WINDOWS", "CONFIRM_WINDOW_S", "CONFIRM_USEFUL_ROUNDS", "SEARCH_FIRST_TRIALS", "RUN_MARGIN",
           "TURN_EXTRA_PRIOR", "finalist_measure", "finalist_windows", "confirm_measure", "long_trial_s"]

# The most of a --timeout budget the finalists' re-measurement may take; the search gets the rest.
FINALIST_SHARE = 0.30
# The most of a --timeout budget the search leaves for the winner's numerics check (parity.check_seconds), on
# top of the finalists' share: a check longer than that runs past the budget, and the log says so beforehand.
NUMERICS_SHARE = 0.30
# The most of a --timeout budget the search keeps back for the confirmation's rounds (``Budget.confirm_reserve_s``).
CONFIRM_SHARE = 0.20
# The confirmation's rounds a budget reserves when they fit its share: A B, B A (one round each way); fewer state no
# interval, so none are reserved then; at most CONFIRM_MAX_RESERVED (a 95% interval within +/-5% when one round's
# ratio strays 4%: ``confirm.planned_rounds``), as many as fit the share. Where fewer than CONFIRM_USEFUL_ROUNDS fit
# it, that many are reserved if they fit CONFIRM_MAX_SHARE: two rounds' interval is 12.7 / sqrt(2) = 9 sds of a
# round wide each way, three rounds' 2.5 (the 4-minute claims of 2026-11-29f: two rounds, "no gain shown" at x1.33
# and x4.17)
CONFIRM_MIN_ROUNDS = 2
CONFIRM_USEFUL_ROUNDS = 3
CONFIRM_MAX_RESERVED = 6
# When fewer than three rounds fit CONFIRM_SHARE, three (else two) may take up to this share, out of the finalists'
# (whose one round on a short budget says less than a confirmed claim does): the search keeps what it would without
# them, or at most 5% less (1 - CONFIRM_MAX_SHARE of the budget at least). On a short budget the search's trials and
# the ceilings' climb decide the recommendation itself: gpu_host_sim's 3-minute cells lost a quarter of the best
# (0.99 -> 0.75) when the two rounds came on top of the finalists' share
CONFIRM_MAX_SHARE = 0.35
# The search's trials that come before the finalists' rounds get any time: about what the planned search takes to
# walk the batch, take the likely winners apart and try the loader and the threads once (12-13 trials in the 4-minute
# runs of 2026-11-29f). On a budget with room for fewer after the confirmation's reserve, the finalists' reserve
# shrinks to make room (``finalists_reserve_s``): there the search's trials decide the recommendation, and a finalists'
# round re-measures configs the search did not get to find (mobilenet_v3_small and tiny_vit at 4 minutes)
SEARCH_FIRST_TRIALS = 12
# A search trial's windows (``autotune run``'s and ``recommend()``'s default; ``autotune trial`` keeps 5): configs
# are compared across fresh processes, whose levels differ far more than one process's windows do (on these VMs
# 17-36% sd of log between processes against 4-11% between 0.3 s windows of one, benchmarks/results/coverage-windows
# -2026-11-28-*.json; less within 3 s windows), so the median of 3 windows is as good a figure of its process as
# that of 5, and a trial costs 6 s less of a 20 s one: 40% more trials in a budget (issue 50 item 4)
SEARCH_WINDOWS = 3
# A confirmation run's windows: 3 (fewer if the search measures fewer) of CONFIRM_WINDOW_S (or the search's, if
# shorter). The interval is Student's t over the rounds, so on a short budget the count of rounds decides its width
# (t is 12.7 with two rounds, 4.3 with three): paired by turns, a round of three 1 s windows a config strayed about
# as much as one of three 3 s windows (sd of its log ratio 3.1% against 2.0% on mobilenet_v3_small, 3.7% against
# 3.5% on resnet18, 12 rounds each) and cost 11-12 s, not 29-32 s (both children's start-up and warm-up, plus the
# windows' share of the measured round), so in 90 s of rounds the expected interval was +/-2.4% and +/-3.3%, not
# +/-4.3% and +/-26%, and no wider at 240 s (benchmarks/confirm_windows.py, 2026-11-30, AMX Xeon; docs/claims.md)
CONFIRM_WINDOWS = 3
CONFIRM_WINDOW_S = 1.0
# The fewest windows a finalist run has (each as long as a search trial's): a median one stray window does not move;
# at most FINALIST_MAX_WINDOWS (or the search's, if more), however noisy the windows
FINALIST_WINDOWS = 3
FINALIST_MAX_WINDOWS = 9
# How far a run may run over its estimate (``Budget.run_s``: start-up, warm-up and the windows vary from process
# to process, and a window closes only at a step's end) before it eats the phases after it: the finalists' rounds
# are planned, and each later round started, only where they end before their deadline priced this much longer.
# The 4-minute resnet18 run of 2026-11-28 (AMX Xeon) left its confirmation 45 s of the 49 s its two rounds needed
# after one finalists' round priced to the second, and so lost its claim's confirmation.
RUN_MARGIN = 1.15
# The smallest spread (sd of log) between fresh processes of one config on these VMs: 5-20% (docs/measurement.md).
# The smallest makes ``finalist_windows`` ask for the most windows.
PROCESS_SPREAD = 0.05

# What the rounds after the search cost more by turns (``Budget.turn_extra``) at the least while the finalists are not
# known: one untimed step every three timed ones, as with 0.2-s steps (resnet18 at 32 px, batch 64: its rounds by
# turns took +36-52%, docs/claims.md); during the search the price follows the best configs' own steps from it
# (``Budget.turn_price``, ``Tuner.turn_price_so_far``), and ``finalize`` prices it from the finalists' own steps
TURN_EXTRA_PRIOR = 0.33


# The expected IQR of n normal windows in sds, quartiles interpolated linearly (``measure.summarize``): small samples
# have narrow IQRs (3: the range's half, E = 1.693 / 2), so the large-sample 1.349 would take the windows for quieter
# than they are
_IQR_SDS = {2: 0.564, 3: 0.846, 4: 0.960, 5: 0.990, 6: 1.064}


def finalist_windows(search: MeasureSpec, rel_iqr: float | None = None) -> int:
    """How many windows a finalist run needs: enough that the windows' own noise in its median (about 1.25 sd /
    sqrt(n)) stays within half the spread between fresh processes
    (``PROCESS_SPREAD``), which only more rounds narrow; at least ``FINALIST_WINDOWS``, at most
    ``FINALIST_MAX_WINDOWS`` (or the search's count, if more).
    ``rel_iqr``: the finalists' search trials' windows' median relative IQR (None: unknown, the fewest), over
    ``search.windows`` windows each: the sd is that IQR over its expected width in sds for so few windows
    (``_IQR_SDS``, linear-interpolated quartiles: 0.85 for 3 windows, not the large-sample 1.349).

    >>> from autotune.config import MeasureSpec
    >>> m = MeasureSpec(windows=5, window_s=3.0)
    >>> finalist_windows(m), finalist_windows(m, 0.02), finalist_windows(m, 0.05), finalist_windows(m, 0.10)
    (3, 3, 7, 9)
    >>> finalist_windows(MeasureSpec(windows=3, window_s=3.0), 0.03)   # 3 windows 3% apart: sd 3.5%, not 2.2%
    4
    """
    least = min(FINALIST_WINDOWS, search.windows)
    if not rel_iqr or rel_iqr <= 0:
        return least
    sd = rel_iqr / _IQR_SDS.get(search.windows, 1.349)
    need = math.ceil((1.25 * sd / (PROCESS_SPREAD / 2)) ** 2)
    return max(least, min(max(search.windows, FINALIST_MAX_WINDOWS), need))


def finalist_measure(search: MeasureSpec, rel_iqr: float | None = None) -> MeasureSpec:
    """How a finalist is measured: as a search trial, with the windows the noise asks for (``finalist_windows``)."""
    return search.replace(windows=finalist_windows(search, rel_iqr))


def confirm_measure(search: MeasureSpec) -> MeasureSpec:
    """How a confirmation run is measured: as a search trial, with ``CONFIRM_WINDOWS`` windows (fewer if the search
    measures fewer) of ``CONFIRM_WINDOW_S`` (the search's, if shorter), a step at least each (not the search's two:
    a window of steps over half a second would run two steps, twice as long as ``run_s`` prices it; measured so in
    ``benchmarks/confirm_windows.py``): short runs, so the budget buys more rounds (the module docstring). A window
    still closes at a step's end, so steps over a second run longer than priced (``RUN_MARGIN``)."""
    return search.replace(windows=min(CONFIRM_WINDOWS, search.windows),
                          window_s=min(CONFIRM_WINDOW_S, search.window_s), min_window_steps=1)


def long_trial_s(trial_walls: list[float]) -> float:
    """A long trial of those so far: the nearest-rank 90th percentile of their walls (0 with none)."""
    walls = sorted(trial_walls)
    return walls[math.ceil(0.9 * len(walls)) - 1] if walls else 0.0


def _typical(walls: list[float]) -> float:
    """The median of the walls measured (upper median; 0 with none)."""
    walls = sorted(w for w in walls if w)
    return walls[len(walls) // 2] if walls else 0.0


@dataclass(frozen=True)
class Budget:
    """One run's time budget. ``started``: when it began (``time.monotonic()``: the CLI's start, so its workload
    check counts); ``deadline``: when it ends (``time.monotonic()``), None for a run bounded by its trial count
    alone; ``budget_s``: its whole length (``--timeout``), which the phases' shares are of (None: no shares, as for
    ``Tuner.finalize`` given a deadline alone); ``measure``: the search trials' measurement (a round's cost is priced
    from it; None: no confirmation reserve); ``finalists`` and ``rounds``: how many configs the finalists' rounds
    compare and how many rounds they want. ``Budget.of(timeout_s)`` makes the usual one."""

    started: float
    deadline: float | None = None
    budget_s: float | None = None
    measure: MeasureSpec | None = None
    finalists: int = 3
    rounds: int = 2
    # the finalists' search trials' windows' median relative IQR (``finalist_windows``), once they are known
    window_noise: float | None = None
    # where the rounds after the search take turns (``trial.lockstep``): the measured time's share that each turn's
    # untimed first step adds (``finalist_rounds.turn_extra``); 0 one after the other. ``turn_price``, where given,
    # says it instead as the search goes (every holder of this budget reads the same figure: the tuner's reserve, the
    # compile gate, the phases)
    turn_extra: float = 0.0
    turn_price: Callable[[], float] | None = field(default=None, compare=False, repr=False)
    # where known (the finalists planned), whether their rounds take turns; None: where ``turns()`` is above 0
    by_turns: bool | None = None
    # where given, whether the search's best so far has a claim to confirm (False: it is PyTorch's defaults;
    # ``Tuner.pick_needs_confirming``): with no finalist round in the budget the confirmation's reserve then goes to
    # the search (``confirm_released``)
    confirm_needed: Callable[[], bool] | None = field(default=None, compare=False, repr=False)
    # the study's measured trials before this run (a resumed or re-run study): they count towards the search's
    # first ``SEARCH_FIRST_TRIALS``
    trials_before: int = 0

    def __post_init__(self) -> None:
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"Budget.budget_s={self.budget_s!r}: a time budget is a positive number of seconds "
                             "(None: no time budget)")

    @classmethod
    def of(cls, timeout_s: float | None, *, started: float | None = None, measure: MeasureSpec | None = None,
           finalists: int = 3, rounds: int = 2) -> Budget:
        """A run of ``timeout_s`` seconds (None or 0: no time budget) from ``started`` (default now)."""
        started = time.monotonic() if started is None else started
        return cls(started=started, deadline=started + timeout_s if timeout_s else None, budget_s=timeout_s or None,
                   measure=measure, finalists=finalists, rounds=rounds)

    # --- the clock ---------------------------------------------------------------------------------------

    def left_s(self) -> float:
        """Seconds left (infinite without a budget; never below 0)."""
        return math.inf if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def elapsed_s(self) -> float:
        """Seconds since the run began."""
        return time.monotonic() - self.started

    # --- what one more run costs -----------------------------------------------------------------------
    def run_s(self, wall: float, measure: MeasureSpec | None = None) -> float:
        """One more run of a config whose search trial took ``wall`` seconds, measured by ``measure`` (default the
        finalists', ``finalist_measure`` at ``window_noise``; the confirmation's is ``confirm_measure``): the same
        start-up and warm-up (the trial's wall less its windows, at least 0), with ``measure``'s windows (and, by
        turns, the untimed steps: ``turn_extra``). The one estimate that prices the finalists' reserve and plan and
        the confirmation's rounds."""
        if self.measure is None:
            return wall or 0.0
        target = measure or self.finalist_measure()
        fixed = max(0.0, (wall or 0.0) - self.measure.windows * self.measure.window_s)
        return fixed + target.windows * target.window_s * (1.0 + self.turns())

    def finalist_measure(self) -> MeasureSpec:
        """How a finalist run is measured: by turns (``by_turns``, else ``turns()`` above 0), as a confirmation run is
        (``confirm_measure``: three 1 s windows; a round by turns strays about as much as with the search's 3 s
        windows and costs a third, so the budget buys more rounds, ``CONFIRM_WINDOW_S``); one after the other, as a
        search trial with the windows its noise asks for (``finalist_measure``, at ``window_noise``)."""
        assert self.measure is not None
        if self.by_turns if self.by_turns is not None else self.turns() > 0:
            return confirm_measure(self.measure)
        return finalist_measure(self.measure, self.window_noise)

    def turns(self) -> float:
        """What rounds by turns add to a run's measured time (``turn_extra``, or ``turn_price()`` where given)."""
        return self.turn_extra if self.turn_price is None else self.turn_price()

    def round_s(self, walls: list[float], measure: MeasureSpec | None = None) -> float:
        """One round over configs whose search trials took ``walls``: a run of each (``run_s``)."""
        return sum(self.run_s(w, measure) for w in walls)

    # --- what the phases after the search keep back -------------------------------------------------------
    def finalists_reserve_s(self, walls: list[float]) -> float:
        """The finalists' rounds: the finalists and the baseline, ``rounds`` rounds of runs as long as the typical
        search trial's (``run_s``), at most ``FINALIST_SHARE`` of the budget; when the confirmation's two rounds fit
        only beyond their own share (``confirm_rounds_s``: a short budget), what is left of it after them (often
        nothing: the best search trial is then recommended and its claim confirmed, ``time_plan.plan_finalists``).
        Never so much that the search, after the confirmation's reserve, has no room for ``SEARCH_FIRST_TRIALS``
        typical trials: on a short budget the search's trials decide the recommendation."""
        if not walls or self.finalists <= 0:
            return 0.0
        full = self.run_s(_typical(walls)) * (self.finalists + 1) * self.rounds
        return self._finalists_room(full, self.confirm_reserve_s(walls), _typical(walls))

    def _finalists_room(self, full: float, confirm: float, trial_s: float) -> float:
        """``finalists_reserve_s`` for the finalists' rounds of ``full`` seconds beside a confirmation's ``confirm``,
        the search's trials taking ``trial_s`` each."""
        if not self.budget_s:
            return full
        share = min(full, FINALIST_SHARE * self.budget_s)
        if confirm > CONFIRM_SHARE * self.budget_s:  # a short budget: the confirmation's rounds out of this share
            share = max(0.0, share - confirm)
        first = max(0, SEARCH_FIRST_TRIALS - self.trials_before) * trial_s
        return min(share, max(0.0, self.budget_s - confirm - first))

    def confirm_rounds_s(self, one_round_s: float) -> float:
        """What the confirmation keeps back: as many rounds of ``one_round_s`` as fit ``CONFIRM_SHARE`` of the
        budget, at most ``CONFIRM_MAX_RESERVED``, when at least ``CONFIRM_USEFUL_ROUNDS`` fit (``CONFIRM_MIN_ROUNDS``
        without a budget); else three, or else two, when they fit ``CONFIRM_MAX_SHARE`` (out of the finalists'
        share); else nothing (one round states no interval; the confirmation then runs only if the phases before it
        leave the time, and else says what --timeout would do, ``confirm_timeout_s``)."""
        if not self.budget_s:
            return CONFIRM_MIN_ROUNDS * one_round_s
        fit = min(CONFIRM_MAX_RESERVED, int(CONFIRM_SHARE * self.budget_s // one_round_s)) if one_round_s > 0 else 0
        if fit >= CONFIRM_USEFUL_ROUNDS:
            return fit * one_round_s
        for n in (CONFIRM_USEFUL_ROUNDS, CONFIRM_MIN_ROUNDS):  # from the finalists' share, up to CONFIRM_MAX_SHARE
            if 0 < n * one_round_s <= CONFIRM_MAX_SHARE * self.budget_s:
                return max(n, fit) * one_round_s
        return 0.0

    def confirm_reserve_s(self, walls: list[float]) -> float:
        """The confirmation's rounds, each a run of the winner and of the baseline as the confirmation measures
        them (``run_s`` with ``confirm_measure``) from the typical search trial's wall (``confirm_rounds_s``); 0
        without a measure or a trial."""
        if self.measure is None or not _typical(walls):
            return 0.0
        return self.confirm_rounds_s(2 * self.run_s(_typical(walls), confirm_measure(self.measure)))

    def timeout_for_s(self, finalist_round_s: float, confirm_round_s: float, trial_s: float) -> float:
        """The shortest --timeout (whole minutes, at least this budget) whose reserves hold the finalists' ``rounds``
        rounds of ``finalist_round_s`` (``RUN_MARGIN`` longer, as ``time_plan.plan_finalists`` plans them) and the
        confirmation's rounds of ``confirm_round_s``, the search's trials taking ``trial_s`` (the reserves as a run
        of that budget keeps them: ``confirm_rounds_s``, ``finalists_reserve_s``): what a run too short for either
        would need.

        >>> b = Budget.of(240.0, started=0.0, finalists=2, rounds=1)
        >>> b.timeout_for_s(45.0, 16.0, 15.0) / 60   # 48 s of rounds, a 52 s round beside 12 trials of 15 s: 300 s
        5.0
        """
        want = max(1, self.rounds) * finalist_round_s * RUN_MARGIN
        minutes = max(1, math.ceil((self.budget_s or 0.0) / 60.0))
        while minutes < 7 * 24 * 60:
            b = replace(self, budget_s=60.0 * minutes)
            confirm = b.confirm_rounds_s(confirm_round_s)
            if confirm > 0 and b._finalists_room(want, confirm, trial_s) >= want:
                break
            minutes += 1
        return 60.0 * minutes

    def confirm_timeout_s(self, one_round_s: float, *, left_s: float) -> float:
        """The --timeout (s, rounded up to a minute) under which the confirmation's ``CONFIRM_MIN_ROUNDS`` rounds of
        ``one_round_s`` would have run, where ``left_s`` was left for them: this budget plus what they lacked, and
        at least the budget whose ``CONFIRM_SHARE`` keeps them back."""
        need = CONFIRM_MIN_ROUNDS * one_round_s
        want = max((self.budget_s or 0.0) + max(0.0, need - left_s), need / CONFIRM_SHARE)
        return 60.0 * math.ceil(want / 60.0)

    def search_reserve_s(self, walls: list[float]) -> float:
        """What the search leaves after it, the numerics check aside: the finalists' and the confirmation's (not
        the confirmation's while ``confirm_released``)."""
        finalists = self.finalists_reserve_s(walls)
        return finalists + (0.0 if self.confirm_released(walls, finalists) else self.confirm_reserve_s(walls))

    def confirm_released(self, walls: list[float], finalists_s: float | None = None) -> bool:
        """Whether the search may spend the confirmation's reserve: no finalist round fits the finalists' (not even
        one finalist's beside the baseline, so the search's best is the recommendation) and that best is PyTorch's
        defaults (``confirm_needed``), which have nothing to confirm. The tiny_vit 4-minute run of 2026-11-29 ended
        at 155 s of 240 that way, its reserve unspent. Once the search finds a better config the reserve is back,
        and the search stops; the confirmation then runs in what is left (or says what --timeout would confirm it).

        >>> from autotune.config import MeasureSpec
        >>> b = Budget.of(240.0, started=0.0, measure=MeasureSpec(windows=3, window_s=3.0))
        >>> walls = [14.0] * 8
        >>> b.confirm_reserve_s(walls), b.finalists_reserve_s(walls)  # 3 rounds of 16 s; 240 - 48 - 12 x 14 s
        (48.0, 24.0)
        >>> import dataclasses
        >>> [dataclasses.replace(b, confirm_needed=lambda: need).search_reserve_s(walls) for need in (True, False)]
        [72.0, 24.0]
        >>> dataclasses.replace(b, budget_s=600.0, confirm_needed=lambda: False).confirm_released(walls)  # a round fits
        False
        """
        if self.confirm_needed is None or not walls or not _typical(walls):
            return False
        finalists_s = self.finalists_reserve_s(walls) if finalists_s is None else finalists_s  # given: known already
        if finalists_s >= RUN_MARGIN * self.round_s([_typical(walls)] * 2):
            return False  # a finalists' round fits (as ``time_plan.plan_finalists`` plans it): it may change the pick
        return not self.confirm_needed()

    def check_share_s(self, check_s: float) -> float:
        """The part of a numerics check expected to take ``check_s`` that the search keeps back: at most
        ``NUMERICS_SHARE`` of the budget."""
        return min(check_s, NUMERICS_SHARE * self.budget_s) if self.budget_s else check_s

    def search_left_s(self, walls: list[float], *, check_s: float = 0.0) -> float:
        """Seconds the search has left before the reserves (``search_reserve_s``) and the numerics check's
        (``check_share_s``); infinite without a budget."""
        if self.deadline is None:
            return math.inf
        return self.deadline - time.monotonic() - self.search_reserve_s(walls) - self.check_share_s(check_s)

    def out_of_time(self, walls: list[float], *, check_s: float = 0.0) -> bool:
        """True when the search must stop to leave the phases after it their reserve. A trial is never cut short,
        so one more starts only if a long trial (``long_trial_s``: the 90th percentile of those so far, the
        longest while there are fewer than ten) would still end before the reserve begins: a long trial started
        late would otherwise eat the re-measurement that decides the recommendation. The percentile keeps one
        outlier (a trial that ran into its time limit) from ending a long search early."""
        if self.deadline is None:
            return False
        left = self.search_left_s(walls, check_s=check_s)
        return left <= 0 or (bool(walls) and left < long_trial_s(walls))
