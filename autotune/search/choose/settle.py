"""Settling a tie the finalists' rounds left open: the interval of a ratio, and more rounds of the two in dispute.

Every comparison of two configs in autotune's choice and claim (the finalists' ranking and tie-break, the extra
rounds, the confirmed claim) is one paired statistic, ``ratio_interval``: each interleaved round (a fresh process
of each config, run back to back; each config first in every other round) gives one ratio of the two medians, and
the estimate and its interval come from those ratios alone (Kalibera and Jones, "Rigorous Benchmarking in Reasonable
Time", ISMM 2013: when each process has its own level, the process is the unit of repetition). Pooling the windows of
all rounds let a config 1% faster in each of two rounds lose when the machine slowed between them, and let runs
that stop after 3 to 5 windows weigh rounds unequally. ``paired_speeds`` ranks several configs the same way.

``ratio_interval`` says whether two configs measured in interleaved rounds are within noise of each other. Within
noise, ``finalists.choose`` prefers the config lighter on memory and threads, then the one with fewer knobs changed
from PyTorch's defaults. On a noisy machine two rounds leave a wide interval, and "within noise" then hid real
gains: on the shared 2-core VMs the quality benchmark (docs/search.md) measured a tiny ViT's recommendation (the
defaults, chosen as "within noise and lighter") 8% below a heavier finalist in all four of its paired rounds.

So a lighter config wins a tie only when its median is within ``TIE_TOLERANCE`` of the fastest's. When it is within
noise but further behind than that, the two are measured again, interleaved (A B, then B A), up to ``EXTRA_ROUNDS``
more rounds, only while the time left allows a round and only while a round costs less than the gap could cost over
the user's training run (``ExtraRounds``): each round narrows the interval, until it excludes 1 (the fastest
wins), the gap closes to within the tolerance (the lighter wins), or the rounds run out (the fastest by its paired
estimate wins: the likelier faster config, which is what the run is for). Within the tolerance on rounds too few or
too scattered to tell it (``blind_tie``: the fastest may be more than 5% ahead at 95%), the extra rounds run first
too (priced at the tolerance's stake); once they are spent, the lighter wins if its estimate is still within the
tolerance (its expected cost; the rounds narrowed the risk around it as far as the time allowed).
Each pair is kept as it finishes (``finalist_rounds.SavedRounds``, beside the planned rounds): a run killed after it
takes it from there.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from typing import Any, Callable

from autotune.measure import NOISY_REL_IQR, round_level, summarize
from autotune.search.budget import RUN_MARGIN
from autotune.search.choose.finalist_rounds import run_configs, run_line, run_log
from autotune.search.record.trials import departures

__all__ = ["TIE_TOLERANCE", "MEMORY_TIE", "MEMORY_TIE_MB", "EXTRA_ROUNDS", "lightest", "ratio_interval", "blind_tie",
           "round_ratios", "round_spread", "paired_speeds", "t_quantile", "ExtraRounds"]

# A lighter config wins a tie with the fastest only within this much of its median (the quality goal: >= 0.98).
TIE_TOLERANCE = 0.02
# A config is lighter on memory than another in a tie only by more than this share of the lesser peak, and at least
# MEMORY_TIE_MB: fresh processes of one config peak a few percent apart, and fixed steps split equal peaks at their
# edges (two peaks a few MB apart fell on either side of one).
MEMORY_TIE = 0.10
MEMORY_TIE_MB = 64.0
# At most this many extra rounds of the two configs in dispute, per finalists' choice (5 rounds in all with the
# default 2: the interval ~0.6x as wide); each is two runs, about 2 min at 160 px on 2 cores.
EXTRA_ROUNDS = 3


def lightest(close: list, device_peaks: dict) -> Any:
    """The config that wins a tie among ``close`` (each with ``.config`` and its host ``.peak_mb``; fastest first):
    the least device memory (``device_peaks`` by config key), then host memory, each lighter only by more than
    ``MEMORY_TIE`` of the least (at least ``MEMORY_TIE_MB``); then the fewest threads (intra-op, inter-op and
    workers: PyTorch's inter-op pool is threads too; unset counts as many); then the fewest knobs changed from
    PyTorch's defaults (``trials.departures``); the faster among equals.

    >>> from types import SimpleNamespace as S
    >>> from autotune.config import TrialConfig
    >>> a = S(config=TrialConfig(batch_size=64, intra_op_threads=2, inter_op_threads=2), peak_mb=1000.0)
    >>> b = S(config=TrialConfig(batch_size=64, intra_op_threads=2, inter_op_threads=1), peak_mb=1040.0)
    >>> lightest([a, b], {}) is b          # 4% more host memory is within the noise: one thread fewer decides
    True
    >>> lightest([a, S(config=b.config, peak_mb=1200.0)], {}) is a
    True
    """
    pool = list(close)
    for peak in (lambda x: device_peaks.get(x.config.key()) or 0.0, lambda x: x.peak_mb):
        least = min(peak(x) for x in pool)
        pool = [x for x in pool if peak(x) <= least + max(MEMORY_TIE_MB, MEMORY_TIE * least)]
    return min(pool, key=lambda x: ((x.config.intra_op_threads or 99) + (x.config.inter_op_threads or 99)
                                    + x.config.num_workers, departures(x.config)))


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: the ``t`` with ``P(T <= t) = p`` for ``df`` degrees of freedom (``0 < p < 1``, df >= 1),
    by bisection on the distribution function (the regularized incomplete beta function, ``_t_cdf``): no scipy.

    >>> round(t_quantile(0.975, 1), 3), round(t_quantile(0.975, 3), 3), round(t_quantile(0.975, 1000), 2)
    (12.706, 3.182, 1.96)
    """
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t_quantile(p={p!r}, df={df!r}): p in (0, 1) and df >= 1")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def _t_cdf(t: float, df: int) -> float:
    """``P(T <= t)``, ``t >= 0``: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t^2)."""
    return 1 - 0.5 * _beta_inc(df / 2, 0.5, df / (df + t * t))


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1 - _beta_inc(b, a, 1 - x)
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        num = (1.0 if i == 0 else
               (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m)) if i % 2 == 0 else
               -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1)))
        d = 1 + num * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + num / c if abs(1 + num / c) > tiny else tiny
        f *= c * d
        if abs(1 - c * d) < 1e-15:
            break
    return front * (f - 1) / a


