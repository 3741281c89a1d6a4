"""A run with no budget stops by itself once the search has converged: the best feasible config has not
improved by more than the noise for ``patience`` of the sampler's trials in a row, a patience worked out from
the measured cost of a trial and what a gain would save over the planned run (or the space is exhausted)."""

from __future__ import annotations

import pytest

from autotune.config import TrialResult
from autotune.search.plan.convergence import MAX_PATIENCE, MIN_PATIENCE, PLANNED_ROLES, patience
from autotune.search.record.trials import STATUS
from tests.helpers import make_tuner, tiny_space

# 12 batch sizes x channels_last x 2 worker counts (what 2 cores keep): 48 configs
SPACE = {"parameters": {"batch_size": {"type": "int", "choices": [4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192]},
                        "channels_last": {"type": "bool"},
                        "num_workers": {"type": "int", "choices": [0, 1]}},
         "baseline": {"batch_size": 4, "channels_last": False, "num_workers": 0}}


def _flat_above(bs_knee: int, *, noise: float = 0.01, wall_s: float = 30.0):
    """Throughput grows with the batch size up to ``bs_knee`` and is flat (within ``noise``) beyond it,
    whatever the other knobs: a known flat region. Each trial reports ``wall_s`` of wall time."""
    calls: list = []

    def run(workload, config, measure, **kw):
        calls.append(config)
        v = 10.0 * min(config.batch_size, bs_knee) * (1 + noise * ((len(calls) * 7919) % 3 - 1))
        return TrialResult(status="ok", samples_per_s=(v, v, v), wall_s=wall_s, peak_host_mb=100.0,
                           batch_size=config.batch_size)

    run.calls = calls
    return run


def test_patience_is_where_one_more_trial_costs_more_than_it_is_expected_to_save():
    """An hour's run, a 5% gain: 25 s trials wait 6 sampler trials, 5 s ones 34; bounds hold; unknown cost waits
    the most; a larger gain found by the sampler, or a longer run, waits longer."""
    assert patience(3600, 0.05, 25.0) == 6 and patience(3600, 0.05, 5.0) == 34
    assert patience(3600, 0.05, 1000.0) == MIN_PATIENCE and patience(36000, 0.05, 0.1) == MAX_PATIENCE
    assert patience(3600, 0.05, None) == MAX_PATIENCE
    assert patience(3600, 0.10, 25.0) > patience(3600, 0.05, 25.0) < patience(7200, 0.05, 25.0)


def test_a_run_without_a_budget_stops_once_the_flat_region_is_found(tmp_path):
    """30 s trials over an assumed hour's run: 4 sampler trials without a gain > 5% end the search, after the
    planned search (which found the flat region by walking the batch size)."""
    runner = _flat_above(16)
    said: list[str] = []
    tuner = make_tuner(tmp_path, space=tiny_space(**SPACE), runner=runner, parity_steps=0, log=said.append)
    assert tuner.patience is None  # worked out from the trials
    rec = tuner.run()  # no --trials, no --timeout
    study = tuner.study()
    conv = tuner.convergence(study)
    assert conv.patience == patience(3600, 0.05, 30.0) == 4 and conv.trial_s == 30.0
    assert conv.converged and conv.since == 4  # stopped as soon as it had waited 4 sampler trials, not later
    measured = sorted((t for t in study.trials
                       if t.user_attrs.get(STATUS) == "ok" and "duplicate_of" not in t.user_attrs),
                      key=lambda t: t.datetime_complete)
    assert max(measured, key=lambda t: t.value).params["batch_size"] >= 16  # the flat region was reached
    # the planned search ran first (the bundle, the walk, the workers knob), then exactly 4 sampler trials
    sampler = [t for t in measured if not any(t.user_attrs.get(r) is not None for r in PLANNED_ROLES)]
    assert len(sampler) == 4 and min(t.number for t in sampler) > max(
        t.number for t in measured if t.user_attrs.get("batch_line") or t.user_attrs.get("knob_step"))
    assert all(t.value <= conv.best * (1 + conv.noise) for t in sampler)
    assert len(measured) < 48  # it stopped before trying the whole space
    assert tuner.stop_reason.startswith("converged: 4 sampler trials in a row")
    assert "at ~30 s a trial, one more is expected to save less than it costs over the 1h run" in tuner.stop_reason
    assert rec.notes[0].startswith("search stopped: converged")
    assert any("search stopped: converged" in m for m in said)


