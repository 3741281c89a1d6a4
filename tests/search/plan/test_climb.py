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

And each rule's own promise, on every curve of the shape it is for (noise-free, so exact):

* a concave rise that covers the model: no count above the fewest that cover it is measured, and that fewest is
  given (or, where ``MAX_POINTS`` ends the climb first, a count within 5% of the rate wanted);
* a rise no count covers: the most workers offered;
* a rise that goes flat where the cores run out: the flat rate, at the fewest workers measured there;
* a count that fails: nothing at or above it asked again, none given, and the best rate below it given (or one
  that covers the model);
* a point starved of cores: the cores it got less one measured, and a count at least that fast given;
* two counts offered: both measured, the faster given.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable

import pytest

from autotune.search.plan.climb import MAX_POINTS, STARVED, climb
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
              points: int | None = None, fails_from: int | None = None) -> tuple[Ceilings, list[int]]:
    """The real climb over ``curve``: each point its rate (and busy cores) times a level of its own (``noise``,
    log-normal), the model ``model`` (default: ten times the best, never covered), ended after ``points`` data
    points when given; from ``fails_from`` workers on a point runs out of memory. Returns the ceilings and the
    worker counts asked, in order."""
    model = 10.0 * curve.best() if model is None else model
    asked: list[int] = []

    def run(config: dict, part: str) -> Point:
        w = config.get("num_workers", 0)
        if part == "model":
            return Point(part, config, model * math.exp(rng.gauss(0.0, noise)), windows=(1.0,))
        asked.append(w)
        if fails_from is not None and w >= fails_from:
            return Point(part, config, 0.0, status="oom", reason="a DataLoader worker was killed (OOM)")
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


# --- the rules' own promises, each on curves of the shape the rule is for (noise-free: exact, on every curve) ---

def draw_rise(rng: random.Random, *, flat: bool = False) -> Curve:
    """A concave rise ``w x q / (1 + k w)`` over 1 to 2-64 workers offered; ``k`` at most 0.05, so it grows by more
    than ``GROWTH`` a doubling up to 64 workers (slower growth is the climb's sign that the cores ran out). With
    ``flat``, the cores run out at a random knee: from there on the rate is the knee's (``min(rise, rise(knee))``)."""
    top = rng.choice([2, 3, 8, 16, 32, 64])
    q, k = rng.uniform(100.0, 3000.0), rng.uniform(0.0, 0.05)
    knee = rng.uniform(0.5, top) if flat else math.inf
    cap = knee * q / (1 + k * knee) if flat else math.inf

    def rate(w: int) -> float:
        return min(w * q / (1 + k * w), cap)

    return Curve(top, rate, lambda w: float(w + 1), list(range(1, top + 1)), "flat" if flat else "rise")


def test_on_a_concave_rise_that_covers_the_model_the_climb_gives_the_fewest_workers_that_cover_it():
    """``next_workers``: each prediction from a point of a concave rise undershoots, so the climb never measures
    more workers than the fewest that cover the model with ``HEADROOM`` (more would only take memory), and it gives
    that fewest count; only where ``MAX_POINTS`` ends the climb first (a rise that bends hard near its top, 2 of 300
    curves) does it give the last count it reached, and that one still runs within 5% of the rate wanted."""
    ended = 0
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_rise(rng)
        model = curve.best() / HEADROOM * rng.uniform(0.05, 1.0)
        c, asked = run_climb(curve, rng, model=model)
        fewest = next(w for w in curve.offered if curve.rate(w) >= model * HEADROOM)
        w = given(c)
        assert max(asked) <= fewest and len(asked) == len(set(asked)) <= MAX_POINTS, (seed, asked, fewest)
        assert w == fewest or len(asked) == MAX_POINTS, (seed, asked, w, fewest)
        assert curve.rate(w) >= 0.95 * model * HEADROOM, (seed, asked, w, fewest)
        ended += w != fewest
    assert ended <= 0.05 * CURVES, ended


def test_on_a_rise_the_model_outruns_the_climb_gives_the_most_workers_offered():
    """Where the data path still rises at the most workers offered and no count covers the model, the climb's
    first pass goes to the most offered, and the count it gives is that top (the fastest: ``best_point``)."""
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_rise(rng)
        c, asked = run_climb(curve, rng, model=curve.best() * rng.uniform(1.0, 20.0))
        assert given(c) == curve.offered[-1] and not c.feeds(), (seed, asked, given(c))
        assert len(asked) == len(set(asked)) <= MAX_POINTS and set(asked) <= set(curve.offered), (seed, asked)


