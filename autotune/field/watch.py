"""The drift watch: a sustained drop of the run below its own settled level, logged once per episode, with when it
began, how much it fell and what changed, and its recovery.

A window is low when it is under the lower of the run's own median less ``floor`` and its Tukey fence
(first quartile less 1.5 IQR), over the last ``reference`` normal windows: beyond the run's own spread, and never for
a few percent. ``sustained`` low windows in a row start an episode (one line); as many normal ones in a row end
it (one line). Windows of an episode are not added to the reference, so a long slow-down does not become the norm.
"""

from __future__ import annotations

import collections
import datetime as _dt

from autotune.field.judge import reasons
from autotune.measure import summarize

__all__ = ["DriftWatch"]

_NOTHING = "what changed: nothing measured (memory, cores, data wait and, on a GPU, its clock as before)"


class DriftWatch:
    """``on_window(window, index)`` -> a line to log, or None."""

    def __init__(self, *, sustained: int = 3, min_reference: int = 5, floor: float = 0.10, reference: int = 100,
                 started_wall: float | None = None) -> None:
        self.sustained, self.min_reference, self.floor = sustained, min_reference, floor
        self._ref: collections.deque = collections.deque(maxlen=reference)
        self._pending: list = []   # low windows not yet sustained
        self._normal = 0           # normal windows in a row inside an episode
        self.episode: dict | None = None
        self.episodes: list[dict] = []
        self._started_wall = started_wall

    def _fence(self) -> float:
        s = summarize([w.rate for w in self._ref])
        return min(s.median * (1 - self.floor), s.q1 - 1.5 * s.iqr)

    def on_window(self, w, index: int) -> str | None:
        if len(self._ref) < self.min_reference:
            self._ref.append(w)
            return None
        low = w.rate < self._fence()
        if self.episode is None:
            if not low:
                self._ref.extend(self._pending + [w])  # a dip that did not last is part of the norm
                self._pending = []
                return None
            self._pending.append(w)
            return self._begin(index) if len(self._pending) >= self.sustained else None
        self._normal = 0 if low else self._normal + 1
        self.episode["windows"] += 1
        if self._normal >= self.sustained:
            return self._end(w, index)
        return None

    def _when(self, end_s: float) -> str:
        if self._started_wall is None:
            return f"{end_s / 60:.1f} min in"
        t = _dt.datetime.fromtimestamp(self._started_wall + end_s).astimezone().strftime("%H:%M:%S")
        return f"{t}, {end_s / 60:.1f} min in"

    def _begin(self, index: int) -> str:
        first, ref = self._pending[0], summarize([w.rate for w in self._ref]).median
        now = summarize([w.rate for w in self._pending]).median
        ref_ws = list(self._ref)
        why = reasons(self._pending, ref_wait=summarize([w.wait_share for w in ref_ws]).median, ref_rate=ref,
                      ref_rss_mb=_med(ref_ws, "rss_mb"), ref_cores=_med(ref_ws, "others_cores"),
                      ref_sm_mhz=_med(ref_ws, "gpu_sm_mhz"), against="before")
        self.episode = {"began_s": round(first.end_s - first.seconds, 1),
                        "first_window": index - len(self._pending) + 1,
                        "noticed_window": index, "reference_samples_per_s": round(ref, 3),
                        "low_samples_per_s": round(now, 3), "windows": len(self._pending), "why": why}
        self._pending = []
        self.episodes.append(self.episode)
        return (f"autotune field: your run slowed down from {self._when(self.episode['began_s'])}: "
                f"{ref:.1f} -> {now:.1f} samples/s ({100 * (now / ref - 1):+.0f}%) over {self.episode['windows']} "
                f"windows; {'; '.join(why) if why else _NOTHING}")

    def _end(self, w, index: int) -> str:
        ep, self.episode, self._normal = self.episode, None, 0
        ep["recovered_s"] = round(w.end_s, 1)
        ep["recovered_window"] = index
        return (f"autotune field: recovered at {self._when(w.end_s)}: {w.rate:.1f} samples/s after "
                f"{(w.end_s - ep['began_s']) / 60:.1f} min slower")

    def to_dict(self) -> list[dict]:
        return [dict(e) for e in self.episodes]


def _med(ws, key: str) -> float | None:
    xs = [w.host[key] for w in ws if w.host.get(key) is not None]
    return summarize(xs).median if xs else None
