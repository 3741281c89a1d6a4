"""Where a run stands, kept in a real SQLite study (``search.record.run_phase``), and what its finalists finished
(``finalist_rounds.SavedRounds``: rounds, extra pairs, checks), read back by another process's view of the study."""

from __future__ import annotations

import optuna
import pytest

from autotune.config import MeasureSpec, TrialConfig, TrialResult
from autotune.search.choose.finalist_rounds import SavedRounds
from autotune.search.record import trials as keys
from autotune.search.record.optuna_compat import storage_of
from autotune.search.record.run_phase import RunPhases, read
from autotune.trial.parity import ParityResult


@pytest.fixture
def study(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")


def _reloaded(study):
    return optuna.load_study(study_name="s", storage=storage_of(study))


def test_a_phase_is_written_when_it_changes_and_the_end_removes_it(study):
    phases = RunPhases(lambda: study)
    assert phases.begin({"trials": 3}) is None
    phases.enter("search")
    first = read(_reloaded(study))
    phases.enter("search")  # no change: no write
    assert read(_reloaded(study)) == first and first["phase"] == "search" and first["ask"] == {"trials": 3}
    phases.keep(stop_reason="ran the 3 trial(s) asked for")
    ran = phases.around("finalists", lambda x: x * 2)
    assert ran(21) == 42 and read(_reloaded(study))["phase"] == "finalists"
    assert read(_reloaded(study))["stop_reason"] == "ran the 3 trial(s) asked for"
    study.set_user_attr(keys.FINALIST_ROUNDS, {"plan": "p", "runs": {}})
    notes = []
    assert phases.finish("rec", note=lambda: notes.append(1)) == "rec" and notes == [1]
    after = _reloaded(study)
    assert read(after) is None and after.user_attrs.get(keys.FINALIST_ROUNDS) is None
    assert RunPhases(lambda: after).begin({"trials": 3}) is None


def test_what_the_finalists_finished_is_taken_back_by_the_next_run_of_the_plan(study):
    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=16)]
    spec = MeasureSpec(windows=2, window_s=0.2)
    ran, checked = [], []

    def runner(workload, config, measure, **kw):
        ran.append(config.batch_size)
        return TrialResult(status="ok", samples_per_s=(1.0, 2.0), batch_size=config.batch_size, wall_s=1.0)

    def check(workload, config, **kw):
        checked.append(config.batch_size)
        return ParityResult(ok=True, steps=kw["steps"], reason="ok")

    saved = SavedRounds(study, configs, rounds=2, measure=spec)
    saved.put("extra-1", configs[0], runner(None, configs[0], spec))
    saved.keeping("worst-case", runner)(None, configs[1], spec)
    saved.checking(check)(None, configs[1], steps=10)

    again = SavedRounds(_reloaded(study), configs, rounds=2, measure=spec)  # the next run: the same plan
    assert again.kept("extra-1", configs) is None  # half a pair is no pair
    assert again.kept("extra-1", configs[:1])[configs[0].key()].samples_per_s == (1.0, 2.0)
    assert again.keeping("worst-case", runner)(None, configs[1], spec).ok and ran == [8, 16]
    assert again.checking(check)(None, configs[1], steps=10).ok and checked == [16]
    again.checking(check)(None, configs[1], steps=20)  # another check's length is another check
    assert checked == [16, 16]
    # another plan (a resumed --timeout run plans from its own budget) keeps what it shares: a run is kept by its
    # round and config; another measurement keeps nothing
    other = SavedRounds(_reloaded(study), configs, rounds=3, measure=spec)
    assert other.kept("extra-1", configs[:1])[configs[0].key()].samples_per_s == (1.0, 2.0)
    for c in configs:
        other.put(0, c, runner(None, c, spec))
    fewer = SavedRounds(_reloaded(study), configs[1:], rounds=2, measure=spec)
    assert fewer.round(0) is not None and fewer.round(1) is None
    assert fewer.said() == ("  from the interrupted run: round(s) 1 of 2 kept whole (1 finalist(s) each); 1 of its "
                            "run(s) not used (not this plan's finalists or rounds)")
    longer = SavedRounds(_reloaded(study), configs, rounds=2, measure=MeasureSpec(windows=3, window_s=0.2))
    assert longer.kept("extra-1", configs[:1]) is None and longer.round(0) is None and longer.said() is None


def test_each_machine_keeps_its_own_runs_phase(study):
    """Several machines may run one study on a database server, each its own run: another's record is not this
    machine's to resume."""
    study.set_user_attr(f"{keys.RUN_PHASE}:another-host", {"phase": "confirmation", "pid": 1})
    assert read(_reloaded(study)) is None
    RunPhases(lambda: study).enter("search")
    assert read(_reloaded(study))["phase"] == "search"
    assert _reloaded(study).user_attrs[f"{keys.RUN_PHASE}:another-host"]["phase"] == "confirmation"


def test_the_searchs_runner_tells_a_trial_from_a_ceilings_child(study):
    phases = RunPhases(lambda: study)
    run = phases.searching(lambda workload, config, measure, **kw: measure.part)
    assert run(None, None, MeasureSpec()) == "full" and phases.current == "search"
    assert run(None, None, MeasureSpec(part="data")) == "data" and phases.current == "ceilings"
    assert read(_reloaded(study))["phase"] == "ceilings"


def test_the_split_times_each_phase_and_a_resumed_run_says_it_is_its_own_part(study):
    """``RunPhases.split`` (issue 50) on a real study and the real clock: start-up until the first phase, each
    phase until the next, shares of the budget; a run that finds an earlier run stopped says its split is its own
    part (what the stopped run spent is not in it)."""
    import time

    from autotune.search.record.run_phase import split_line

    first = RunPhases(lambda: study)
    first.begin({"timeout_s": 10.0}, started=time.monotonic() - 0.3)  # 0.3 s of start-up before it
    first.enter("search")
    time.sleep(0.2)
    first.enter("finalists")  # killed here: its record stays
    split = first.split(budget_s=10.0)
    names = [r["phase"] for r in split["phases"]]
    assert names == ["start-up", "search"] or names == ["start-up", "search", "finalists"], split
    got = {r["phase"]: r["s"] for r in split["phases"]}
    assert got["start-up"] >= 0.3 and got["search"] >= 0.2 and "resumed_from" not in split
    assert split_line(split).startswith("the 10 s budget went to: start-up ")

    again = RunPhases(lambda: study)
    assert again.begin({"timeout_s": 10.0})["phase"] == "finalists"
    again.enter("finalists")
    time.sleep(0.1)
    split = again.split(budget_s=10.0)
    assert split["resumed_from"] == "finalists"
    assert split_line(split).startswith("this run, resumed from the finalists' rounds: the 10 s budget: its part went "
                                        "to: "), split_line(split)
    assert split_line(RunPhases(lambda: study).split()) == ""  # before begin: nothing to say
