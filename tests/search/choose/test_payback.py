"""torch.compile priced over the user's real run: the break-even arithmetic, the choice between a compiled
and an eager finalist for a short and a long run, the study's inductor cache, and compile_s as measured."""

from __future__ import annotations

import doctest
import math

import pytest

import autotune.search.choose.payback as payback
from autotune.config import TrialConfig, TrialResult, Workload
from autotune.errors import ConfigError
from autotune.search.choose.payback import DEFAULT_RUN_S, Priced, RunLength, break_even, effective_samples_per_s, price
from autotune.trial.runner import child_env
from tests.helpers import QUICK, hardware, make_tuner, search_run, tiny_space


def test_the_module_examples_hold():
    assert doctest.testmod(payback).failed == 0


# --- the arithmetic ---------------------------------------------------------------------------------------

def test_break_even_is_where_compile_plus_compiled_time_equals_eager_time():
    """10% faster steady-state, 90 s to compile, batch 32: N* = 90 / (1/100 - 1/110) = 99,000 samples."""
    be = break_even(100.0, 110.0, 90.0, batch_size=32)
    assert be.samples == pytest.approx(99_000.0)
    assert be.steps == pytest.approx(99_000.0 / 32)
    assert be.seconds == pytest.approx(990.0)
    assert 90.0 + be.samples / 110.0 == pytest.approx(be.samples / 100.0)  # both take the same time there
    assert be.seconds == pytest.approx(90.0 + be.samples / 110.0)


def test_a_compiled_config_that_is_not_faster_never_breaks_even():
    for thr_c in (100.0, 90.0):
        be = break_even(100.0, thr_c, 90.0, batch_size=8)
        assert math.isinf(be.samples) and math.isinf(be.steps) and math.isinf(be.seconds)
        assert be.to_dict() == {"samples": None, "steps": None, "seconds": None}  # YAML has no infinity


def test_effective_throughput_beats_eager_exactly_beyond_the_break_even():
    thr_e, thr_c, c, bs = 100.0, 110.0, 90.0, 32
    be = break_even(thr_e, thr_c, c, batch_size=bs)
    for steps, pays in ((math.floor(be.steps) - 1, False), (math.ceil(be.steps) + 1, True), (100, False),
                        (10**6, True)):
        eff = effective_samples_per_s(thr_c, c, RunLength(steps=steps), batch_size=bs)
        assert (eff > thr_e) is pays, steps
    for seconds, pays in ((be.seconds - 1, False), (be.seconds + 1, True), (3600.0, True)):
        eff = effective_samples_per_s(thr_c, c, RunLength(seconds=seconds), batch_size=bs)
        assert (eff > thr_e) is pays, seconds
    # over a run of exactly the break-even, both models agree with eager
    assert effective_samples_per_s(thr_c, c, RunLength(steps=1), batch_size=int(be.samples)) == pytest.approx(thr_e)
    assert effective_samples_per_s(thr_c, c, RunLength(seconds=be.seconds), batch_size=bs) == pytest.approx(thr_e)


def test_effective_throughput_edges():
    assert effective_samples_per_s(80.0, None, RunLength(steps=1), batch_size=8) == 80.0  # eager: steady
    assert effective_samples_per_s(80.0, 0.0, RunLength(seconds=1.0), batch_size=8) == 80.0
    assert effective_samples_per_s(80.0, 120.0, RunLength(seconds=60.0), batch_size=8) == 0.0  # compiling all run
    # a run of N samples: N / (compile + N / thr)
    assert effective_samples_per_s(50.0, 10.0, RunLength(steps=100), batch_size=10) == pytest.approx(1000 / 30)


