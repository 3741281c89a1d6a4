"""A run stopped in any phase is resumed by the same command from that phase (``search.plan.resume``), with what
finished kept (``search.record.run_phase``, ``finalist_rounds.SavedRounds``).

These tuners run scripted trials (the runner is not under test: what is run again after a stop is), stopped the
way Ctrl-C or SIGTERM stops them: a ``KeyboardInterrupt`` where the runner is. The real thing, real processes
killed by a real SIGKILL in every phase, is ``benchmarks/kill_anywhere.py`` (a slow test runs it).
"""

from __future__ import annotations

import pytest

from autotune.config import TrialResult
from autotune.search.plan.resume import resume
from autotune.search.record import run_phase
from autotune.trial.parity import ParityResult
from tests.helpers import make_tuner, search_run

SPREAD = [0.92, 0.96, 1.0, 1.04, 1.08]  # a finalist run's windows (few: the choice's bootstrap is per window)
SPEED = {(8, False): 50.0, (8, True): 55.0, (16, False): 100.0, (16, True): 106.0}
# the winner's first finalist rounds swing (+25%, -15%): within noise of the lighter bs=16, so extra rounds run
SWING = [1.25, 0.85, 1.0, 1.0, 1.0, 1.0]


class Script:
    """Trials at ``SPEED`` (the winner swinging in its finalist runs), every call's log name kept; stops (as
    Ctrl-C does) at the first call whose log name starts with ``stop_at``."""

    def __init__(self, stop_at: str | None = None) -> None:
        self.stop_at, self.calls, self.checks = stop_at, [], []
        self.winner_runs = 0

    def __call__(self, workload, config, measure, **kw):
        name = kw["log_path"].name if kw.get("log_path") else "?"
        if self.stop_at and name.startswith(self.stop_at):
            raise KeyboardInterrupt
        self.calls.append(name)
        k = (config.batch_size, config.channels_last)
        v = SPEED[k]
        if search_run(measure, kw):
            return TrialResult(status="ok", samples_per_s=(v, v, v), wall_s=1.0, peak_host_mb=200.0,
                               batch_size=config.batch_size)
        f = 1.0
        if k == (16, True) and name.startswith("finalist-"):
            self.winner_runs += 1
            f = SWING[(self.winner_runs - 1) % len(SWING)]
        return TrialResult(status="ok", samples_per_s=tuple(v * f * x for x in SPREAD), wall_s=1.0,
                           peak_host_mb=200.0, batch_size=config.batch_size)

    def check(self, workload, config, **kw):  # the numerics check (``parity``), counted
        if self.stop_at == "numerics":
            raise KeyboardInterrupt
        self.checks.append(config.short())
        return ParityResult(ok=True, steps=kw.get("steps", 5), reason="within the tolerance")


def _tuner(tmp_path, script: Script, logs: list[str]):
    return make_tuner(tmp_path, finalists=2, finalist_rounds=2, runner=script, parity=script.check, log=logs.append)


def _stopped(tmp_path, stop_at: str) -> tuple[Script, list[str]]:
    script, logs = Script(stop_at), []
    with pytest.raises(KeyboardInterrupt):
        _tuner(tmp_path, script, logs).run(trials=4)
    return script, logs


@pytest.mark.parametrize("stop_at,phase,runs_again", [
    ("confirm-", "confirmation", ("confirm-",)),
    ("numerics", "numerics", ("confirm-",)),
    ("finalist-extra-2", "extra rounds", ("finalist-extra-2", "finalist-extra-3", "confirm-")),
])
def test_a_run_stopped_after_its_search_goes_on_from_the_phase_it_was_in(tmp_path, stop_at, phase, runs_again):
    """Stopped in the confirmation, the same command runs no trial, keeps the finalists' rounds, their extra pairs
    and the numerics check, and runs the confirmation again; stopped earlier, it goes on from there (a stopped
    extra pair or round again whole)."""
    first, _ = _stopped(tmp_path, stop_at)
    study = make_tuner(tmp_path).study()
    assert run_phase.read(study)["phase"] == phase
    trials = len(study.trials)

    script, logs = Script(), []
    rec = _tuner(tmp_path, script, logs).run(trials=4)
    assert rec is not None and (rec.config.batch_size, rec.config.channels_last) == (16, True)
    assert len(_tuner(tmp_path, Script(), []).study().trials) == trials  # no search trial
    assert script.calls and all(c.startswith(runs_again) for c in script.calls), script.calls
    resuming = [m for m in logs if m.startswith(("resuming", "not resuming"))]
    assert len(resuming) == 1 and f"during {run_phase.describe(phase)}" in resuming[0], resuming
    assert not any(m.startswith("search done") for m in logs)
    assert script.checks == ([] if first.checks else ["bs=16 w=0 cl"]), script.checks  # kept once it finished
    assert run_phase.read(make_tuner(tmp_path).study()) is None  # the run ended: nothing left to resume