def test_where_the_cores_run_out_the_climb_gives_the_flat_rate_at_the_fewest_workers_it_measured_there():
    """A rise that goes flat where the cores run out (at a random knee, anywhere from below one worker to the
    most offered): the count given runs at the flat rate, and among the counts measured there it is the fewest
    (``best_point``: more workers at the same rate only take memory and cores); the ceilings say the data path
    binds, and read back give the same count."""
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_rise(rng, flat=True)
        c, asked = run_climb(curve, rng)
        w, top = given(c), curve.best()
        assert curve.rate(w) == top, (seed, asked, w)
        assert w == min(v for v in asked if curve.rate(v) == top), (seed, asked, w)
        back = Ceilings.from_dict(c.to_dict())  # rates kept to 3 decimals
        assert back.to_dict() == c.to_dict() and back.workers_to_feed() == w, seed
        assert c.to_dict()["binds"] == "data" and not c.feeds(), seed
        assert len(asked) == len(set(asked)) <= MAX_POINTS and set(asked) <= set(curve.offered), (seed, asked)


def test_a_count_that_fails_bounds_the_climb_which_gives_the_best_rate_below_it():
    """From a random count on, every point runs out of memory (or crashes). ``next_workers``: a count that failed
    bounds the climb (nothing at or above it is asked again; the next point halves the gap below it), so the climb
    never gives a count that failed, and on a rise, flat or not, it gives a count at the best rate below the
    failure, or one that covers the model with ``HEADROOM`` where one there does; each failure is said."""
    for seed in range(CURVES):
        rng = random.Random(seed)
        curve = draw_rise(rng, flat=rng.random() < 0.5)
        fails_from = rng.randint(2, curve.offered[-1])
        below = max(curve.rate(w) for w in curve.offered if w < fails_from)
        model = rng.choice([10.0 * curve.best(), below * rng.uniform(0.3, 1.0) / HEADROOM])
        c, asked = run_climb(curve, rng, model=model, fails_from=fails_from)
        failed = [i for i, w in enumerate(asked) if w >= fails_from]
        assert all(w < asked[i] for i in failed for w in asked[i + 1:]), (seed, asked)
        assert len(asked) == len(set(asked)) <= MAX_POINTS, (seed, asked)
        w = given(c)
        assert w < fails_from and curve.rate(w) >= min(below, model * HEADROOM), (seed, fails_from, asked, w)
        assert sum("did not run (oom)" in n for n in c.notes) == len(failed), c.notes


def test_on_a_host_whose_other_jobs_hold_cores_the_climb_measures_the_cores_a_point_got_less_one():
    """``refine_workers``: a point that kept fewer cores busy than ``STARVED`` of its workers and training process
    says what the host gives; the climb measures the cores it got less the training process's one, and the count it
    gives runs at least as fast as that count (the rule's floor; a faster count it finds is welcome). On the random
    hosts of ``draw_curve`` whose other jobs hold all but a few cores."""
    held = 0
    for seed in range(3 * CURVES):
        rng = random.Random(seed)
        curve = draw_curve(rng)
        if curve.shape != "starved":
            continue
        c, asked = run_climb(curve, rng)
        starved = [w for w in asked if w > 1 and curve.busy(w) < STARVED * (w + 1)]
        if not starved:
            continue
        held += 1
        got = curve.busy(starved[0])  # every starved point got the same cores here: the host's free ones
        rule = max((v for v in curve.offered if v <= max(1, round(got - 1))), default=curve.offered[0])
        assert rule in asked, (seed, asked, got)
        assert curve.rate(given(c)) >= curve.rate(rule), (seed, asked, given(c), rule)
        assert len(asked) == len(set(asked)) <= MAX_POINTS, (seed, asked)
    assert held >= CURVES // 2, held  # the rule applied on enough hosts to say something


@pytest.mark.parametrize("rates", [{1: 320.0, 2: 300.0}, {1: 300.0, 2: 330.0}])
def test_with_two_counts_offered_the_climb_measures_each_once_and_gives_the_faster(rates):
    """A VM of two cores: the second worker may take the training process's core and the data path slow (the slow
    end-to-end test first met that as a TypeError)."""
    curve = Curve(2, rates.__getitem__, lambda w: float(w + 1), [1, 2], "two")
    c, asked = run_climb(curve, random.Random(0))
    assert sorted(asked) == [1, 2] and given(c) == max(rates, key=rates.__getitem__), (asked, given(c))