def blind_tie(fastest: list[list[float]], lighter: list[list[float]], gap: float, names: tuple[str, str]) -> str:
    """Why a tie the ``lighter`` config would win within ``TIE_TOLERANCE`` (``gap``: the fastest's paired estimate
    over it, less 1) is read off rounds that cannot tell that tolerance apart (the 95% interval of the fastest over it
    reaches past ``1 + NOISY_REL_IQR``: the fastest may be more than 5% ahead); "" where they can, or ``gap`` is beyond
    the tolerance (measured again anyway). Such a tie buys the extra rounds first, where time is left
    (``finalists.settle_ties``): 2026-11-30h, transformer_tiny at 10 minutes, the lighter won 1.0% behind over two
    rounds that strayed +/-26% ("95% interval -94.7% to +1817.1%") with 130 s of the budget unspent, and re-measured
    x0.964 (x0.821-x1.131) of the 4-minute pick.

    >>> blind_tie([[100.0], [130.0]], [[99.0], [100.0]], 0.01, ("a", "b")).split(": ")[0]
    'b measures 1.0% behind a, within the 2% a lighter config may give up, but the 95% interval of the two reaches x5.7'
    >>> blind_tie([[100.0]] * 5, [[99.0]] * 5, 0.01, ("a", "b"))
    ''
    """
    hi = ratio_interval(fastest, lighter)[2]
    if gap > TIE_TOLERANCE or hi <= 1 + NOISY_REL_IQR:
        return ""
    reach = f"x{hi:.1f}" if math.isfinite(hi) and hi < 10 else "past x10"
    return (f"{names[1]} measures {100 * gap:.1f}% behind {names[0]}, within the {100 * TIE_TOLERANCE:g}% a lighter "
            f"config may give up, but the 95% interval of the two reaches {reach}: the rounds cannot tell it")


