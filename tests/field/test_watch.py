"""The drift watch on windows whose rates are known: a 3x slow-down noticed within a few windows and logged once
with what changed, its recovery noted, and no alarm over a long steady run with this machine's noise."""

from __future__ import annotations

import math
import random

from autotune.field.watch import DriftWatch
from autotune.field.windows import Window


def _window(i: int, rate: float, wait_share: float, seconds: float = 5.0) -> Window:
    return Window(end_s=(i + 1) * seconds, seconds=seconds, steps=10, samples=rate * seconds,
                  wait_s=wait_share * seconds, host={"rss_mb": 800.0, "others_cores": 0.1})


def test_a_steady_run_gives_no_alarm():
    rng, watch = random.Random(0), DriftWatch()
    # 10 minutes of 5 s windows, 3% window noise, a 10% one-window dip now and then (a checkpoint)
    lines = [watch.on_window(_window(i, 100 * math.exp(rng.gauss(0, 0.03)) * (0.9 if i % 37 == 0 else 1), 0.05), i)
             for i in range(120)]
    assert [x for x in lines if x] == [] and watch.episodes == []


def test_a_3x_slower_dataset_is_noticed_within_5_windows_once_with_the_data_wait_and_the_recovery():
    watch, lines = DriftWatch(started_wall=None), []
    for i in range(60):
        slow = 20 <= i < 40
        line = watch.on_window(_window(i, 100 / 3 if slow else 100.0, 0.70 if slow else 0.05), i)
        if line:
            lines.append((i, line))
    assert len(lines) == 2, lines
    (noticed, began), (back, recovered) = lines
    assert noticed - 20 + 1 <= 5 and "slowed down from 1.7 min in: 100.0 -> 33.3 samples/s (-67%)" in began, began
    assert "the data wait grew to 70% of a step (before: 5%)" in began, began
    assert back >= 40 and recovered.startswith("autotune field: recovered at"), recovered
    assert watch.episodes[0]["first_window"] == 20 and watch.episodes[0]["recovered_window"] == back


def test_a_slow_down_of_a_loop_already_waiting_for_data_names_the_data_wait():
    # 90% of a step waiting already: 3x slower data moves the share to 94% only, but its seconds a sample triple
    watch, lines = DriftWatch(), []
    for i in range(30):
        slow = i >= 20
        rate, share = (100 / 2.8, 0.94) if slow else (100.0, 0.90)
        line = watch.on_window(_window(i, rate, share), i)
        lines += [line] if line else []
    assert len(lines) == 1 and "the data wait grew to 94% of a step (before: 90%), 26.3 ms a sample (before: 9.0)" \
        in lines[0], lines
