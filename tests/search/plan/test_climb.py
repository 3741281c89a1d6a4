"""The climb over workers (search.plan.climb) held to properties over many random unimodal data paths, not to the
values one simulator seed drew (issue 52, item 7).

Each curve is drawn from a seeded generator: a concave rise (``w x q / (1 + k w)``), on some a memory bandwidth's
knee met softly and a loss past it, on some a host whose other jobs hold all but a few cores (past them every thread
shares what is left, as ``benchmarks/gpu_host_sim.py``'s busy host). The climb runs on the real ``climb`` with a
runner that answers from the curve, with or without a 5% per-process level (``PROCESS_SIGMA`` on the H200: 5.1%), and
with or without a budget that ends it after 5 data points (what a 3-minute share holds on a 64-core host).

What is held, and why it is the rule's and not the seed's:

* every point is a count offered, none twice, at most ``MAX_POINTS``; the count given was measured, or is the one a
  cut climb was about to measure (``Ceilings.cut``);
* without noise the count given runs within 5% of the best count the climb measured, on every curve, cut or not
  (the climb never gives away what it saw);
* where the data path covers the model, the count given covers it too and is no more than a quarter above the
  fewest that cover it with ``HEADROOM`` (more workers only take memory and cores);
* with 5% noise, the same within 5% of the best it measured on at least 94% of curves (a single point is one
  process: 18 of 500 curves miss it);
* against the curve's true best, over all counts offered, within 5% on at least 82% of curves without noise (75%
  with it). On
  every curve it is not: ``test_the_climb_is_within_5_percent_of_the_true_best_on_every_curve`` is an expected
  failure naming the three shapes where it falls short;
* on wide tops (a memory bandwidth's knee, then a fall), with 5% noise, within 5% of the true best on at least 91%
  of curves: the rules for the noise (the centre of the top, a cut climb's next count) are what holds it there.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable

import pytest

from autotune.search.plan.climb import MAX_POINTS, climb
from autotune.search.record.ceilings import HEADROOM, Ceilings, Point

CURVES = 300  # a fraction of a second each property


@dataclass(frozen=True)
class Curve:
    """One random unimodal data path: its true rate and the cores its point keeps busy, by workers."""

    cores: int
    rate: Callable[[int], float]
    busy: Callable[[int], float]
    offered: list[int]
    shape: str

    def best(self) -> float:
        return max(self.rate(w) for w in self.offered)


def draw_curve(rng: random.Random) -> Curve:
    """A unimodal data path on a host of 8 to 64 cores (module docstring)."""
    cores = rng.choice([8, 16, 32, 64])
    q, k = rng.uniform(100.0, 3000.0), rng.uniform(0.0, 0.05)
    knee = rng.choice([None, rng.randint(2, cores - 1)])
    loss, soft = rng.uniform(0.0, 0.5), rng.choice([2, 4, 8])
    free = rng.choice([None, None, rng.randint(2, cores - 1)])

    def rate(w: int) -> float:
        r = w * q / (1 + k * w)
        if knee:
            bandwidth = knee * q / (1 + k * knee)
            r = (r ** -soft + bandwidth ** -soft) ** (-1 / soft) / (1 + loss / max(1, cores - knee) * max(0, w - knee))
        if free:  # our workers and the training process share the cores the other jobs leave
            r *= min(1.0, free / (w + 1)) / (1 + 0.03 * max(0, w + 1 - free))
        return r

    def busy(w: int) -> float:
        return float(min(cores, free or cores, w + 1))

    offered = list(range(1, cores + (0 if rng.random() < 0.5 else 1)))  # on a GPU the climb leaves one core
    shape = "starved" if free else "knee" if knee else "rise"
    return Curve(cores, rate, busy, offered, shape)


def run_climb(curve: Curve, rng: random.Random, *, noise: float = 0.0, model: float | None = None,
              points: int | None = None) -> tuple[Ceilings, list[int]]:
    """The real climb over ``curve``: each point its rate (and busy cores) times a level of its own (``noise``,
    log-normal), the model ``model`` (default: ten times the best, never covered), ended after ``points`` data
    points when given. Returns the ceilings and the worker counts asked, in order."""
    model = 10.0 * curve.best() if model is None else model
    asked: list[int] = []

    def run(config: dict, part: str) -> Point:
        w = config.get("num_workers", 0)
        if part == "model":
            return Point(part, config, model * math.exp(rng.gauss(0.0, noise)), windows=(1.0,))
        asked.append(w)
        level = math.exp(rng.gauss(0.0, noise))
        return Point(part, config, curve.rate(w) * level, windows=(1.0,),
                     cpu_cores_used=curve.busy(w) * math.exp(rng.gauss(0.0, noise)))

    count = iter(range(10 ** 6))
    fits = (lambda: next(count) < points) if points else (lambda: True)
    return climb({}, {}, curve.offered, run, fits=fits), asked


def given(c: Ceilings) -> int:
    """The count the ceilings give the search (``feed``'s), never None here: every point runs."""
    w = c.workers_to_feed()
    assert w is not None
    return w


@pytest.mark.parametrize("noise, points", [(0.0, None), (0.0, 5), (0.05, None), (0.05, 5)])
def test_every_point_is_offered_once_at_most_max_points_and_the_count_given_was_measured_or_is_the_cut(
        noise, points):
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_curve(rng)
        c, asked = run_climb(curve, rng, noise=noise, points=points)
        assert len(asked) == len(set(asked)) <= (points or MAX_POINTS), (seed, asked)
        assert all(w in curve.offered for w in asked), (seed, asked)
        w = given(c)
        assert w in asked or (w == c.cut and "unmeasured alone" in c.unmeasured()), (seed, asked, w, c.cut)
        if c.cut is not None:  # the count it was about to measure: what the same climb measures next, uncut
            _, whole = run_climb(curve, random.Random(seed + 10 ** 6), noise=0.0) if not noise else (None, None)
            assert whole is None or whole[len(asked)] == c.cut, (seed, asked, whole, c.cut)


@pytest.mark.parametrize("points", [None, 5])
def test_without_noise_the_count_given_is_within_5_percent_of_the_best_the_climb_measured_on_every_curve(points):
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_curve(rng)
        c, asked = run_climb(curve, rng, points=points)
        seen = max(curve.rate(w) for w in asked)
        assert curve.rate(given(c)) >= 0.95 * seen, (seed, curve.shape, asked, given(c))


def test_where_the_data_path_covers_the_model_the_count_given_covers_it_and_is_near_the_fewest_that_do():
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_curve(rng)
        model = curve.best() * rng.uniform(0.2, 0.8)  # some count covers it with headroom
        c, asked = run_climb(curve, rng, model=model)
        w = given(c)
        fewest = next(v for v in curve.offered if curve.rate(v) >= model * HEADROOM)
        assert curve.rate(w) >= model, (seed, asked, w)
        assert w <= fewest + max(1, fewest // 4), (seed, asked, w, fewest)


def test_with_a_5_percent_level_per_point_the_count_given_is_within_5_percent_of_the_best_it_measured():
    """One point is one process: its level moves 5%. The climb's pick on a top (the centre of the points within the
    noise of the fastest, ``ceilings.best_point``) keeps the count given within 5% of the best measured (true rates)
    on at least 94% of curves; without noise the fastest measured would always be right (the test above)."""
    for points in (None, 5):
        ratios, covered = [], 0
        for seed in range(CURVES):
            rng = random.Random(seed)
            curve = draw_curve(rng)
            c, asked = run_climb(curve, rng, noise=0.05, points=points)
            ratios.append(curve.rate(given(c)) / max(curve.rate(w) for w in asked))
            fed_rng = random.Random(seed)
            fed_curve = draw_curve(fed_rng)
            model = fed_curve.best() * fed_rng.uniform(0.2, 0.8)
            fed, _ = run_climb(fed_curve, fed_rng, noise=0.05, model=model)
            covered += fed_curve.rate(given(fed)) >= 0.95 * model
        assert sum(r >= 0.95 for r in ratios) >= 0.94 * CURVES, sorted(ratios)[:20]
        assert statistics.median(ratios) >= 0.99 and min(ratios) >= 0.8, sorted(ratios)[:5]
        assert covered >= 0.97 * CURVES, covered


@pytest.mark.parametrize("noise, points, share", [(0.0, None, 0.85), (0.0, 5, 0.82), (0.05, None, 0.75),
                                                   (0.05, 5, 0.75)])
def test_the_climb_is_within_5_percent_of_the_true_best_on_most_curves(noise, points, share):
    """Against the best over every count offered, which the climb cannot see: within 5% on at least ``share`` of
    the curves (measured on these 300: 88% without noise or budget, 84% ended after 5 points, 80% and 79% with 5%
    noise), the median at the best, and never below half of it."""
    ratios = []
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_curve(rng)
        c, _ = run_climb(curve, rng, noise=noise, points=points)
        ratios.append(curve.rate(given(c)) / curve.best())
    assert sum(r >= 0.95 for r in ratios) >= share * CURVES, sorted(ratios)[:20]
    assert statistics.median(ratios) >= 0.99 and min(ratios) >= 0.5, sorted(ratios)[:5]


def draw_wide_top(rng: random.Random) -> Curve:
    """A data path whose memory bandwidth saturates softly at a fifth to half of 16 to 64 cores and then loses 25-50%
    by the last core (``gpu_host_sim``'s membw hosts, randomised): a wide top within the noise, then a fall."""
    cores = rng.choice([16, 32, 64])
    q, k = rng.uniform(200.0, 2000.0), rng.uniform(0.0, 0.04)
    knee, loss = rng.randint(max(2, cores // 5), cores // 2), rng.uniform(0.25, 0.5)

    def rate(w: int) -> float:
        rise, bandwidth = w * q / (1 + k * w), knee * q / (1 + k * knee)
        fall = (1 / (1 - loss) - 1) / (cores - knee) * max(0, w - knee)
        return (rise ** -4 + bandwidth ** -4) ** -0.25 / (1 + fall)

    return Curve(cores, rate, lambda w: float(w + 1), list(range(1, cores)), "wide top")


@pytest.mark.parametrize("points", [None, 5])
def test_on_a_wide_top_with_5_percent_noise_the_climb_gives_a_count_within_5_percent_of_the_best(points):
    """Where the noise's pick matters: on a wide top the fastest single point is often an end where the rate already
    falls. The centre of the points within the noise of the fastest (``ceilings.best_point``, ``climb._centre``) and,
    where a budget ends the climb first, the count it was about to measure (``Ceilings.best_data``) give a count
    within 5% of the true best on at least 91% of 300 such curves (93.7% measured, with or without the budget);
    the noisy fastest gives 80%, and without the cut's count a 5-point budget gives 89%."""
    ratios = []
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_wide_top(rng)
        c, _ = run_climb(curve, rng, noise=0.05, points=points)
        ratios.append(curve.rate(given(c)) / curve.best())
    assert sum(r >= 0.95 for r in ratios) >= 0.91 * CURVES, sorted(ratios)[:20]
    assert min(ratios) >= 0.8


@pytest.mark.xfail(strict=True, reason="36 of 300 curves fall short, in three shapes (issue 52, item 7): on 16 to "
                   "64 cores a long rise past halfway climbed one worker a point (the knee's 'count above a best on "
                   "the rise') until MAX_POINTS ends it below the top (18); a host whose other jobs leave few cores, "
                   "where the starved rule's 'cores less one' is below the best (sharing them among more workers "
                   "still gains; 9); a soft knee the three-point lines misread, stopping a few workers off it (9)")
def test_the_climb_is_within_5_percent_of_the_true_best_on_every_curve():
    short = []
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_curve(rng)
        c, asked = run_climb(curve, rng)
        if curve.rate(given(c)) < 0.95 * curve.best():
            short.append((seed, curve.shape, asked, given(c)))
    assert not short, short[:10]
