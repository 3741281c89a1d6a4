"""Settling a tie the finalists' rounds left open: the interval of a ratio, and more rounds of the two in dispute.

``ratio_interval`` says whether two configs measured in interleaved rounds are within noise of each other. Within
noise, ``finalists.choose`` prefers the config lighter on memory and threads, then the one with fewer knobs changed
from PyTorch's defaults. On a noisy machine two rounds leave a wide interval, and "within noise" then hid real
gains: on the shared 2-core VMs the quality benchmark (docs/search.md) measured a tiny ViT's recommendation (the
defaults, chosen as "within noise and lighter") 8% below a heavier finalist in all four of its paired rounds.

So a lighter config wins a tie only when its median is within ``TIE_TOLERANCE`` of the fastest's. When it is within
noise but further behind than that, the two are measured again, interleaved (A B, then B A), up to ``EXTRA_ROUNDS``
more rounds, only while the time left allows a round and only while a round costs less than the gap could cost over
the user's training run (``ExtraRounds``): each round narrows the interval, until it
excludes 1 (the fastest wins), the gap closes to within the tolerance (the lighter wins), or the rounds run out (the
fastest by median wins: the likelier faster config, which is what the run is for). Each pair is kept as it finishes
(``finalist_rounds.SavedRounds``, beside the planned rounds): a run killed after it takes it from there.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

from autotune.measure import summarize
from autotune.search.choose.finalist_rounds import run_line, run_log

__all__ = ["TIE_TOLERANCE", "EXTRA_ROUNDS", "ratio_interval", "ExtraRounds"]

# A lighter config wins a tie with the fastest only within this much of its median (the quality goal: >= 0.98).
TIE_TOLERANCE = 0.02
# At most this many extra rounds of the two configs in dispute, per finalists' choice (5 rounds in all with the
# default 2: the interval ~0.6x as wide); each is two runs, about 2 min at 160 px on 2 cores.
EXTRA_ROUNDS = 3


def ratio_interval(a: list[list[float]], b: list[list[float]], *, level: float = 0.95, resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """``(ratio, low, high)``: the ratio of the medians of ``a`` and ``b`` (windows grouped by round) and a
    percentile-bootstrap interval of it. Each resample draws rounds with replacement, the same rounds for both
    (they ran interleaved, on the same moment of the machine), then windows within each drawn round: the
    interval holds the drift between rounds as well as the spread within them."""

    def med(xs: list[float]) -> float:
        return summarize(xs).median

    ratio = med([x for r in a for x in r]) / med([x for r in b for x in r])
    rng = random.Random(seed)
    stats = []
    paired = min(len(a), len(b))
    for _ in range(resamples):
        drawn = [rng.randrange(paired) for _ in range(paired)] if paired > 1 else [0] * paired
        ra = [x for i in drawn for x in rng.choices(a[i], k=len(a[i]))]
        rb = [x for i in drawn for x in rng.choices(b[i], k=len(b[i]))]
        stats.append(med(ra) / med(rb))
    stats.sort()
    tail = (1 - level) / 2
    return ratio, stats[int(tail * (resamples - 1))], stats[int((1 - tail) * (resamples - 1))]


class ExtraRounds:
    """Runs one more interleaved round of two finalists into their ``finalists.Evidence``, while rounds and time
    are left: ``more(ev, fastest, lighter, why, gap)`` returns whether it ran one.

    A round costs the two configs' last finalist runs again. It runs only if that ends before ``deadline``
    (``time.monotonic()``; None: no budget) and costs less than the ``gap`` (the fastest's median over the
    lighter's, less 1) could cost over ``run`` (``payback.RunLength``: the user's training run), the same trade
    the search's patience makes (``convergence``): a 3% gap over a 1 h run is worth ~105 s of measuring."""

    def __init__(self, *, runner: Callable[..., Any], workload: Any, measure: Any, log_dir: Any,
                 log: Callable[[str], None], deadline: float | None = None, run: Any = None,
                 rounds: int = EXTRA_ROUNDS, saved: Any = None) -> None:
        self.runner, self.workload, self.measure, self.log_dir = runner, workload, measure, log_dir
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
        if kept is None and self.deadline is not None and time.monotonic() + need > self.deadline:
            self.log(f"{why}; no time left in the budget for another round of the two (~{need:.0f} s)")
            return False
        run_s = self._run_s(ev, fastest)
        if kept is None and run_s is not None and run_s * gap / (1 + gap) < need:
            self.log(f"{why}; another round of the two (~{need:.0f} s) costs more than the gap could over the "
                     f"{self.run.label()} run (~{run_s * gap / (1 + gap):.0f} s)")
            return False
        self.ran += 1
        r = max(len(ev.rounds[c.key()]) for c in pair)
        self.log(f"{why}: one more round of the two ({self.ran} of at most {self.rounds} extra)"
                 + (": measured by an earlier, interrupted run; kept" if kept else ""))
        for c in pair:
            res = kept[c.key()] if kept else self.runner(
                self.workload, c, self.measure, log_path=run_log(self.log_dir, f"finalist-extra-{self.ran}", c))
            if not kept and self.saved is not None:
                self.saved.put(tag, c, res)
            ev.add(r, c, res)
            self.log(run_line(f"extra round {self.ran}", c, res) + (" (kept)" if kept else ""))
        return True
