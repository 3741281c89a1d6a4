"""The finalists' and the confirmation's rounds by turns (``finalist_rounds.run_configs``, ``trial.lockstep``): where a
round's children may take turns, and that a round by turns measures each config in its own real child."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

from autotune.config import MeasureSpec, TrialConfig, TrialResult, Workload
from autotune.search.choose.finalist_rounds import SavedRounds, remeasure, run_configs, turn_extra, turns_fit
from autotune.trial.runner import run_trial
from tests.helpers import QUICK, TINY, make_tuner

SPEC = MeasureSpec(windows=2, window_s=0.2, settle_windows=0, timeout_s=120)
CPU = Workload(model=TINY, image_size=16)


def _trial(peak_mb, config=TrialConfig(batch_size=8), batch_bytes=None):
    return SimpleNamespace(user_attrs={"peak_host_mb": peak_mb, "config": config.to_dict(),
                                       "batch_bytes": batch_bytes}, system_attrs={})


def test_a_round_takes_turns_only_on_this_cpu_with_one_process_a_trial_and_memory_for_all_of_them():
    two = [_trial(900.0), _trial(1100.0)]
    assert turns_fit(two, CPU, margin=0.1, available_mb=4000.0, shm_free_bytes=0)  # no loader: /dev/shm unused
    assert not turns_fit(two, CPU, margin=0.1, available_mb=2000.0)  # 2000 MiB together, over 1800 usable
    assert not turns_fit(two, CPU, margin=0.1, available_mb=4000.0, cap_mb=2000.0)  # the user's cap, all at once
    assert turns_fit(two, CPU, margin=0.1, available_mb=4000.0, cap_mb=3000.0)
    assert not turns_fit(two, Workload(model=TINY, image_size=16, device="cuda"), margin=0.1, available_mb=1e6)
    assert not turns_fit(two, Workload(model=TINY, image_size=16, nproc_per_node=2), margin=0.1, available_mb=1e6)
    assert not turns_fit([_trial(900.0), _trial(None)], CPU, margin=0.1, available_mb=1e6)  # a peak unknown
    assert not turns_fit([_trial(900.0)], CPU, margin=0.1, available_mb=1e6)  # one config: nothing to take turns


def test_without_a_fifo_in_the_temp_folder_no_round_takes_turns(tmp_path, monkeypatch):
    """A temp folder where no FIFO can be made (here: one that does not exist; elsewhere a filesystem without FIFOs):
    rounds run one after the other instead of failing at their first gate."""
    import tempfile

    from autotune.trial import lockstep

    two = [_trial(900.0), _trial(1100.0)]
    lockstep.available.cache_clear()
    try:
        assert lockstep.available() and turns_fit(two, CPU, margin=0.1, available_mb=4000.0, shm_free_bytes=0)
        lockstep.available.cache_clear()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
        assert not lockstep.available()
        assert not turns_fit(two, CPU, margin=0.1, available_mb=4000.0, shm_free_bytes=0)
    finally:
        lockstep.available.cache_clear()


def test_a_round_takes_turns_only_where_every_loader_it_stops_keeps_its_batches_in_dev_shm_beside_the_others():
    """A child stopped between its turns keeps its workers' batches in /dev/shm: 2 workers x prefetch 2 + 1 = 5
    batches of 8 MiB each is 40 MiB a loader; two of them do not fit a container's 64 MiB, one beside a loader-less
    config does; a loader whose batch was never measured is not guessed at."""
    mib = 2**20
    fed = TrialConfig(batch_size=8, num_workers=2, prefetch_factor=2)
    two_fed = [_trial(500.0, fed, 8 * mib), _trial(500.0, fed, 8 * mib)]
    assert not turns_fit(two_fed, CPU, margin=0.1, available_mb=1e6, shm_free_bytes=64 * mib)
    assert turns_fit(two_fed, CPU, margin=0.1, available_mb=1e6, shm_free_bytes=1024 * mib)
    one_fed = [_trial(500.0, fed, 8 * mib), _trial(500.0)]
    assert turns_fit(one_fed, CPU, margin=0.1, available_mb=1e6, shm_free_bytes=64 * mib)
    assert not turns_fit([_trial(500.0, fed), _trial(500.0)], CPU, margin=0.1, available_mb=1e6,
                         shm_free_bytes=1024 * mib)


def test_run_configs_gives_each_config_its_own_result_in_order_either_way(tmp_path):
    seen = []

    def fake(workload, config, measure, **kw):
        seen.append((config.batch_size, "gate" in kw, kw.get("log_path")))
        return TrialResult(status="ok", samples_per_s=(float(config.batch_size),), batch_size=config.batch_size)

    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=16), TrialConfig(batch_size=32)]
    logs = [tmp_path / f"{c.batch_size}.log" for c in configs]
    for by_turns in (False, True):
        seen.clear()
        got = run_configs(configs, logs, runner=fake, workload=CPU, measure=SPEC, by_turns=by_turns)
        assert [r.samples_per_s[0] for r in got] == [8.0, 16.0, 32.0]
        assert sorted(seen) == [(b, by_turns, tmp_path / f"{b}.log") for b in (8, 16, 32)]


@pytest.mark.slow
def test_the_finalists_rounds_by_turns_measure_each_config_in_a_real_child_and_say_so(tmp_path):
    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=16)]
    logs: list[str] = []
    ev = remeasure(configs, 2, runner=run_trial, workload=CPU, measure=SPEC, log_dir=tmp_path, log=logs.append,
                   by_turns=True)
    assert ev.rounds_run == 2
    for c in configs:
        assert len(ev.rounds[c.key()]) == 2 and all(len(r) == 2 for r in ev.rounds[c.key()]), ev
        assert not ev.failures[c.key()]
    assert "each round's 2 fresh processes alive at once, taking turns of 0.5 s" in logs[0], logs
    # each child wrote its own log where the round said
    assert sorted(p.name.split("-")[1] for p in tmp_path.glob("finalist-*.log")) == ["0", "0", "1", "1"]


@pytest.mark.slow
def test_a_tuner_with_its_own_runner_takes_turns_in_its_finalists_and_its_confirmation(tmp_path):
    """The whole run on the tiny workload (real children): the finalists' rounds and the confirmation's say they
    took turns, and the claim's rule, stored with the recommendation, says it too."""
    logs: list[str] = []
    tuner = make_tuner(tmp_path, log=logs.append, finalist_rounds=2, measure=QUICK.replace(window_s=1.5))
    rec = tuner.run(trials=4)
    assert rec is not None
    text = "\n".join(logs)
    assert "fresh processes alive at once, taking turns of 0.5 s" in text, text
    # by turns a finalist runs as a confirmation run does, however its search windows spread
    assert re.search(r"interleaved round\(s\), 2 windows of >= 1 s", text), text  # not the search's 1.5 s
    if rec.confirmation.get("status") not in ("baseline", None):
        assert "the two alive at once, taking turns of 0.5 s" in rec.confirmation["rule"], rec.confirmation


