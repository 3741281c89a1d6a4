"""Steps in, windows out: each window at least ``window_s`` seconds and ``min_steps`` steps, its rate
(samples/s over its wall time, the data wait and the loop's own work included, as a trial's window counts them),
its data wait and its out-of-step work as shares of that time, and the host's state when it closed.

The first windows settle as a trial's do (``measure.window_settled``, at most ``measure.MAX_UNSETTLED_WINDOWS``
re-labelled warm-up); the figures are ``measure.summarize``'s median and IQR of the settled windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.measure import MAX_UNSETTLED_WINDOWS, Summary, summarize, window_settled

__all__ = ["Window", "Windows", "SETTLE_TOLERANCE", "SETTLE_WINDOWS"]

# as a trial's MeasureSpec defaults: the first window belongs if within 10% of the range of the 2 after it
SETTLE_TOLERANCE = 0.10
SETTLE_WINDOWS = 2


@dataclass(frozen=True)
class Window:
    """One closed window: when it ended (seconds since the run began), its length, steps, samples, the seconds
    it waited for data and spent on the loop's own work outside the step (evaluation), and the host then."""

    end_s: float
    seconds: float
    steps: int
    samples: float
    wait_s: float
    outside_s: float = 0.0
    host: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def outside_share(self) -> float:
        return self.outside_s / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"end_s": round(self.end_s, 3), "s": round(self.seconds, 4), "steps": self.steps,
                "samples_per_s": round(self.rate, 3), "data_wait_share": round(self.wait_share, 4),
                "outside_share": round(self.outside_share, 4), **self.host}


class Windows:
    """Accumulates steps (``add``) into windows; ``closed`` lists them in order."""

    def __init__(self, window_s: float, min_steps: int = 2) -> None:
        self.window_s = window_s
        self.min_steps = min_steps
        self.closed: list[Window] = []
        self._reset()

    def _reset(self) -> None:
        self._s = self._wait = self._outside = self._samples = 0.0
        self._steps = 0

    def add(self, *, period_s: float, samples: float, wait_s: float, outside_s: float, now_s: float,
            host: dict | None = None) -> Window | None:
        """One step of ``period_s`` seconds; the window it closes, if it closes one."""
        self._s += period_s
        self._samples += samples
        self._wait += wait_s
        self._outside += outside_s
        self._steps += 1
        if self._s < self.window_s or self._steps < self.min_steps:
            return None
        w = Window(end_s=now_s, seconds=self._s, steps=self._steps, samples=self._samples, wait_s=self._wait,
                   outside_s=self._outside, host=dict(host or {}))
        self.closed.append(w)
        self._reset()
        return w

    def settled_from(self) -> int | None:
        """Index of the first settled window (0 .. MAX_UNSETTLED_WINDOWS); None while it cannot yet be told."""
        ws, k = self.closed, 0
        while k < MAX_UNSETTLED_WINDOWS:
            if len(ws) < k + 1 + SETTLE_WINDOWS:
                return None
            if window_settled(ws[k].rate, [w.rate for w in ws[k + 1:k + 1 + SETTLE_WINDOWS]], SETTLE_TOLERANCE):
                return k
            k += 1
        return k if len(ws) > k else None

    def settled(self) -> list[Window]:
        k = self.settled_from()
        return [] if k is None else self.closed[k:]

    def summary(self) -> Summary | None:
        """Median and IQR of the settled windows' rates; None before any settled."""
        ws = self.settled()
        return summarize([w.rate for w in ws]) if ws else None
