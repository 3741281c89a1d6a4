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


def _gpu_window(i: int, rate: float, sm_mhz: float, slowdown=(), used_mb: float = 20000.0) -> Window:
    return Window(end_s=(i + 1) * 5.0, seconds=5.0, steps=10, samples=rate * 5.0, wait_s=0.05 * 5.0,
                  host={"rss_mb": 800.0, "others_cores": 0.1, "gpu_sm_mhz": sm_mhz, "gpu_sm_max_mhz": 1980.0,
                        "gpu_slowdown": list(slowdown), "gpu_mem_used_mb": used_mb, "gpu_mem_total_mb": 81559.0})


def test_a_gpu_that_throttles_is_named_with_nvmls_reason_and_its_clock():
    """On a GPU the field run's windows carry NVML's figures (``host.DeviceSampler``): a slow-down while NVML names a
    thermal slow-down in the low windows is said with the reason and the clock; a clock that fell with no reason named
    is said against the run's own clock before; nothing GPU is said while the clock stays."""
    def episode(slow_window):
        watch, lines = DriftWatch(), []
        for i in range(30):
            w = slow_window(i) if i >= 20 else _gpu_window(i, 100.0, 1980.0)
            line = watch.on_window(w, i)
            lines += [line] if line else []
        assert len(lines) == 1, lines
        return lines[0]

    line = episode(lambda i: _gpu_window(i, 70.0, 1200.0, ("thermal slowdown (hardware)",)))
    assert "the GPU held its clock down (thermal slowdown (hardware)): SM clock 1200 MHz of 1980 (NVML)" in line, line
    line = episode(lambda i: _gpu_window(i, 70.0, 1400.0))
    assert "the GPU's SM clock fell to 1400 MHz (before: 1980) (NVML)" in line, line
    line = episode(lambda i: _gpu_window(i, 70.0, 1980.0, used_mb=81000.0))
    assert "the GPU's memory is full: 81000 of 81559 MiB in use (NVML)" in line and "clock" not in line, line
    line = episode(lambda i: _gpu_window(i, 70.0, 1980.0))
    assert "NVML" not in line and "nothing measured" in line, line