def test_rounds_by_turns_are_priced_with_their_untimed_steps():
    """``turn_extra`` (each turn's untimed first step, from the trials' own steps; the baseline's too) and the
    budget's run price with it; the module's examples hold."""
    import doctest

    from autotune.search.budget import Budget
    from autotune.search.choose import finalist_rounds

    assert doctest.testmod(finalist_rounds).failed <= 1  # SavedRounds' example needs a study (+SKIP'd but one)
    fast = SimpleNamespace(value=640.0, user_attrs={"data_wait_s_per_step": 0.0, "compute_s_per_step": 0.1})
    slow_base = SimpleNamespace(value=32.0, user_attrs={"data_wait_s_per_step": 0.5, "compute_s_per_step": 1.5})
    assert turn_extra([fast]) == pytest.approx(0.2) and turn_extra([fast, slow_base]) == 1.0
    m = MeasureSpec(windows=3, window_s=2.0)
    plain = Budget.of(600, measure=m)
    by_turns = dataclasses.replace(plain, turn_extra=0.5)
    assert by_turns.run_s(20.0, m) - plain.run_s(20.0, m) == pytest.approx(0.5 * 3 * 2.0)


def test_a_round_kept_from_an_interrupted_run_is_kept_only_by_a_run_that_measures_the_same_way():
    class Study:
        user_attrs: dict = {}

        def set_user_attr(self, k, v):
            self.user_attrs[k] = v

    study = Study()
    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=16)]
    saved = SavedRounds(study, configs, rounds=2, measure=SPEC, by_turns=True)
    for c in configs:
        saved.put(0, c, TrialResult(status="ok", samples_per_s=(1.0,), batch_size=c.batch_size))
    assert SavedRounds(study, configs, rounds=2, measure=SPEC, by_turns=True).round(0) is not None
    assert SavedRounds(study, configs, rounds=2, measure=SPEC, by_turns=False).round(0) is None


