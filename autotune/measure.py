"""Raw samples in, robust figures out: median, quartiles, IQR, and warnings about the samples themselves.

Modelled on ``torch.utils.benchmark.Measurement``: the raw samples are kept; everything else is derived; the
summary warns about itself when the spread is too large to rank close configs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Summary", "summarize", "NOISY_REL_IQR", "relative_gap", "median_or_none", "round_level",
           "window_settled", "MAX_UNSETTLED_WINDOWS"]

# Above this IQR/median the figure cannot separate configs that differ by a few percent.
NOISY_REL_IQR = 0.05


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without importing numpy."""
    if len(sorted_xs) == 1:
        return float(sorted_xs[0])
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return float(sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo))


@dataclass(frozen=True)
class Summary:
    """Median and spread of a set of samples (throughputs, higher is better)."""

    n: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    warnings: tuple[str, ...]

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def rel_iqr(self) -> float:
        """IQR as a fraction of the median: the spread that matters when comparing configs."""
        return self.iqr / self.median if self.median else float("inf")

    @property
    def noisy(self) -> bool:
        return self.rel_iqr > NOISY_REL_IQR


def summarize(samples: Sequence[float], *, noisy_rel_iqr: float = NOISY_REL_IQR) -> Summary:
    """Summarise samples; an empty sequence raises ``ValueError``.

    >>> s = summarize([10, 11, 12, 13, 30])
    >>> (s.median, s.iqr)
    (12.0, 2.0)
    """
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("no samples to summarise")
    med = statistics.median(xs)
    q1, q3 = _quantile(xs, 0.25), _quantile(xs, 0.75)
    warnings: list[str] = []
    if len(xs) < 3:
        warnings.append(f"only {len(xs)} sample(s): too few to trust the spread; measure 3 or more windows")
    rel = (q3 - q1) / med if med else float("inf")
    if rel > noisy_rel_iqr:
        warnings.append(
            f"noisy: IQR is {100 * rel:.1f}% of the median; configs closer than that are not told apart "
            "(close other programs, or measure longer windows)"
        )
    if len(xs) >= 3 and xs[0] < med * 0.5:
        warnings.append("slowest window under half the median: a stall or a late warm-up (consider a longer warm-up)")
    return Summary(n=len(xs), median=med, q1=q1, q3=q3, min=xs[0], max=xs[-1], warnings=tuple(warnings))


# At most this many leading windows are re-labelled warm-up before a trial measures on regardless (how many
# later windows confirm the first is ``MeasureSpec.settle_windows``).
MAX_UNSETTLED_WINDOWS = 2


def window_settled(first: float, later: Sequence[float], tolerance: float) -> bool:
    """Whether a trial's first measured window belongs to the steady state of the windows after it.

    It does when it lies within the range of ``later``, widened by ``tolerance`` each way: a window no
    further from its successors than they are from each other (plus the tolerance) is one more sample of the
    same state. Outside it, it is the tail of the warm-up (a late allocation, a recompile, the DataLoader's
    prefetched batches running out) and is re-labelled warm-up. The yardstick is the later windows' own
    spread, so on a noisy machine a first window is not thrown away for noise the others show too; and the
    test is two-sided, since a transient can be fast (prefetched batches) as well as slow.

    >>> window_settled(100.0, [104.0, 97.0], 0.10), window_settled(70.0, [104.0, 97.0], 0.10)
    (True, False)
    """
    if not later:
        return True
    return min(later) * (1 - tolerance) <= first <= max(later) * (1 + tolerance)


def relative_gap(a: float, b: float) -> float:
    """How much faster ``a`` is than ``b``, as a fraction of ``b`` (0.05 = 5% faster)."""
    return (a - b) / b if b else float("inf")


def median_or_none(xs) -> float | None:
    """The median of the figures in ``xs`` that are known (not None); None when none is."""
    known = [float(x) for x in xs if x is not None]
    return statistics.median(known) if known else None


def round_level(rounds: Sequence[Sequence[float]]) -> float | None:
    """A config's speed over its rounds (each a fresh process's windows): the geometric mean of the round medians,
    rounds with no windows skipped; None when none has windows or a median is not positive. Each round is one draw of
    the process's level, so each counts once, however many windows it held.

    >>> round(round_level([[100.0, 100.0, 100.0], [], [25.0]]), 9)
    50.0
    """
    meds = [statistics.median(r) for r in rounds if r]
    return math.exp(statistics.fmean(math.log(m) for m in meds)) if meds and min(meds) > 0 else None
