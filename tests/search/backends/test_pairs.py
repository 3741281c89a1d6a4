"""The planned search's two repeats of a decision within the noise, run by the local backend as a pair by turns
(``search.backends.pairs``): real children of the tiny workload, alive at once, each recorded as a search trial."""

from __future__ import annotations

from optuna.trial import TrialState

from autotune.search.backends import pairs
from autotune.search.backends.local import LocalBackend
from autotune.search.plan.queue import enqueue
from autotune.search.record import trials as keys
from tests.helpers import make_tuner, tiny_space


def _set_aside_queued(study) -> None:
    """The planned trials the first run queued, told failed: the pair queued next is the head of the queue."""
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.tell(study.ask(), state=TrialState.FAIL)


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
    enqueue(study, space, dict(first.params), **{keys.REPEAT_OF: first.number})
    assert pairs.waiting_pair(ctx, study, []) is None  # one repeat alone runs as a trial does
    enqueue(study, space, dict(first.params), **{keys.REPEAT_OF: first.number})
    assert [t.number for t in pairs.waiting_pair(ctx, study, [])] == [first.number] * 2
    # a fake runner (not the tuner's own, which takes turns) never pairs: each runs as it will
    assert pairs.waiting_pair(make_tuner(tmp_path / "f", space=space, runner=lambda *a, **k: None).search_context(),
                              study, []) is None

    out = LocalBackend().search(ctx, study, trials=2)
    assert out.trials_run == 2
    pair = [t for t in study.get_trials() if t.user_attrs.get(keys.REPEAT_OF) == first.number]
    assert len(pair) == 2 and all(t.state == TrialState.COMPLETE and t.value > 0 for t in pair), pair
    assert all(t.user_attrs[keys.STATUS] == "ok" for t in pair)
    assert all((tuner.artifacts_dir / f"trial-{t.number}.log").is_file() for t in pair)
    # alive at once, taking turns: each child stood stopped (SIGSTOP) while the other had its turn (the first also
    # through the second's start-up); one after the other, neither would stand stopped at all
    waited = [t.user_attrs[keys.BY_TURNS] for t in pair]
    assert min(waited) >= 0.1 and max(waited) > 0.5, waited
    assert [r["role"] for r in keys.trial_rows(study) if r["trial"] in {t.number for t in pair}] == \
        [f"repeat of #{first.number}, by turns"] * 2