def test_the_search_prices_the_rounds_by_turns_from_the_best_configs_steps_so_far(tmp_path):
    """During the search the rounds after it are priced with the untimed steps of the configs that would be the
    finalists now (``Tuner.turn_price_so_far``, as ``Tuner.run`` gives it to the budget): the prior where their steps
    are short, one untimed step per timed one where a step outlasts a turn; and every holder of the budget (the
    compile gate too) reads the same price."""
    import optuna

    from autotune.search.budget import TURN_EXTRA_PRIOR, Budget
    from autotune.search.record.trials import STUDY_FINGERPRINT

    tuner = make_tuner(tmp_path)
    study = tuner.study()
    study.set_user_attr(STUDY_FINGERPRINT, tuner.hardware.fingerprint)
    budget = dataclasses.replace(Budget.of(600.0, measure=SPEC), turn_price=tuner.turn_price_so_far)
    tuner.compile_gate.start(budget, [])

    def add(batch: int, value: float, step_s: float, baseline: bool = False) -> None:
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "status": "ok", "config": TrialConfig(batch_size=batch).to_dict(), "baseline": baseline,
            "fingerprint": tuner.hardware.fingerprint, "peak_host_mb": 500.0, "wall_s": 20.0,
            "data_wait_s_per_step": 0.0, "compute_s_per_step": step_s}))

    add(8, 160.0, 0.05, baseline=True)
    add(16, 200.0, 0.08)
    assert budget.turns() == TURN_EXTRA_PRIOR  # 0.05-0.08 s steps: one untimed in 7-10, under the prior
    before = budget.run_s(20.0)
    add(256, 320.0, 0.8)  # the best now, at 0.8 s a step: a turn is its untimed step and one timed
    assert budget.turns() == tuner.compile_gate.budget.turns() == 1.0
    assert budget.run_s(20.0) > before
    tuner.compile_gate.stop()


def test_finalists_by_turns_are_measured_and_priced_as_confirmation_runs():
    """Where the rounds take turns, a finalist run measures three 1 s windows, as a confirmation run does (a round by
    turns strayed as little as with 3 s windows at a third of the cost, ``benchmarks/confirm_windows.py``), and the
    budget prices its rounds so; one after the other, it keeps the search's windows, as many as their noise asks."""
    from autotune.search.budget import Budget, confirm_measure

    m = MeasureSpec(windows=3, window_s=3.0)
    plain = Budget.of(600, measure=m, finalists=2, rounds=2)
    by_turns = dataclasses.replace(plain, turn_extra=0.25)
    assert by_turns.finalist_measure() == confirm_measure(m) and by_turns.finalist_measure().window_s == 1.0
    assert plain.finalist_measure().window_s == 3.0
    assert dataclasses.replace(plain, window_noise=0.05).finalist_measure().windows > 3  # noisy windows: more
    # a 20 s search trial (11 s of start-up and warm-up, 9 s of windows): 11 + 3 x 1 s x 1.25 by turns, 20 else
    assert by_turns.run_s(20.0) == pytest.approx(11.0 + 3.0 * 1.25) and plain.run_s(20.0) == pytest.approx(20.0)
    assert by_turns.finalists_reserve_s([20.0] * 5) < plain.finalists_reserve_s([20.0] * 5)
