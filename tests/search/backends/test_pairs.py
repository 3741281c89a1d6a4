"""The planned search's two repeats of a decision within the noise, run by the local backend as a pair by turns
(``search.backends.pairs``): real children of the tiny workload, alive at once, each recorded as a search trial."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from autotune.config import MeasureSpec
from autotune.search.budget import Budget

from autotune.search.backends import pairs
from autotune.search.backends.local import LocalBackend
from autotune.search.plan.queue import enqueue
from autotune.search.record import trials as keys
from tests.helpers import make_tuner, tiny_space


def _set_aside_queued(study) -> None:
    """The planned trials the first run queued, told failed: the pair queued next is the head of the queue."""
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.tell(study.ask(), state=TrialState.FAIL)


@pytest.mark.slow  # ~14 s of real children on a 2-core VM
def test_the_two_repeats_of_a_decision_run_at_once_by_turns_each_recorded_as_a_search_trial(tmp_path):
    space = tiny_space(parameters={"batch_size": {"type": "int", "choices": [8, 16]}}, baseline={"batch_size": 8})
    tuner = make_tuner(tmp_path, space=space)
    study = tuner.study()
    tuner.run(trials=1)  # trial 0: the baseline, batch 8
    first = next(t for t in study.get_trials() if t.user_attrs.get(keys.BASELINE))
    assert first.user_attrs[keys.STATUS] == "ok"
    _set_aside_queued(study)
    ctx = tuner.search_context()
    assert pairs.waiting_pair(ctx, study, []) is None  # nothing queued
    for other in (8, 9):  # two comparisons' repeats (a resumed study from before round_of): not one pair
        enqueue(study, space, dict(first.params), **{keys.REPEAT_OF: first.number, keys.ROUND_OF: f"{other}/0"})
    assert pairs.waiting_pair(ctx, study, []) is None
    _set_aside_queued(study)
    enqueue(study, space, dict(first.params), **{keys.REPEAT_OF: first.number})
    assert pairs.waiting_pair(ctx, study, []) is None  # one repeat alone runs as a trial does
    enqueue(study, space, dict(first.params), **{keys.REPEAT_OF: first.number})
    assert [t.number for t in pairs.waiting_pair(ctx, study, [])] == [first.number] * 2
    # a fake runner (not the tuner's own, which takes turns) never pairs: each runs as it will
    assert pairs.waiting_pair(make_tuner(tmp_path / "f", space=space, runner=lambda *a, **k: None).search_context(),
                              study, []) is None

    out = LocalBackend().search(ctx, study, trials=2)
    assert out.trials_run == 2
    pair = [t for t in study.get_trials() if t.user_attrs.get(keys.REPEAT_OF) == first.number
            and keys.ROUND_OF not in t.user_attrs]  # not the two comparisons' repeats set aside above
    assert len(pair) == 2 and all(t.state == TrialState.COMPLETE and t.value > 0 for t in pair), pair
    assert all(t.user_attrs[keys.STATUS] == "ok" for t in pair)
    assert all((tuner.artifacts_dir / f"trial-{t.number}.log").is_file() for t in pair)
    # alive at once, taking turns: each child stood stopped (SIGSTOP) while the other had its turn (the first also
    # through the second's start-up); one after the other, neither would stand stopped at all
    waited = [t.user_attrs[keys.BY_TURNS] for t in pair]
    assert min(waited) >= 0.1 and max(waited) > 0.5, waited
    assert [r["role"] for r in keys.trial_rows(study) if r["trial"] in {t.number for t in pair}] == \
        [f"repeat of #{first.number}, by turns"] * 2


def test_a_pair_starts_only_where_the_search_time_left_holds_two_long_trials_and_their_turns():
    """A pair takes two trials' time and more (each turn's untimed first step): it starts only where the search's
    time before the reserves holds that, not where one more trial would fit; without a budget, always."""
    measure = MeasureSpec(windows=3, window_s=3.0)
    firsts = [SimpleNamespace(user_attrs={"wall_s": 14.0})] * 2

    def ctx(started_ago: float, budget_s: float | None = 600.0):
        budget = Budget.of(budget_s, started=time.monotonic() - started_ago, measure=measure, finalists=2,
                           rounds=2)
        return SimpleNamespace(budget=budget, measure=measure, numerics_check_s=lambda study: 0.0)

    walls = [14.0] * 6
    fresh = ctx(0.0)
    left = fresh.budget.search_left_s(walls)
    assert pairs.pair_fits(fresh, None, walls, firsts)
    # time for one long trial but not two: out_of_time says go on, the pair waits
    one = ctx(left - 20.0)
    assert not one.budget.out_of_time(walls) and not pairs.pair_fits(one, None, walls, firsts)
    assert pairs.pair_fits(ctx(1e6, None), None, walls, firsts)