# slow: 34 scripted trials; by default a run stops once the flat region is found
# (test_a_run_without_a_budget_stops_once_the_flat_region_is_found)
@pytest.mark.slow
def test_cheaper_trials_make_a_longer_patience(tmp_path):
    """The same flat workload with 5 s trials: the search waits 34 sampler trials, not 4."""
    tuner = make_tuner(tmp_path, space=tiny_space(**SPACE), runner=_flat_above(16, wall_s=5.0), parity_steps=0)
    tuner.run()
    conv = tuner.convergence(tuner.study())
    assert conv.patience == 34 and conv.since == 34 and conv.converged
    assert tuner.stop_reason.startswith("converged: 34 sampler trials in a row")


def test_only_a_feasible_gain_beyond_the_noise_restarts_the_count():
    """Trials in the order they finished: +3% and +4% are within the 5% noise floor; 150 is a gain; the
    infeasible 300 (over the memory cap) and a copy are not; a pruned trial counts as a trial without a gain."""
    import datetime

    import optuna
    from optuna.distributions import IntDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.search.plan.convergence import convergence
    from autotune.search.record.trials import MemoryLimit

    study = optuna.create_study(direction="maximize")
    t0 = datetime.datetime(2026, 11, 23)
    rows = [(100, "ok", 100.0, {}), (103, "ok", 100.0, {}), (104, "ok", 100.0, {}), (150, "ok", 100.0, {}),
            (300, "ok", 5000.0, {}), (None, "pruned", None, {}), (160, "ok", 100.0, {"duplicate_of": 3}),
            (151, "ok", 100.0, {})]
    for i, (value, status, peak, extra) in enumerate(rows):
        trial = create_trial(
            state=TrialState.COMPLETE if value is not None else TrialState.PRUNED, value=value,
            params={"x": i}, distributions={"x": IntDistribution(0, 10)},
            user_attrs={"status": status, "peak_host_mb": peak, "rel_iqr": 0.01, "fingerprint": "fp", **extra})
        trial.datetime_start, trial.datetime_complete = t0, t0 + datetime.timedelta(seconds=i)
        study.add_trial(trial)
    conv = convergence(study, patience_k=3, fingerprint="fp", limit=MemoryLimit(1000.0))
    assert (conv.best, conv.best_trial, conv.noise) == (150, 3, 0.05)
    assert conv.since == 3 and conv.converged  # the infeasible 300, the pruned one, 151; not the copy
    assert conv.progress() == "3 of 3 trials without a gain > 5%"
    assert not convergence(study, patience_k=0, fingerprint="fp", limit=MemoryLimit(1000.0)).converged
    assert convergence(study, patience_k=4, fingerprint="other", limit=MemoryLimit(1000.0)).best is None


def test_a_converged_study_resumed_goes_straight_to_the_finalists_and_patience_0_searches_on(tmp_path):
    runner = _flat_above(4)  # flat everywhere: converged after the planned search and `patience` more
    tuner = make_tuner(tmp_path, space=tiny_space(**SPACE), runner=runner, parity_steps=0, patience=4)
    tuner.run()
    n = len(tuner.study().trials)
    again = make_tuner(tmp_path, space=tiny_space(**SPACE), runner=runner, parity_steps=0, patience=4)
    rec = again.run(timeout_s=3600)
    assert len(again.study().trials) == n and rec is not None  # no new search trial: the finalists only
    assert again.stop_reason.startswith("converged")
    on = make_tuner(tmp_path, space=tiny_space(**SPACE), runner=runner, parity_steps=0, patience=0)
    on.run(trials=3)
    assert len(on.study().trials) > n and on.stop_reason == "ran the 3 trial(s) asked for"
