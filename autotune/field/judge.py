"""Does the user's run stand within what the trials measured for this config? The rule, the reasons, the line.

The trials' confirmation ran the config in ``n`` fresh processes (rounds); on these machines each fresh process
has its own level, so the question is not whether the run matches the trials' median but whether it lies where
one more fresh process of the config would: inside the 95% prediction range of the rounds' medians (Student's t
on their logs, ``exp(mean +/- t(0.975, n-1) * sd * sqrt(1 + 1/n))``). Outside it, the run is said below or
above. The rate of saying so of a run that is one more process of the same config (the statement's error rate)
is shown by a seeded simulation in ``tests/field/test_judge.py`` and ``benchmarks/field.py``, as
``benchmarks/coverage.py`` shows the claim's interval. With fewer than 2 rounds there is no spread of fresh
processes, and the run is not judged (said so).

``t975`` comes from the caller (``search.choose.settle.t_quantile``): this room does not import the search.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["Claim", "process_range", "verdict", "reasons", "REASON_WAIT", "REASON_OUTSIDE", "REASON_CORES",
           "REASON_MEMORY", "stored_line"]

# What changed, named in a reason only past these (absolute shares of a step, cores, share of memory): below
# them the figures move as much between two processes of one config
REASON_WAIT = 0.05      # the data wait's share of a step grew by 5 points or more ...
REASON_WAIT_PART = 0.5  # ... or its seconds per sample grew by half the slow-down's or more
REASON_OUTSIDE = 0.05   # the loop's own work outside the step (evaluation) took 5% of the time or more
REASON_CORES = 0.5      # other processes took half a core or more
REASON_MEMORY = 0.20    # the process's memory grew 20% or more (or the machine's free memory fell under 10%)


@dataclass(frozen=True)
class Claim:
    """What the trials measured for the recommended config, as the field run compares with it."""

    median_samples_per_s: float | None        # the claim's figure (the confirmation's winner median)
    round_medians: tuple[float, ...] = ()     # each confirmation round's (fresh process's) median
    t975: float | None = None                 # Student's t(0.975, len(round_medians) - 1)
    data_wait_share: float | None = None      # the recommended trial's data wait, share of a step
    peak_host_mb: float | None = None
    samples_per_step: int = 1                 # batch size x accumulation steps: when no batch is seen
    fingerprint: str = ""                     # the hardware the trials ran on
    headline: str = ""                        # the claim in one line (``Recommendation.claim()``)
    task: str = "train"
    notes: tuple[str, ...] = field(default=())

    def range(self) -> tuple[float, float] | None:
        return process_range(self.round_medians, self.t975)

    def to_dict(self) -> dict:
        r = self.range()
        return {"median_samples_per_s": self.median_samples_per_s, "round_medians": list(self.round_medians),
                "range_95": None if r is None else [round(r[0], 3), round(r[1], 3)],
                "data_wait_share": self.data_wait_share, "fingerprint": self.fingerprint,
                "headline": self.headline, "task": self.task}


def process_range(round_medians: Sequence[float], t975: float | None) -> tuple[float, float] | None:
    """The 95% prediction range of one more fresh process's median, from ``n`` processes' medians; None with fewer
    than 2 or without ``t975``.

    >>> [round(x, 1) for x in process_range([100.0, 104.0, 98.0], 4.303)]
    [86.6, 116.9]
    """
    xs = [math.log(x) for x in round_medians if x and x > 0]
    if len(xs) < 2 or not t975:
        return None
    mean, sd = statistics.fmean(xs), statistics.stdev(xs)
    half = t975 * sd * math.sqrt(1 + 1 / len(xs))
    return math.exp(mean - half), math.exp(mean + half)


def verdict(run_median: float, rng: tuple[float, float] | None) -> str | None:
    """``within``, ``below`` or ``above`` the trials' range; None: not judged (no range)."""
    if rng is None:
        return None
    if run_median < rng[0]:
        return "below"
    return "above" if run_median > rng[1] else "within"


def _median(ws, key) -> float | None:
    xs = [v for v in (key(w) for w in ws) if v is not None]
    return statistics.median(xs) if xs else None


def _wait_explains(ws, ref_wait: float, ref_rate: float | None) -> bool:
    """Whether the data wait grew by half or more of the slow-down, per sample: when the wait is most of a step
    already, its share hardly moves (90% -> 95%) while its seconds triple."""
    rate, wait = _median(ws, lambda w: w.rate), _median(ws, lambda w: w.wait_share)
    if not (rate and ref_rate) or rate >= ref_rate:
        return False
    return (wait / rate - ref_wait / ref_rate) >= REASON_WAIT_PART * (1 / rate - 1 / ref_rate)


def reasons(ws, *, ref_wait: float | None, ref_rate: float | None = None, ref_rss_mb: float | None = None,
            ref_cores: float | None = None, against: str = "the trials") -> list[str]:
    """What changed, from what was measured in windows ``ws`` against a reference (the trials', or the run's own
    before a slow-down, at ``ref_rate`` samples/s): the data wait, the loop's own work outside the step, other
    processes' cores, memory."""
    out = []
    wait = _median(ws, lambda w: w.wait_share)
    if wait is not None and ref_wait is not None and (wait - ref_wait >= REASON_WAIT
                                                      or _wait_explains(ws, ref_wait, ref_rate)):
        rate = _median(ws, lambda w: w.rate)
        per = (f", {1e3 * wait / rate:.1f} ms a sample ({against}: {1e3 * ref_wait / ref_rate:.1f})"
               if rate and ref_rate else "")
        out.append(f"the data wait grew to {100 * wait:.0f}% of a step ({against}: {100 * ref_wait:.0f}%){per}: the "
                   "loader (the time from a step's end to its next batch)")
    elif wait is not None and ref_wait is None and wait >= 0.2:
        out.append(f"the data wait is {100 * wait:.0f}% of a step ({against}' not known): the loader")
    outside = _median(ws, lambda w: w.outside_share)
    if outside is not None and outside >= REASON_OUTSIDE:
        out.append(f"your loop's own work outside the step (evaluation) took {100 * outside:.0f}% of the time: "
                   "yours, not a setting of autotune's")
    cores = _median(ws, lambda w: w.host.get("others_cores"))
    if cores is not None and cores - (ref_cores or 0.0) >= REASON_CORES:
        out.append(f"other processes took {cores:.1f} cores" + (f" ({against}: {ref_cores:.1f})" if ref_cores else "")
                   + " (psutil)")
    rss = _median(ws, lambda w: w.host.get("rss_mb"))
    avail = _median(ws, lambda w: w.host.get("avail_share"))
    if rss is not None and ref_rss_mb and rss > ref_rss_mb * (1 + REASON_MEMORY):
        out.append(f"host memory grew: {rss:.0f} MiB in this process and its workers ({against}: {ref_rss_mb:.0f})")
    elif avail is not None and avail < 0.10:
        out.append(f"the machine is short of memory: {100 * avail:.0f}% free")
    return out


def stored_line(record: dict) -> str:
    """One line for a kept field run (``autotune show``, the report): when, where, state, and its own line."""
    where = f"{record.get('source', '?')}, rank {record.get('rank', 0)} of {record.get('world_size', 1)}"
    state = record.get("state", "?")
    state = {"running": "running or killed (last kept " + str(record.get("updated", "?")) + ")"}.get(state, state)
    line = str(record.get("line", "")).removeprefix("autotune field: ")
    return f"{record.get('started', '?')} {record.get('host', '?')} ({where}; {state}): {line}"