def round_ratios(a: list[list[float]], b: list[list[float]]) -> list[float]:
    """The ratio of ``a``'s median to ``b``'s in each round both measured (rounds paired by position, in the order
    they ran; a round either has no windows of is skipped)."""
    return [statistics.median(x) / statistics.median(y) for x, y in zip(a, b) if x and y]


def ratio_interval(a: list[list[float]], b: list[list[float]], level: float = 0.95) -> tuple[float, float, float]:
    """``(ratio, low, high)``: how much faster ``a`` runs than ``b``, and a ``level`` interval of it, from their
    windows grouped by round (``a[r]`` and ``b[r]`` ran interleaved in round ``r``, each a fresh process).

    The unit is the round, not the window: on these VMs each fresh process has its own level (one config moves
    5-20% between processes), so windows of one process are not independent measurements of the config. Each
    round gives one ratio (of its two medians; the machine's drift between rounds cancels in it); the estimate is
    their geometric mean and the interval Student's t on their logs, with n - 1 degrees of freedom: exact when the
    per-process levels are log-normal, and shown by simulation to cover its level at 2 to 6 rounds under per-process
    spreads of 1-10% and replays of real windows (``benchmarks/coverage.py``, docs/claims.md). Two rounds give a
    wide interval (t with one degree of freedom is 12.7): the honest answer. One round gives no interval:
    ``(ratio, 0, inf)``, "within noise" of anything.

    The issue's example: a config 1% faster in each of two rounds, the machine slower in the second (pooled medians
    said 0.978); paired, 1.01 in both rounds, so a zero-width interval:

    >>> [round(x, 3) for x in ratio_interval([[101.0] * 4 + [95.0], [90.9] * 4 + [85.5]], [[100.0] * 5, [90.0] * 5])]
    [1.01, 1.01, 1.01]
    """
    if not 0 < level < 1:
        raise ValueError(f"ratio_interval level={level!r}: a probability in (0, 1)")
    logs = [math.log(r) for r in round_ratios(a, b)]
    if not logs:
        raise ValueError("ratio_interval: no round in which both configs measured a window")
    mean = statistics.fmean(logs)
    if len(logs) == 1:
        return math.exp(mean), 0.0, math.inf
    half = t_quantile((1 + level) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def round_spread(configs: list[list[list[float]]]) -> tuple[float, int] | None:
    """``(sd, df)``: how far one round's log ratio of two configs strays, from several configs measured in the same
    interleaved rounds (each ``configs[i]`` its windows by round; the rounds all have windows of are read): the
    residual of an additive model (config + round) of the log round medians, sd of a pair's log ratio
    ``sqrt(2) * sigma`` with ``(k - 1)(r - 1)`` degrees of freedom. An estimate independent of any later rounds
    (the confirmation plans its rounds from it). None with fewer than two configs or two rounds.

    >>> sd, df = round_spread([[[100.0], [90.0]], [[110.0], [99.0]]])   # the same ratio in both rounds
    >>> round(sd, 6), df
    (0.0, 1)
    >>> sd, df = round_spread([[[100.0], [90.0], [80.0]], [[110.0], [], [88.0]]])   # the second not in round 2
    >>> round(sd, 6), df
    (0.0, 1)
    """
    have = [c for c in configs if any(c)]
    common = [j for j in range(min((len(c) for c in have), default=0)) if all(c[j] for c in have)]
    if len(have) < 2 or len(common) < 2:
        return None
    rows = [[math.log(statistics.median(c[j])) for j in common] for c in have]
    r = len(common)
    k, grand = len(rows), statistics.fmean(v for x in rows for v in x)
    row_m = [statistics.fmean(x) for x in rows]
    col_m = [statistics.fmean(x[j] for x in rows) for j in range(r)]
    ss = sum((rows[i][j] - row_m[i] - col_m[j] + grand) ** 2 for i in range(k) for j in range(r))
    df = (k - 1) * (r - 1)
    return math.sqrt(2 * ss / df), df


def paired_speeds(rounds: dict[Any, list[list[float]]]) -> dict[Any, float]:
    """Each config's speed on one scale, from its rounds paired with a reference's (the config with the most rounds):
    the reference's geometric mean of its round medians, times each config's paired ratio to it (``ratio_interval``
    over the rounds they share). With the same rounds for all, each one's geometric mean of its round medians; so a
    config 1% faster in every round ranks first even when the machine slowed between rounds (pooled medians would
    rank it by which round had more of its windows)."""
    have = {k: v for k, v in rounds.items() if any(v)}
    if not have:
        return {}
    ref = max(have, key=lambda k: len([r for r in have[k] if r]))
    base = round_level(have[ref])
    return {k: base if k == ref else base * ratio_interval(v, have[ref])[0] for k, v in have.items()}


class ExtraRounds:
    """Runs one more interleaved round of two finalists into their ``finalists.Evidence``, while rounds and time
    are left: ``more(ev, fastest, lighter, why, gap)`` returns whether it ran one.

    A round costs the two configs' last finalist runs again. It runs only if that, ``RUN_MARGIN`` longer, ends
    before ``deadline`` (``time.monotonic()``; None: no budget) and costs less than the ``gap`` could cost over
    ``run`` (``payback.RunLength``: the user's training run), the same trade the search's patience makes
    (``convergence``): a 3% gap over a 1 h run is worth ~105 s of measuring. ``gap`` is the stake: the fastest's
    lead over the lighter, or the tolerance where a tie within it cannot be told (``blind_tie``)."""

    def __init__(self, *, runner: Callable[..., Any], workload: Any, measure: Any, log_dir: Any,
                 log: Callable[[str], None], deadline: float | None = None, run: Any = None,
                 rounds: int = EXTRA_ROUNDS, saved: Any = None, by_turns: bool = False) -> None:
        self.runner, self.workload, self.measure, self.log_dir = runner, workload, measure, log_dir
        self.by_turns = by_turns  # the two alive at once, taking turns (``finalist_rounds.run_configs``)
        self.log, self.deadline, self.run, self.rounds, self.ran = log, deadline, run, rounds, 0
        self.saved = saved  # a ``SavedRounds``: each pair kept as it finishes, taken back by a resumed run

    def _run_s(self, ev: Any, fastest: Any) -> float | None:
        """The user's run in seconds at the fastest config's speed; None: unknown (no run length)."""
        if self.run is None or self.run.seconds is not None:
            return None if self.run is None else self.run.seconds
        speed = summarize(ev.samples(fastest.key())).median
        return self.run.steps * fastest.batch_size / speed if speed > 0 else None

    def __call__(self, ev: Any, fastest: Any, lighter: Any, why: str, gap: float) -> bool:
        if self.ran >= self.rounds:
            return False
        pair = [fastest, lighter] if self.ran % 2 == 0 else [lighter, fastest]
        tag = f"extra-{self.ran + 1}"
        kept = self.saved.kept(tag, pair) if self.saved is not None else None
        need = sum((ev.walls.get(c.key()) or [self.measure.timeout_s])[-1] for c in pair)
        if kept is None and self.deadline is not None and time.monotonic() + need * RUN_MARGIN > self.deadline:
            self.log(f"{why}; no time left in the budget for another round of the two (~{need:.0f} s)")
            return False
        run_s = self._run_s(ev, fastest)
        if kept is None and run_s is not None and run_s * gap / (1 + gap) < need:
            self.log(f"{why}; another round of the two (~{need:.0f} s) costs more than a {100 * gap:.0f}% gap could "
                     f"over the {self.run.label()} run (~{run_s * gap / (1 + gap):.0f} s)")
            return False
        self.ran += 1
        r = max(len(ev.rounds[c.key()]) for c in pair)
        self.log(f"{why}: one more round of the two ({self.ran} of at most {self.rounds} extra"
                 + (", taking turns)" if self.by_turns else ")")
                 + (": measured by an earlier, interrupted run; kept" if kept else ""))
        keep = (lambda c, res: self.saved.put(tag, c, res)) if self.saved is not None else None
        got = ([kept[c.key()] for c in pair] if kept else
               run_configs(pair, [run_log(self.log_dir, f"finalist-extra-{self.ran}", c) for c in pair],
                           runner=self.runner, workload=self.workload, measure=self.measure, by_turns=self.by_turns,
                           each=keep))
        for c, res in zip(pair, got):
            ev.add(r, c, res)
            self.log(run_line(f"extra round {self.ran}", c, res) + (" (kept)" if kept else ""))
        return True
