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
           "REASON_MEMORY", "REASON_CLOCK", "REASON_DEVICE_MEMORY", "stored_line", "ranks_line"]

# What changed, named in a reason only past these (absolute shares of a step, cores, share of memory): below
# them the figures move as much between two processes of one config
REASON_WAIT = 0.05      # the data wait's share of a step grew by 5 points or more ...
REASON_WAIT_PART = 0.5  # ... or its seconds per sample grew by half the slow-down's or more
REASON_OUTSIDE = 0.05   # the loop's own work outside the step (evaluation) took 5% of the time or more
REASON_CORES = 0.5      # other processes took half a core or more
REASON_MEMORY = 0.20    # the process's memory grew 20% or more (or the machine's free memory fell under 10%)
REASON_CLOCK = 0.10     # the GPU's SM clock fell 10% or more (NVML), or NVML named a slow-down in half the windows
REASON_DEVICE_MEMORY = 0.97  # the GPU's memory in use reached 97% of it (NVML): the caching allocator frees and
#                              retries before it fails, which stalls the step


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
            ref_cores: float | None = None, ref_sm_mhz: float | None = None, against: str = "the trials") -> list[str]:
    """What changed, from what was measured in windows ``ws`` against a reference (the trials', or the run's own
    before a slow-down, at ``ref_rate`` samples/s): the data wait, the loop's own work outside the step, other
    processes' cores, memory; on a GPU (``host.DeviceSampler``'s figures), its clock held down or fallen and its
    memory full."""
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
    return out + _device_reasons(ws, ref_sm_mhz=ref_sm_mhz, against=against)


def _device_reasons(ws, *, ref_sm_mhz: float | None, against: str) -> list[str]:
    """The GPU's part of ``reasons``: NVML's slow-downs active in at least half the windows (by name), else an SM
    clock ``REASON_CLOCK`` under the reference's; its memory in use at ``REASON_DEVICE_MEMORY`` of it."""
    out = []
    sampled = [w for w in ws if "gpu_slowdown" in w.host]
    sm, top = _median(ws, lambda w: w.host.get("gpu_sm_mhz")), _median(ws, lambda w: w.host.get("gpu_sm_max_mhz"))
    counts: dict[str, int] = {}
    for w in sampled:
        for name in w.host.get("gpu_slowdown") or ():
            counts[name] = counts.get(name, 0) + 1
    held = [name for name, k in counts.items() if 2 * k >= len(sampled)]
    clock = f"SM clock {sm:.0f} MHz" + (f" of {top:.0f}" if top else "") if sm else "SM clock not read"
    if held:
        out.append(f"the GPU held its clock down ({', '.join(held)}): {clock} (NVML)")
    elif sm and ref_sm_mhz and sm < ref_sm_mhz * (1 - REASON_CLOCK):
        out.append(f"the GPU's SM clock fell to {sm:.0f} MHz ({against}: {ref_sm_mhz:.0f}) (NVML)")
    used = _median(ws, lambda w: w.host.get("gpu_mem_used_mb"))
    total = _median(ws, lambda w: w.host.get("gpu_mem_total_mb"))
    if used and total and used >= REASON_DEVICE_MEMORY * total:
        out.append(f"the GPU's memory is full: {used:.0f} of {total:.0f} MiB in use (NVML); PyTorch's caching "
                   "allocator frees its cache and retries before it fails, which stalls steps")
    return out


def ranks_line(records: dict[int, dict], world_size: int, *, waited_s: float) -> str:
    """Rank 0's account of the ranks under DDP, from each rank's own record (``FieldRun.to_dict``): each rank's
    samples/s, all together, the slowest against the median rank, the ranks outside the trials' range, and the
    ranks that did not report within ``waited_s`` seconds.

    >>> r = {0: {"median_samples_per_s": 100.0, "verdict": "within"}, 1: {"median_samples_per_s": 80.0,
    ...      "verdict": "below", "data_wait_share": 0.3}}
    >>> ranks_line(r, 3, waited_s=10)  # doctest: +NORMALIZE_WHITESPACE
    'autotune field: 2 of 3 ranks: rank 0 100.0, rank 1 80.0 samples/s (180.0 together); slowest rank 1 (-11% of the
     median rank; data wait 30% of a step); below the trials: rank 1; rank 2 did not report within 10 s'
    """
    figs = {r: records[r].get("median_samples_per_s") for r in sorted(records)}
    known = {r: f for r, f in figs.items() if f}
    parts = ", ".join(f"rank {r} " + (f"{f:.1f}" if f else "too short to judge") for r, f in figs.items())
    out = f"autotune field: {len(records)} of {world_size} ranks: {parts} samples/s"
    if known:
        out += f" ({sum(known.values()):.1f} together)"
    if len(known) >= 2:
        med = statistics.median(known.values())
        slow = min(known, key=lambda r: known[r])
        wait = records[slow].get("data_wait_share")
        out += (f"; slowest rank {slow} ({100 * (known[slow] / med - 1):+.0f}% of the median rank"
                + (f"; data wait {100 * wait:.0f}% of a step" if wait is not None else "") + ")")
    below = [str(r) for r in sorted(records) if records[r].get("verdict") == "below"]
    if below:
        out += f"; below the trials: rank {', '.join(below)}"
    missing = [str(r) for r in range(world_size) if r not in records]
    if missing:
        out += f"; rank {', '.join(missing)} did not report within {waited_s:g} s"
    return out


def stored_line(record: dict) -> str:
    """One line for a kept field run (``autotune show``, the report): when, where, state, and its own line."""
    where = f"{record.get('source', '?')}, rank {record.get('rank', 0)} of {record.get('world_size', 1)}"
    state = record.get("state", "?")
    state = {"running": "running or killed (last kept " + str(record.get("updated", "?")) + ")"}.get(state, state)
    line = str(record.get("line", "")).removeprefix("autotune field: ")
    return f"{record.get('started', '?')} {record.get('host', '?')} ({where}; {state}): {line}"
