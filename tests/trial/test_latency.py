"""Inference under a latency bound (issue 28, item 3): each step's latency, synchronised, its percentiles, and a
config over ``--latency-p99`` infeasible as one over the memory cap is."""

from __future__ import annotations

import pytest

from autotune.config import MeasureSpec, TrialResult, Workload
from autotune.errors import ConfigError
from autotune.machine.device import CPUDevice
from autotune.machine.hardware import detect
from autotune.recommendation import Recommendation
from autotune.search.record.trials import MemoryLimit, outcome
from autotune.trial.latency import StepLatency, check_bound, percentiles

from tests import limits_workloads as lw
from tests.helpers import run_cli

LATENCY = "tests.limits_workloads:latency"


def test_percentiles_are_nearest_rank_steps_that_happened():
    xs = [0.010] * 97 + [0.015, 0.020, 0.030]
    p = percentiles(xs)
    assert p == {"p50_ms": 10.0, "p95_ms": 10.0, "p99_ms": 20.0, "min_ms": 10.0, "steps": 100}
    assert percentiles([0.004])["p99_ms"] == 4.0 and percentiles([]) is None


class _CountingDevice(CPUDevice):
    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1


def test_each_step_is_timed_to_the_device_done_and_only_the_measured_windows_count():
    import time

    dev = _CountingDevice()
    rec = StepLatency(dev)
    step = rec.timed(lambda batch: time.sleep(batch))
    t0 = time.perf_counter()
    step(0.02)  # a warm-up step: outside the window below
    t1 = time.perf_counter()
    for _ in range(3):
        step(0.005)
    t2 = time.perf_counter()
    assert dev.syncs == 4  # synchronised once per step: a GPU's kernels are asynchronous
    figures = rec.figures([(t1, t2)])
    assert figures["steps"] == 3 and 5.0 <= figures["p99_ms"] < 20.0
    assert rec.figures([(t0, t2)])["p99_ms"] >= 20.0


def test_a_config_over_the_bound_is_infeasible_as_one_over_the_memory_is():
    ok = TrialResult(status="ok", samples_per_s=(100.0,), peak_host_mb=500.0, latency_p99_ms=30.0)
    assert outcome(ok, 1000.0, latency_p99_ms=25.0).latency_constraint == pytest.approx(0.2)
    assert outcome(ok, 1000.0, latency_p99_ms=60.0).latency_constraint == pytest.approx(-0.5)
    assert outcome(ok, 1000.0).latency_constraint is None  # no bound: no constraint
    limit = MemoryLimit(1000.0, 0.1, None, 25.0)
    assert not limit.meets_latency(30.0) and limit.meets_latency(25.0)
    assert not limit.meets_latency(None)  # not measured under a bound: not known to meet it
    assert MemoryLimit.of(MeasureSpec(memory_cap_mb=2048.0, latency_p99_ms=40.0)).latency_p99_ms == 40.0
    assert ok.figures()["latency_p99_ms"] == 30.0  # stored, so feasibility is worked out from it again later


def test_the_bound_is_for_inference_and_positive():
    check_bound("infer", 10.0)
    with pytest.raises(ConfigError, match="bounds the latency of inference steps; the task is train"):
        check_bound("train", 10.0)
    with pytest.raises(ConfigError, match="latency_p99_ms=-1"):
        MeasureSpec(latency_p99_ms=-1)


def test_the_yaml_measured_section_has_the_percentiles_and_reads_them_back():
    lat = {"p50_ms": 6.1, "p95_ms": 6.5, "p99_ms": 7.2, "min_ms": 5.9, "bound_p99_ms": 25.0}
    rec = lw.make_rec(latency_ms=lat)
    m = rec.to_dict()["measured"]
    assert (m["latency_p50_ms"], m["latency_p95_ms"], m["latency_p99_ms"], m["latency_bound_p99_ms"]) == \
        (6.1, 6.5, 7.2, 25.0)
    assert Recommendation.from_dict(rec.to_dict()) == rec
    assert "p99 7.20 ms (bound 25 ms)" in rec.summary()
    assert "latency_p50_ms" not in lw.make_rec().to_dict()["measured"]  # training: no latency keys


def test_the_report_plots_throughput_against_p99_with_the_bound():
    from autotune.view.latency_plot import latency_figure

    rows = [{"trial": 0, "status": "ok", "feasible": True, "latency_p99_ms": 6.0, "samples_per_s": 600.0,
             "config": "bs=4"},
            {"trial": 1, "status": "ok", "feasible": False, "latency_p99_ms": 40.0, "samples_per_s": 1700.0,
             "config": "bs=64"}]
    fig = latency_figure(rows, 25.0, 0)
    names = [t.name for t in fig.data]
    assert names == ["meets the bound / no bound", "infeasible (latency or memory)", "recommended"]
    assert [s.x0 for s in fig.layout.shapes] == [25.0]  # the bound, drawn
    assert latency_figure([{**rows[0], "latency_p99_ms": None}], None, None) is None  # a training study: none


