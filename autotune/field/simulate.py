"""The statement's error rate, by seeded simulation: how often the within/below/above rule (``judge``) says a run
that is one more fresh process of the recommended config is below or above the trials (a false statement), and how
often it says a run truly slower is below (its power), with the round counts the confirmation stops at.

The process model is ``benchmarks/coverage.py``'s: each fresh process has its own level (log-normal, sd = the
per-process spread), each round a drift of the machine's load (5%), each window its own noise (0.5%). The user's
run is one more process, at the same level (``slower=0``) or slower. ``t975`` is given by the caller (the search's
``settle.t_quantile``): this room does not import the search.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Callable

from autotune.field.judge import process_range, verdict

__all__ = ["statement_rates", "WINDOW_NOISE", "DRIFT"]

WINDOW_NOISE = 0.005
DRIFT = 0.05


def _process(rng: random.Random, level: float, spread: float, windows: int) -> float:
    own = level * math.exp(rng.gauss(0.0, spread))
    return statistics.median(own * math.exp(rng.gauss(0.0, WINDOW_NOISE)) for _ in range(windows))


def _level(rng: random.Random) -> float:
    return 100.0 * math.exp(rng.gauss(0.0, DRIFT))


def statement_rates(seed: int, runs: int, spread: float, rounds: int, t975: Callable[[int], float], *,
                    slower: float = 0.0, run_windows: int = 30) -> dict[str, float]:
    """Shares of ``runs`` simulated runs said within, below and above the trials' range: ``rounds`` confirmation
    rounds of 3 windows (a drift each), then the user's run (``run_windows`` windows, its own drift and process
    level, ``slower`` below the config's true level)."""
    rng = random.Random(seed)
    said = {"within": 0, "below": 0, "above": 0}
    t = t975(rounds - 1)
    for _ in range(runs):
        medians = [_process(rng, _level(rng), spread, 3) for _ in range(rounds)]
        run = _process(rng, _level(rng) * (1 - slower), spread, run_windows)
        said[verdict(run, process_range(medians, t))] += 1
    return {k: v / runs for k, v in said.items()}
