"""The kill benchmark at a small count (slow: ~10 min on 2 cores): `autotune run` SIGKILLed ten times, at least
once in each phase a run's record names (``run_phase.PHASES``: a phase added later is killed here too) as far as
a run meets it, each time resumed with the same command; every check of ``benchmarks/kill_anywhere.py`` holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import optuna
import pytest

from autotune.search.record.run_phase import PHASES, RunPhases, read
from benchmarks.kill_launch import held_phases
from tests.helpers import REPO_ROOT


def test_the_launcher_holds_each_phase_once_it_is_recorded_and_autotune_alone_does_not(tmp_path):
    """The hold is the benchmark's (``benchmarks/kill_launch.py``, issue 52 item 11): inside ``held_phases`` a new
    phase is written to the real SQLite study first, then held; a phase entered again is not; outside, nothing
    holds."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=url, study_name="s")
    phases = RunPhases(lambda: study)
    phases.begin({})
    with held_phases(0.3):
        t0 = time.monotonic()
        phases.enter(PHASES[-1])
        held, done = time.monotonic() - t0, time.time()
        assert held >= 0.3
        assert read(optuna.load_study(study_name="s", storage=url))["since"] <= done - 0.25  # written, then held
        t0 = time.monotonic()
        phases.enter(PHASES[-1])  # already in it: nothing recorded, nothing held
        assert time.monotonic() - t0 < 0.2
    t0 = time.monotonic()
    phases.enter(PHASES[0])
    assert time.monotonic() - t0 < 0.2 and read(optuna.load_study(study_name="s", storage=url))["phase"] == PHASES[0]


def test_the_launcher_runs_autotunes_own_cli_with_its_arguments_and_exit_code(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "benchmarks.kill_launch", "--hold", "0.1", "run", "--bogus"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("autotune run: error: unrecognized argument: --bogus"), run
    bare = subprocess.run([sys.executable, "-m", "benchmarks.kill_launch", "run"], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and "--hold SECONDS" in bare.stderr, bare


@pytest.mark.slow
def test_ten_sigkills_at_every_phase_lose_nothing_and_leave_nothing_running(tmp_path):
    out = tmp_path / "kills.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "kill_anywhere.py"), "--kills", "10",
                           "--seed", "1", "--workdir", str(tmp_path / "runs"), "--out", str(out)],
                          cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["complete"] and len(data["kills"]) == 10
    assert data["phases"] == list(PHASES)
    tried = {k["target"] for k in data["kills"]} | {p for p, n in data["not_reached"].items() if n}
    assert set(PHASES) <= tried, tried  # each phase was killed in, or the run left it before the moment drawn
    killed = {k["row"] for k in data["kills"]}
    assert len(killed & set(PHASES)) >= 6, killed  # most were: the run meets them all in order
    for k in data["kills"]:
        assert not k["alive_after_1s"] and k["lost"] == 0 and not k["changed"] and k["locks_free"], k
        assert k["integrity"] == "ok" and k["resume"]["ok"], k
    assert all(c["rc"] == 0 and c["yaml_equal"] for c in data["cycles"])
