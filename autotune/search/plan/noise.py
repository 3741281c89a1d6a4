"""How far one comparison of two trials in the planned search strays by chance, and when a gain clears it.

Each trial is a fresh process, and on a shared VM fresh processes of one config differ more than the windows within
one do (5-20% minutes apart). Two figures come from the study's trials up to a decision (later trials never move
them, so a decision once taken stays):

* ``single_noise``: the bar one trial of each must clear, the median window spread or the median gap between two
  processes of one config (the plan's repeats), at least the floor (5%);
* ``comparison_sd``: the standard deviation of one comparison's log ratio, from the same gaps (each is exactly a
  comparison of a config with itself), pooled with ``PRIOR_REPEATS`` gaps at the floor while they are few.

``repeat_keeps`` decides a candidate within the noise that was measured again beside the incumbent (docs/search.md,
"Effects within the noise"; ``benchmarks/keep_rule.py``).

>>> round(single_noise([0.01], [0.02], 0.05), 3), round(comparison_sd([0.01], [], 0.05), 3)
(0.05, 0.05)
>>> repeat_keeps([0.03, 0.038], 0.08)[0], repeat_keeps([0.03, 0.038], 0.03)[0]
(False, True)
"""

from __future__ import annotations

import math

from autotune.measure import median_or_none

__all__ = ["REPEAT_Z", "PRIOR_REPEATS", "single_noise", "comparison_sd", "repeat_keeps"]

# The z a repeated candidate's two paired rounds' mean log ratio must clear (one-sided 10%: a search decision, not a
# claim; the finalists re-measure the top configs paired) ...
REPEAT_Z = 1.2816
# ... in units of ``comparison_sd``, whose repeats' gaps are pooled with this many at the floor: one lucky repeat
# pair 0.2% apart must not make every later 1% look like a gain
PRIOR_REPEATS = 2


def single_noise(spreads: list[float], gaps: list[float], floor: float) -> float:
    """The relative gap one trial of each must clear: the larger of the median window spread (``spreads``, relative
    IQRs) and the median gap between two fresh processes of one config (``gaps``, absolute log ratios), at least
    ``floor`` (issue 50: repeats +2.7% once and +21.5% over two rounds, where the windows said 5%)."""
    return max(floor, median_or_none(spreads) or 0.0, math.expm1(median_or_none(gaps) or 0.0))


def comparison_sd(spreads: list[float], gaps: list[float], floor: float) -> float:
    """The standard deviation of one comparison's log ratio (two fresh processes): the root mean square of ``gaps``
    pooled with ``PRIOR_REPEATS`` at ``floor``; at least the median window spread."""
    pooled = math.sqrt((PRIOR_REPEATS * floor ** 2 + sum(g * g for g in gaps)) / (PRIOR_REPEATS + len(gaps)))
    return max(pooled, median_or_none(spreads) or 0.0)


def repeat_keeps(logs: list[float], sd: float) -> tuple[bool, float]:
    """``(kept, bar)`` for a candidate measured twice beside the incumbent (``logs``: each round's log ratio, the
    second run side by side): kept when the second round is above 1 too and the two rounds' mean log ratio clears
    ``bar``, ``REPEAT_Z`` standard errors of a two-round mean. Not the two rounds' own spread: Student's t with one
    degree of freedom (the rule before 2026-11-29) tested whether they agreed, and round 1 was chosen for landing
    above 1; two rounds at +3% that agree are no gain where one comparison strays 8%."""
    bar = REPEAT_Z * sd / math.sqrt(len(logs))
    return logs[-1] > 0 and sum(logs) / len(logs) > bar, bar
