"""The confirmation's record: the rounds run (``confirm``) and the claim from them alone, as the recommendation
keeps it and a reader reads it back (``Confirmation``).

When the confirmation disagrees with the choice (the winner no faster than the baseline, or slower), the headline
says so and no gain is reported that the confirmation did not see (what the recommendation then states:
``rewrite.apply``). When it fails (a run out of memory, crashed or timed out, or no round fitted), the claim has no
figure (``status`` "failed", ``why``). One round (the budget ended before the second) is no claim either: its ratio
has no interval, so it is kept as ``one_round_ratio``, never as ``speedup_vs_baseline``, and the claim line says so
(``unconfirmed: one round only, x1.20 in it and no interval``). A claim whose interval is wider than +/-``NOISY``
says "noisy" in its headline.

>>> c = Confirmation(rounds=({"winner": [150.0, 152.0], "baseline": [100.0, 101.0]},
...                          {"winner": [149.0, 151.0], "baseline": [99.0, 100.0]}), ratio=1.5, low=1.47, high=1.53)
>>> c.headline()
'x1.50 (95% interval x1.47 to x1.53), confirmed over 2 interleaved rounds'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.measure import summarize

__all__ = ["Confirmation", "unconfirmed_line", "NOISY", "LEVEL"]

NOISY = 0.10        # a claim wider than +/-10% says "noisy" in its headline
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
        # "confirmed" only where the interval shows the gain: a confirmation that ran and saw none says "measured"
        shown = self.low is not None and self.low > 1
        head += f", {'confirmed' if shown else 'measured'} over {n} interleaved rounds"
        if self.noisy:
            head += f", noisy (+/-{100 * self.half_width:.0f}%)"
        if self.high is not None and self.high < 1:
            head += ": slower than the baseline"
        elif self.low is not None and not shown:
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
