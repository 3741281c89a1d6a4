"""The within/below/above rule: its error rate by seeded simulation (benchmarks/coverage.py's process model), its
power, and its figures."""

from __future__ import annotations

import pytest

from autotune.field.judge import Claim, process_range, verdict
from autotune.field.simulate import statement_rates
from autotune.search.choose.settle import t_quantile


def t975(df: int) -> float:
    return t_quantile(0.975, df)


@pytest.mark.parametrize("spread", [0.01, 0.05, 0.10])
@pytest.mark.parametrize("rounds", [2, 3, 5, 10])
def test_a_run_of_the_same_config_is_said_within_95_percent_of_the_time(spread, rounds):
    # the statement's error rate: a run that is one more fresh process of the config, said below or above
    rates = statement_rates(seed=rounds * 100 + int(spread * 1000), runs=1000, spread=spread, rounds=rounds,
                            t975=t975, run_windows=10)
    assert rates["below"] + rates["above"] <= 0.07, rates  # 5% expected; 1000 runs: 0.7% sampling sd
    assert rates["within"] >= 0.93, rates


def test_a_run_30_percent_slower_is_said_below_more_often_the_more_rounds_the_trials_kept():
    # with 5% drift between rounds and 2% between processes, 5 rounds tell a 30% slower run nearly always; 3 rounds
    # (t with 2 degrees of freedom, 4.3) most of the time; 2 rounds (12.7) seldom: the range says how sure it is
    below = {n: statement_rates(seed=n, runs=1000, spread=0.02, rounds=n, t975=t975, slower=0.30,
                                run_windows=10)["below"] for n in (2, 3, 5)}
    assert below[5] >= 0.95 and below[3] >= 0.7 and below[2] < below[3], below


def test_the_range_and_the_verdict():
    rng = process_range([100.0, 104.0, 98.0], t975(2))
    assert rng[0] < 98.0 and rng[1] > 104.0
    assert (verdict(rng[0] * 0.99, rng), verdict(101.0, rng), verdict(rng[1] * 1.01, rng)) == ("below", "within",
                                                                                               "above")
    assert process_range([100.0], t975(1)) is None and verdict(50.0, None) is None  # one process: no spread known
    assert Claim(100.0, (100.0, 104.0, 98.0), t975(2)).to_dict()["range_95"] == [round(x, 3) for x in rng]
