"""summarize(): median, quartiles, IQR and the warnings a summary gives about itself."""

from __future__ import annotations

import random
import statistics

import pytest

from autotune.measure import NOISY_REL_IQR, relative_gap, summarize


def _has(warnings, word):
    return any(word in w for w in warnings)


def test_docstring_example():
    s = summarize([10, 11, 12, 13, 30])
    assert (s.n, s.median, s.q1, s.q3, s.min, s.max) == (5, 12.0, 11.0, 13.0, 10.0, 30.0)
    assert s.iqr == 2.0
    assert s.rel_iqr == pytest.approx(2 / 12)


def test_order_does_not_matter():
    a = summarize([30, 10, 13, 11, 12])
    b = summarize([10, 11, 12, 13, 30])
    assert a == b


def test_even_count_median_and_linear_quartiles():
    s = summarize([4, 1, 3, 2])
    assert s.median == 2.5
    assert s.q1 == pytest.approx(1.75)
    assert s.q3 == pytest.approx(3.25)


@pytest.mark.parametrize("seed", range(5))
def test_quartiles_match_inclusive_linear_interpolation(seed):
    rng = random.Random(seed)
    xs = [rng.uniform(50, 150) for _ in range(rng.randint(2, 15))]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    s = summarize(xs)
    assert s.q1 == pytest.approx(q1)
    assert s.median == pytest.approx(q2)
    assert s.q3 == pytest.approx(q3)
    assert s.iqr == pytest.approx(q3 - q1)


def test_quiet_samples_have_no_warnings():
    s = summarize([100, 101, 99, 100, 100.5])
    assert s.warnings == ()
    assert not s.noisy


def test_noisy_warning_above_five_percent():
    assert NOISY_REL_IQR == 0.05
    s = summarize([94, 100, 106])  # IQR 6 = 6% of the median
    assert s.noisy
    assert _has(s.warnings, "noisy")
    assert _has(s.warnings, "6.0%")


def test_exactly_five_percent_is_not_noisy():
    s = summarize([95, 100, 105])  # IQR 5 = 5% of the median
    assert s.rel_iqr == pytest.approx(0.05)
    assert not s.noisy
    assert not _has(s.warnings, "noisy")


def test_noisy_threshold_is_a_parameter():
    assert not _has(summarize([94, 100, 106], noisy_rel_iqr=0.10).warnings, "noisy")
    assert _has(summarize([99, 100, 101], noisy_rel_iqr=0.001).warnings, "noisy")


@pytest.mark.parametrize("xs, n", [([100.0], 1), ([100.0, 100.0], 2)])
def test_few_samples_warning(xs, n):
    s = summarize(xs)
    assert s.n == n
    assert _has(s.warnings, f"only {n} sample")
    assert s.iqr == 0.0


def test_three_samples_no_few_samples_warning():
    assert not _has(summarize([100, 100, 100]).warnings, "only")


def test_stall_warning():
    s = summarize([40, 100, 100, 100, 100])
    assert _has(s.warnings, "under half the median")
    assert not s.noisy  # the IQR ignores the one slow window
    assert not _has(summarize([60, 100, 100, 100, 100]).warnings, "under half")


def test_zero_median_is_infinitely_noisy():
    s = summarize([0, 0, 0])
    assert s.rel_iqr == float("inf")
    assert s.noisy


def test_empty_raises():
    with pytest.raises(ValueError, match="no samples"):
        summarize([])


def test_relative_gap():
    assert relative_gap(105, 100) == pytest.approx(0.05)
    assert relative_gap(95, 100) == pytest.approx(-0.05)
    assert relative_gap(1, 0) == float("inf")


def test_a_configs_level_over_rounds_counts_each_round_once_however_many_windows_it_held():
    """Five windows in a slow round and one in a fast one: the pooled median is the slow round's, the level the
    geometric mean of the two rounds' medians; a round with no windows is skipped, and none at all is unknown."""
    import doctest
    import statistics

    from autotune import measure
    from autotune.measure import round_level

    rounds = [[100.0], [25.0] * 5, []]
    assert statistics.median([x for r in rounds for x in r]) == 25.0
    assert round_level(rounds) == pytest.approx(50.0)
    assert round_level([[], []]) is None and round_level([[0.0]]) is None
    assert doctest.testmod(measure).failed == 0