def test_price_ranks_by_effective_throughput_and_records_the_break_even():
    eager, compiled = Priced("e", "bs=32", 100.0, 32), Priced("c", "bs=32 compile", 110.0, 32, 90.0, 4.0)
    short = price([eager, compiled], RunLength(steps=100))
    assert short.factor["e"] == 1.0 and short.factor["c"] < 100.0 / 110.0
    assert short.dropped is compiled and short.record["dropped"] is True
    row = short.record["configs"][0]
    assert row["pays_back"] is False and row["compile_s"] == 90.0 and row["compile_s_cached"] == 4.0
    assert row["break_even"] == pytest.approx({"samples": 99000.0, "steps": 3093.75, "seconds": 990.0}, abs=0.1)
    assert short.record["against"] == {"config": "bs=32", "samples_per_s": 100.0}
    assert "does not pay back" in short.notes[0] and "99,000 samples" in short.notes[0]
    long = price([eager, compiled], RunLength(steps=10**6))
    assert long.dropped is None and long.record["configs"][0]["pays_back"] is True and not long.notes
    alone = price([compiled], RunLength.default())  # no eager finalist: ranked, but no break-even to state
    assert "break_even" not in alone.record["configs"][0] and alone.record["against"] is None
    unmeasured = price([eager, Priced("old", "bs=32 compile", 110.0, 32, 0.0)], RunLength(steps=1))
    assert unmeasured.factor["old"] == 1.0 and "not measured" in unmeasured.record["configs"][0]["note"]


def test_run_length_values():
    assert RunLength.default() == RunLength(seconds=DEFAULT_RUN_S, assumed=True)
    assert "assumed" in RunLength.default().label() and RunLength(steps=1000).label() == "1,000 steps"
    assert RunLength.parse("6h") == RunLength(seconds=6 * 3600.0)
    assert RunLength.parse(None, 500) == RunLength(steps=500)
    assert RunLength.parse() == RunLength.default()
    assert RunLength.from_dict(RunLength(steps=7).to_dict()) == RunLength(steps=7)
    with pytest.raises(ConfigError, match="give one"):
        RunLength.parse("6h", 100)
    with pytest.raises(ConfigError, match="planned_steps 0"):
        RunLength.parse(None, 0)
    with pytest.raises(ConfigError, match="exactly one"):
        RunLength()
    with pytest.raises(ConfigError, match="positive duration"):
        RunLength(seconds=-5.0)


# --- the choice, end to end with a fake runner ------------------------------------------------------------

COMPILE_S = 90.0


def _compile_10pct_faster(workload, config, measure, **kw):
    """Eager at 100 samples/s, compiled 10% faster steady-state after a measured 90 s compile."""
    compiled = config.compile_mode != "none"
    v = 110.0 if compiled else 100.0
    spread = (0.99, 1.0, 1.01) if search_run(measure, kw) else tuple(0.99 + 0.001 * i for i in range(20))
    return TrialResult(status="ok", samples_per_s=tuple(v * f for f in spread), wall_s=1.0, peak_host_mb=100.0,
                       compile_s=COMPILE_S if compiled else None, batch_size=config.batch_size)


def _compile_tuner(tmp_path, run_length):
    space = tiny_space(parameters={"batch_size": {"type": "int", "choices": [8]},
                                   "compile_mode": {"type": "categorical", "choices": ["none", "default"]}},
                       baseline={"batch_size": 8, "compile_mode": "none"})
    if "default" not in space.to_dict()["parameters"]["compile_mode"]["choices"]:
        pytest.skip("the space drops compile modes here: torch.compile needs a C++ compiler and Python.h "
                    "(apt-get install g++ python3-dev on Debian/Ubuntu)")
    return make_tuner(tmp_path, space=space, finalists=2, finalist_rounds=2, runner=_compile_10pct_faster,
                      parity_steps=0, run_length=run_length)