# --- bad input through the real CLI -------------------------------------------------------------------------

def test_latency_p99_on_a_training_task_is_refused_by_run_and_trial_before_anything_runs(tmp_path, capsys):
    from autotune.cli.main import main as cli_main

    for argv in (["run", "--storage", f"sqlite:///{tmp_path}/t.db"], ["trial"]):
        assert cli_main([*argv, "--model", LATENCY, "--latency-p99", "50ms", "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert "--latency-p99 bounds the latency of inference steps; the task is train" in err and "\n" not in err
    assert cli_main(["trial", "--model", LATENCY, "--task", "infer", "--latency-p99", "50", "--device", "cpu"]) == 2
    assert "--latency-p99 '50' has no unit: write 50s" in capsys.readouterr().err


@pytest.mark.slow  # the real CLI in a subprocess: ~6 s of imports
def test_latency_p99_on_a_training_task_is_one_line_and_exit_2(tmp_path):
    out = run_cli("run", "--model", LATENCY, "--task", "train", "--latency-p99", "50ms", "--device", "cpu",
                  "--storage", f"sqlite:///{tmp_path}/t.db", "--trials", "1")
    err = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in err, err
    assert "--latency-p99 bounds the latency of inference steps; the task is train" in err


@pytest.mark.slow  # the check child and one floor trial: ~10-15 s
def test_a_bound_under_one_steps_measured_floor_is_one_line_and_exit_2(tmp_path):
    out = run_cli("run", "--model", LATENCY, "--task", "infer", "--image-size", "16", "--latency-p99", "1ms",
                  "--device", "cpu", "--storage", f"sqlite:///{tmp_path}/t.db", "--trials", "1", "--windows", "2",
                  "--window-seconds", "0.2", "--no-progress")
    err = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and err.startswith("autotune run: error: --latency-p99 1ms is under one step's "
                                                  "measured floor"), out.stderr
    assert "raise the bound above" in err


# --- the search: the fastest config that meets the bound ----------------------------------------------------

@pytest.mark.slow  # 6-7 real children: ~30-50 s on 2 shared cores
def test_an_inference_run_under_a_bound_the_largest_batch_misses_recommends_a_smaller_one(tmp_path):
    from autotune.search.choose.latency_floor import check_floor
    from autotune.search.space.search_space import space_from_dict
    from autotune.search.record.trials import is_feasible, trial_rows
    from autotune.search.tuner import Tuner
    from autotune.workloads.build import check

    hw = detect()
    space = space_from_dict({"name": "t", "device": "cpu",
                             "parameters": {"batch_size": {"type": "int", "choices": [4, 64]}},
                             "fixed": {"intra_op_threads": 1, "num_workers": 0}, "baseline": {"batch_size": 4}},
                            hardware=hw)
    logs: list[str] = []
    # a step takes 4 ms + 0.5 ms a sample: batch 4 ~6 ms, batch 64 ~36 ms (and ~2.7x the samples/s)
    tuner = Tuner(check(Workload(model=LATENCY, task="infer", image_size=16)), space=space,
                  measure=MeasureSpec(windows=2, window_s=0.4, timeout_s=120, latency_p99_ms=25.0),
                  storage=f"sqlite:///{tmp_path}/t.db", hardware=hw, progress=False, log=logs.append, finalists=2,
                  finalist_rounds=1, seed=0, parity_steps=0)
    assert 4.0 <= check_floor(tuner) < 25.0
    rec = tuner.run(trials=2)
    study = tuner.study()
    by_bs = {t.user_attrs["config"]["batch_size"]: t for t in study.trials if t.user_attrs.get("status") == "ok"}
    assert by_bs[64].value > by_bs[4].value and by_bs[64].user_attrs["latency_p99_ms"] > 25.0, logs
    assert not is_feasible(by_bs[64], tuner.limit) and is_feasible(by_bs[4], tuner.limit)
    assert by_bs[64].constraints["latency_p99"] > 0  # the sampler learns the latency boundary too
    assert rec is not None and rec.config.batch_size == 4, logs
    assert rec.latency_ms["p99_ms"] <= 25.0 and rec.latency_ms["bound_p99_ms"] == 25.0
    assert rec.latency_ms["p50_ms"] <= rec.latency_ms["p95_ms"] <= rec.latency_ms["p99_ms"]
    rows = {r["trial"]: r for r in trial_rows(study)}
    assert "over the latency bound: p99" in rows[by_bs[64].number]["reason"]
    assert rec.worst_case["source"] == "normal"  # fixed shapes: the finalists' rounds were the worst case
    # `show` has the p99 column and the recommendation's latency line
    out = run_cli("show", "--storage", f"sqlite:///{tmp_path}/t.db")
    assert out.returncode == 0 and "p99 ms" in out.stdout and "latency per step: p50" in out.stdout, out.stderr
    assert "(bound 25 ms)" in out.stdout
