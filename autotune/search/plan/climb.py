"""The climb over workers: which data-path points the ceilings measure (``search.record.ceilings`` holds them and
the model of the pipeline that reads them; ``ceiling_runs`` says when, and runs each point in a child).

Like tf.data's AUTOTUNE hill-climb, but every point is a measurement: one worker first, then the count its rate
predicts would cover the model's with ``HEADROOM``, then the count that point predicts (the rate is concave: each
prediction undershoots less), until it covers the model, reaches the most workers offered or stops growing (the
cores ran out): a few children, never one per worker count (``next_workers``). Then the count the ceilings would
recommend is measured (``refine_workers``): the fewest that feed the model, the cores a starved point got, the
centre of a peak's top (the points within the noise of the fastest: one process's level moves 5%, so on a flat top
the fastest single point is the noise's pick), or the knee of a data path that peaks below the most workers.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from autotune.search.record.ceilings import (HEADROOM, Ceilings, Point, centre_measured, fastest_point, peaked,
                                             plateau)

__all__ = ["MAX_POINTS", "STARVED", "GROWTH", "grew", "next_workers", "Run", "climb", "refine_workers"]

# The most data-path points a climb measures (it usually needs 2 to 5: ``next_workers``, ``refine_workers``); a
# budget's share of the search usually stops it sooner (``ceiling_runs``).
MAX_POINTS = 8
# A point whose workers outnumber the cores it kept busy by this much ran on fewer cores than it had threads: the
# host's other jobs, a cgroup's share, or a training process that cannot take the batches faster (``refine_workers``).
STARVED = 0.75
# Doubling the workers must raise the data rate by this much for the climb to go on: less, the cores ran out.
GROWTH = 1.10


def grew(before: Point, after: Point) -> bool:
    """Whether the data rate grew from ``before`` to ``after`` (more workers) by ``GROWTH`` for a doubling of the
    workers, in proportion for less (a bisection's neighbours are a worker apart).

    >>> p = lambda w, r: Point("data", {"num_workers": w}, r)
    >>> grew(p(1, 100.0), p(10, 109.0)), grew(p(1, 100.0), p(10, 111.0)), grew(p(10, 1500.0), p(11, 1550.0))
    (False, True, True)
    """
    ratio = after.workers / max(1, before.workers)
    return after.samples_per_s >= before.samples_per_s * GROWTH ** min(1.0, math.log2(max(ratio, 1.0)))


def next_workers(points: list[Point], target: float, offered: list[int]) -> int | None:
    """The next worker count the climb measures, or None when it is done: one worker first (a worker's rate); then
    the count that rate predicts would reach ``target`` (at least one more than the last, at most the most
    offered); then, while the rate still grows by ``GROWTH``, the count the last point predicts, and so on. The data
    rate is concave in the workers (they share cores, memory bandwidth, the GIL of the pinning thread), so a
    prediction from a point undershoots and the next corrects it: a few children, never one per worker count.

    >>> p = lambda w, r: Point("data", {"num_workers": w}, r)
    >>> next_workers([], 1000.0, list(range(1, 65))), next_workers([p(1, 100.0)], 1000.0, list(range(1, 65)))
    (1, 10)
    >>> next_workers([p(1, 100.0), p(10, 800.0)], 1000.0, list(range(1, 65)))
    13
    >>> next_workers([p(1, 100.0), p(10, 1100.0)], 1000.0, list(range(1, 65))) is None  # covered
    True

    A count that failed (out of memory, a crash) bounds the climb: the next point halves the gap below it.

    >>> next_workers([p(1, 100.0), Point("data", {"num_workers": 10}, 0.0, status="oom")], 1000.0, list(range(1, 65)))
    6
    """
    if not offered:
        return None
    ok = sorted((q for q in points if q.status == "ok" and q.samples_per_s > 0), key=lambda q: q.workers)
    if not ok:
        return None if points else offered[0]
    last = ok[-1]
    if len(ok) >= 2 and not grew(ok[-2], last):  # the cores ran out
        return None
    failed = [q.workers for q in points if q.status != "ok" and q.workers > last.workers]
    if failed:  # a count above the best ran out of memory or crashed: halve the gap below it, once a point
        between = [c for c in offered if last.workers < c < min(failed)]
        return between[len(between) // 2] if between and last.samples_per_s < target else None
    if last.samples_per_s >= target or last.workers >= offered[-1]:
        return None
    if math.isinf(target):  # no model figure to cover (it failed alone): the most workers offered
        return offered[-1]
    want = max(last.workers + 1, math.ceil(last.workers * target / last.samples_per_s))
    return next((c for c in offered if c >= want), offered[-1])


Run = Callable[[dict[str, Any], str], Point]  # (config dict, part) -> the point measured


def climb(model_config: dict[str, Any], data_config: dict[str, Any], offered: list[int], run: Run, *,
          log: Callable[[str], None] = lambda _: None, why: str = "", world: int = 1,
          fits: Callable[[], bool] = lambda: True) -> Ceilings:
    """Measure the model alone on ``model_config``, then the data path on ``data_config`` at the worker counts
    ``next_workers`` picks from ``offered``, until it covers the model with ``HEADROOM``, reaches the most workers
    offered, or grows by less than ``GROWTH`` from the point before; then the counts ``refine_workers`` picks (the
    count the ceilings would recommend, measured; the knee of a data path that peaks below the most workers), at
    most ``MAX_POINTS`` data points in all. ``run`` measures one point in a child; ``fits()`` says whether one more
    fits the time the climb was given (a budget's share: ``ceiling_runs``), checked before each data point.
    ``world``: DDP ranks per trial (the cores a point kept busy are all ranks')."""
    model = run(model_config, "model")
    log(f"ceiling: the model alone {model.line()}")
    target = model.samples_per_s * HEADROOM if model.status == "ok" else math.inf
    points: list[Point] = []
    notes: list[str] = []
    first_pass, cut = True, None
    while len(points) < MAX_POINTS:
        w = next_workers(points, target, offered) if first_pass else None
        if w is None:
            first_pass = False
            w = refine_workers(points, target, offered, world=world)
        if w is None:
            break
        if not fits():
            notes.append(f"the budget's share of the search ended the climb after {len(points)} data point(s) "
                         f"(next: {w} workers)")
            cut = w
            break
        p = run({**data_config, "num_workers": w}, "data")
        points.append(p)
        log(f"ceiling: the data path with {w} worker(s) {p.line()}")
        if p.status != "ok":  # the climb goes on below it (``next_workers``)
            notes.append(f"the data path with {w} worker(s) did not run ({p.status}): {p.reason}")
            continue
        ok = sorted((q for q in points[:-1] if q.status == "ok" and q.workers < w), key=lambda q: q.workers)
        if first_pass and ok and p.samples_per_s < target and not grew(ok[-1], p):
            notes.append(f"the data path stopped growing at {ok[-1].workers} -> {w} workers "
                         f"({ok[-1].samples_per_s:.0f} -> {p.samples_per_s:.0f} samples/s): the cores ran out")
    return Ceilings(model=model, data=tuple(points), why=why, notes=tuple(notes), cut=cut)


def _line(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """``(slope, intercept)`` of the line through two ``(workers, rate)`` points."""
    slope = (b[1] - a[1]) / (b[0] - a[0]) if b[0] != a[0] else 0.0
    return slope, a[1] - slope * a[0]


def _smooth(a: Point, b: Point, top: Point) -> bool:
    """Whether ``top`` is where a data path that shares its cores evenly would be: ``w x q / (1 + k (w - 1))``, the
    curve through ``a`` and ``b`` (fewer workers), predicts it within 20% (three noisy points; a data path that
    peaked below ``top`` is off by far more). Then it still rises at ``top``."""
    qa, qb = a.samples_per_s / a.workers, b.samples_per_s / b.workers
    denominator = qb * (b.workers - 1) - qa * (a.workers - 1)
    k = max(0.0, (qa - qb) / denominator) if denominator > 0 else 0.0
    q1 = qa * (1 + k * (a.workers - 1))
    return top.workers * q1 / (1 + k * (top.workers - 1)) <= top.samples_per_s * 1.2


def refine_workers(points: list[Point], target: float, offered: list[int], *, world: int = 1) -> int | None:
    """The next count the climb measures once its first pass (``next_workers``) is done, or None: it measures the
    count the ceilings would recommend.

    * The data path covers the model: the fewest workers that feed it (``workers_to_feed``, interpolated), when
      that count was not measured.
    * A point ran on fewer cores than it had workers (``STARVED``: other jobs hold cores, or a cgroup's share): the
      cores it got, less the training process's one; done once that count measured the fastest (the knee's lines
      through the one-worker point, a straight rise, would land below it: the rise is concave).
    * Else the knee of a data path that peaks below the most workers (memory bandwidth; the host's cores shared):
      the count where the rise from the points below the best meets the line from the best to the point above it
      (flat without one), after a point halfway where the shape is unknown (``_knee``). When it lands on a best
      that is still on the rise, its neighbour above is measured (the rise is concave: the estimate falls short).
      Done when the best still rises as evenly shared cores would (``_smooth``).
    * Before the knee, where the data path peaks (a point above its top measured below it), the centre of the top
      (``ceilings.plateau``: the points within the noise of the fastest) when no point measured is near it: the
      count the ceilings recommend there (``ceilings.best_point``), where the knee's lines only estimate it. (When a
      budget ends the climb first, the count it was about to measure is kept, ``Ceilings.cut``: ``best_data``.)

    >>> p = lambda w, r, cores=None: Point("data", {"num_workers": w}, r, cpu_cores_used=cores)
    >>> refine_workers([p(1, 100.0), p(8, 1100.0)], 1000.0, list(range(1, 17)))  # covered: 1000 needs 8 by the line
    >>> refine_workers([p(1, 320.0), p(15, 1265.0)], 11300.0, list(range(1, 16)))  # 15 is slow: halfway tells why
    8
    >>> refine_workers([p(1, 320.0), p(4, 1185.0), p(15, 1265.0)], 11300.0, list(range(1, 16)))  # the rise meets it
    5
    >>> refine_workers([p(1, 226.0), p(53, 3450.0), p(63, 3530.0)], 11900.0, list(range(1, 64)))  # 2 to 52 unseen
    27
    >>> refine_workers([p(1, 320.0, 2.0), p(15, 1489.0, 8.0)], 11300.0, list(range(1, 16)))  # 8 cores for 16 threads
    7
    >>> refine_workers([p(1, 320.0), p(2, 300.0)], 11300.0, [1, 2])  # one worker is the fastest: nothing below it
    >>> refine_workers([p(1, 310.0), p(15, 931.0), p(8, 1045.0), p(4, 1064.0)], 9e3, list(range(1, 16)))
    6

    (4 and 8 agree within the noise, ``PLATEAU``: the centre of the two; the knee's lines cross nowhere between.)
    """
    ok = sorted((q for q in points if q.status == "ok" and q.samples_per_s > 0), key=lambda q: q.workers)
    if not ok or not offered:
        return None
    measured = {q.workers for q in points}
    fastest = max(ok, key=lambda q: q.samples_per_s)
    if fastest.samples_per_s >= target:  # it covers: the count the ceilings would feed, measured
        want = Ceilings(model=Point("model", {}, target / HEADROOM), data=tuple(ok)).workers_to_feed()
        want = next((c for c in offered if c >= (want or 0)), offered[-1])
        return want if want not in measured else None
    for q in ok:  # the cores the host gave: fewer than the point's workers and its training process
        got = (q.cpu_cores_used or 0.0) / max(1, world)
        if got and q.workers > 1 and got < STARVED * (q.workers + 1):
            want = max((c for c in offered if c <= max(1, round(got - 1))), default=offered[0])
            if want not in measured:
                return want
            if fastest.workers == want:  # measured, and the fastest: the cores say the count, not the knee's lines
                return None
    centre = _centre(ok, measured, offered)
    return centre if centre is not None else _knee(ok, measured, offered)


def _centre(ok: list[Point], measured: set[int], offered: list[int]) -> int | None:
    """The count at the centre of the data path's top (``plateau``) where it peaks (a point above the top measured
    below it) and no point measured is within a quarter of the top's width of the centre; else None."""
    band = plateau(ok)
    if not peaked(ok, band) or centre_measured(band):
        return None
    lo, hi = band[0].workers, band[-1].workers
    centre = (lo + hi) / 2
    between = [c for c in offered if lo < c < hi and c not in measured]
    return min(between, key=lambda c: (abs(c - centre), c)) if between else None


def _knee(ok: list[Point], measured: set[int], offered: list[int]) -> int | None:
    """``refine_workers``' last case: the knee of a data path that peaks below the most workers measured.

    * The best is the most workers measured: with one point below it, the count halfway (the curve's shape between
      them is unknown), and so where the two points below it leave more than half its workers unseen between them
      (the first pass jumped there from one worker's rate: a peak in that gap, memory bandwidth's, and a rise to the
      best look alike from three points); else done when it still rises as evenly shared cores would (``_smooth``).
    * Else where the rise (through the two highest points below the best; the origin and the one point where there
      is only one) meets the fall (through the best and the lowest point above it; flat without one). Where that is
      at or below a best still on the rise (the rise is concave: the estimate falls short), the count above it."""
    best = fastest_point(ok)  # the fastest measured, where the rise ends
    below = [q for q in ok if q.workers < best.workers]
    above = [q for q in ok if q.workers > best.workers]
    lo, hi = (below[-1].workers if below else 0), (above[0].workers if above else best.workers)

    def nearest(a: int, b: int, want: float) -> int | None:
        between = [c for c in offered if a < c < b and c not in measured]
        return min(between, key=lambda c: (abs(c - want), c)) if between else None

    if not below:  # the fewest workers measured are the fastest (one worker, on a machine of two cores): done
        return None
    if not above and len(below) == 1:
        return nearest(lo, best.workers, (lo + best.workers) / 2)
    gap = below[-2:] if not above and len(below) >= 2 else []
    if gap and gap[1].workers - gap[0].workers > best.workers / 2:
        half = nearest(gap[0].workers, gap[1].workers, (gap[0].workers + gap[1].workers) / 2)
        if half is not None:
            return half
    if not above and len(below) >= 2 and _smooth(below[-2], below[-1], best):
        return None  # it still rises at the best, as evenly shared cores do
    rise = _line(*[(float(q.workers), q.samples_per_s) for q in ([Point("data", {}, 0.0)] + below)[-2:]])
    fall = (_line((best.workers, best.samples_per_s), (above[0].workers, above[0].samples_per_s)) if above
            else (0.0, best.samples_per_s))
    if rise[0] <= 0 or rise[0] <= fall[0]:  # no rise below the best (two noisy points): nothing to meet
        return None
    want = math.ceil((fall[1] - rise[1]) / (rise[0] - fall[0]) - 1e-9)
    if want <= best.workers < hi and best.samples_per_s >= 0.9 * (rise[0] * best.workers + rise[1]):
        want = best.workers + 1  # the best is on the rise, which is concave: the estimate falls short
    if not lo < want < hi or want in measured:
        return None
    return nearest(lo, hi, want)