def test_once_the_recommendation_is_stored_it_stands_and_nothing_is_measured_again(tmp_path):
    """A run killed after its recommendation was stored (its record says so: as a SIGKILL leaves it)."""
    script, logs = Script(), []
    tuner = _tuner(tmp_path, script, logs)
    rec = tuner.run(trials=4)
    study = tuner.study()
    study.set_user_attr(run_phase.key(), {"phase": "dashboard note", "pid": 1, "since": 0.0, "stop_reason": "x",
                                      "ask": {"trials": 4, "timeout_s": None, "backend": "local"}})
    again, said = Script(), []
    out = _tuner(tmp_path, again, said).run(trials=4)
    assert again.calls == [] and again.checks == []
    assert out.to_dict() == rec.to_dict()
    assert any("its recommendation was stored and stands" in m for m in said), said


def test_the_decision_for_each_phase():
    ask = {"trials": 3}

    def at(phase):
        return resume({"phase": phase, "ask": ask, "pid": 9, "since": 0.0}, ask=ask, now=30.0)

    assert resume(None, ask=ask) == resume({}, ask=ask)
    assert (at("search").search, at("ceilings").search) == (True, True)
    for phase in run_phase.AFTER_SEARCH:
        assert not at(phase).search and at(phase).finalize == (phase not in run_phase.STORED), phase
        during = run_phase.describe(phase)
        assert at(phase).line.startswith(f"resuming the run (pid 9) stopped 30 s ago during {during}")
    unknown = resume({"phase": "a later phase", "ask": ask}, ask=ask)
    assert unknown.search and unknown.line.startswith("not resuming")
    other = resume({"phase": "confirmation", "ask": {"trials": 5}, "pid": 9}, ask=ask)  # another command
    assert other.search and other.finalize and "another budget was asked" in other.line


def test_a_resumed_run_that_plans_other_finalists_keeps_the_rounds_they_share_and_says_which(tmp_path):
    """Killed in the finalists' second round; the same command resumes but plans other finalists (as a fresh
    --timeout budget does: here 1 finalist and the baseline instead of 2 and the baseline; the bundle, 48% behind, gets
    no round: ``choose.contenders``). Round 1 holds every finalist of the new plan, so it is kept
    whole and not run again, and the log says exactly that; before, any change of plan dropped every finished run
    while the resume line said they were kept."""
    logs: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        make_tuner(tmp_path, finalists=3, finalist_rounds=2, runner=Script("finalist-1"), parity=Script().check,
                   log=logs.append).run(trials=4)
    first_plan = [m for m in logs if m.startswith("re-measuring")]
    script, said = Script(), []
    make_tuner(tmp_path, finalists=1, finalist_rounds=2, runner=script, parity=script.check,
               log=said.append).run(trials=4)
    plan_line = [m for m in said if m.startswith("re-measuring")]
    assert first_plan != plan_line, (first_plan, plan_line)  # another plan
    n = int(plan_line[0].split()[1])
    assert not [c for c in script.calls if c.startswith("finalist-0")], script.calls  # round 1: kept, not run
    assert [c for c in script.calls if c.startswith("finalist-1")] and len(
        [m for m in said if m.startswith("  round 1/2") and m.endswith("(kept)")]) == n
    kept = [m for m in said if m.startswith("  from the interrupted run:")]
    assert len(kept) == 1 and kept[0].startswith(f"  from the interrupted run: round(s) 1 of 2 kept whole ({n} "
                                                 "finalist(s) each)"), said
    resuming = [m for m in said if m.startswith("resuming")]
    assert len(resuming) == 1 and "the finalists' runs it finished are kept where this run's plan shares them" \
        in resuming[0], resuming
