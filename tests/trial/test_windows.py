"""Windows that stop once they agree (``MeasureSpec.tight_spread``, on by default on a GPU): a real trial child stops
at the third window whose figures lie within the spread, and measures every window without it."""

from __future__ import annotations

import pytest

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig
from autotune.trial.runner import run_trial

TINY = Workload(model="tests.workloads_fixtures:tiny", image_size=16)


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29)
def test_windows_stop_at_the_third_once_they_agree_and_not_without_the_rule():
    spec = MeasureSpec(windows=6, window_s=0.25, settle_windows=0, timeout_s=120)
    loose = run_trial(TINY, TrialConfig(batch_size=8, intra_op_threads=1), spec.replace(tight_spread=0.99))
    every = run_trial(TINY, TrialConfig(batch_size=8, intra_op_threads=1), spec)
    assert loose.status == every.status == "ok", (loose.reason, every.reason)
    # three windows of one config lie within 99% of their median here (0.25 s each), unless a burst of load lands
    # on one of them: then a fourth or fifth; never all six (the rule ignored), never fewer than three. (The suite's
    # other worker on this 2-core VM once spread six 0.1 s windows from 2072 to 9187 samples/s, past 95%.)
    assert 3 <= len(loose.samples_per_s) < 6, loose.samples_per_s
    assert len(every.samples_per_s) == 6


def test_the_cli_measures_a_gpu_with_short_windows_that_stop_once_they_agree():
    import argparse

    from autotune.cli.args import GPU_WINDOW_S, TIGHT_SPREAD, add_measure_args, measure_from_args
    from autotune.machine.hardware import detect

    p = argparse.ArgumentParser()
    add_measure_args(p)
    hw = detect(with_torch=False)
    gpu = measure_from_args(p.parse_args([]), hardware=hw, device="cuda")
    cpu = measure_from_args(p.parse_args([]), hardware=hw, device="cpu")
    given = measure_from_args(p.parse_args(["--window-seconds", "4"]), hardware=hw, device="cuda")
    assert (gpu.window_s, gpu.tight_spread) == (GPU_WINDOW_S, TIGHT_SPREAD)
    assert (cpu.window_s, cpu.tight_spread) == (3.0, 0.0)  # a noisy CPU VM keeps its 5 x 3 s
    assert given.window_s == 4.0