def test_a_short_run_recommends_eager_and_the_yaml_says_compile_did_not_pay_back(tmp_path):
    rec = _compile_tuner(tmp_path, RunLength(steps=100)).run(trials=2)
    assert rec.config.compile_mode == "none"
    doc = rec.to_dict()["compile"]
    assert doc["planned_run"] == {"seconds": None, "steps": 100, "assumed": False}
    assert doc["dropped"] is True and doc["cache_dir"].endswith("inductor-cache")
    (row,) = doc["configs"]
    assert row["pays_back"] is False and row["compile_s"] == COMPILE_S
    # break-even against the eager finalist's median: 90 / (1/100 - 1/110) samples, at batch 8
    assert row["break_even"]["samples"] == pytest.approx(99_000, rel=0.02)
    assert row["break_even"]["steps"] == pytest.approx(99_000 / 8, rel=0.02)
    assert any("does not pay back" in n and "100 steps" in n for n in rec.notes)
    assert "compile" in rec.to_yaml() and "did not pay back" in rec.summary()
    assert rec.runners_up[0]["config"]["compile_mode"] == "default"


def test_a_long_run_recommends_compile(tmp_path):
    rec = _compile_tuner(tmp_path, RunLength(steps=10**6)).run(trials=2)
    assert rec.config.compile_mode == "default"
    doc = rec.to_dict()["compile"]
    assert doc["dropped"] is False and doc["configs"][0]["pays_back"] is True
    assert not any("does not pay back" in n for n in rec.notes)
    assert rec.median_samples_per_s == pytest.approx(110.0, rel=0.02)  # the steady-state figure, as measured
    assert doc["configs"][0]["effective_samples_per_s"] < rec.median_samples_per_s


def test_the_default_run_is_an_assumed_hour_and_round_trips_through_yaml(tmp_path):
    from autotune import Recommendation

    rec = _compile_tuner(tmp_path, None).run(trials=2)
    assert rec.compile["planned_run"] == {"seconds": DEFAULT_RUN_S, "steps": None, "assumed": True}
    assert rec.config.compile_mode == "default"  # 90 s pays back within an hour at +10% (break-even 990 s)
    rec.to_yaml(tmp_path / "best.yaml")
    assert Recommendation.from_yaml(tmp_path / "best.yaml").compile == rec.compile


# --- the study's inductor cache ---------------------------------------------------------------------------

def test_the_child_env_puts_inductors_cache_in_the_studys_folder(tmp_path):
    tuner = make_tuner(tmp_path)
    assert tuner.compile_cache_dir == tuner.artifacts_dir / "inductor-cache"
    env = child_env(TrialConfig(batch_size=8), {"PATH": "/bin"}, compile_cache_dir=tuner.compile_cache_dir)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tuner.compile_cache_dir.resolve())
    assert env["TRITON_CACHE_DIR"] == str(tuner.compile_cache_dir.resolve() / "triton")
    assert "TORCHINDUCTOR_CACHE_DIR" not in child_env(TrialConfig(batch_size=8), {"PATH": "/bin"})


@pytest.mark.slow
def test_compile_s_is_measured_and_a_second_trial_loads_the_cache(tmp_path):
    """A real compile trial (~20-90 s on 2 CPUs): compile_s from dynamo's counters, the cache filled, and the
    same config again compiles from the cache."""
    from autotune.trial.runner import run_trial

    assert hardware().can_compile or pytest.skip("torch.compile needs a C++ compiler and Python.h here "
                                                 "(apt-get install g++ python3-dev on Debian/Ubuntu)")
    cache = tmp_path / "inductor-cache"
    wl, cfg = Workload(model="tests.workloads_fixtures:tiny", image_size=16), TrialConfig(batch_size=8,
                                                                                          compile_mode="default")
    cold = run_trial(wl, cfg, QUICK.replace(timeout_s=600), compile_cache_dir=cache)
    assert cold.ok, (cold.reason, cold.traceback)
    assert cold.compile_s > 0 and any(cache.iterdir())
    warm = run_trial(wl, cfg, QUICK.replace(timeout_s=600), compile_cache_dir=cache)
    assert warm.ok and 0 < warm.compile_s < cold.compile_s
