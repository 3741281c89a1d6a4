"""Fault injection: trials that die, a tuner that is killed, two tuners on one study, exports during a run.

The fast subset runs by default; the SIGKILL x20 loop is marked slow and `.ci/run` runs it too (a few minutes).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import optuna
import psutil
import pytest
import yaml

from autotune import MeasureSpec, Workload
from autotune.machine.hardware import detect
from autotune.search.space.search_space import space_from_dict
from autotune.search.tuner import Tuner

from tests.helpers import run_cli

QUICK = MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=60)
HW = detect()


def _orphans() -> list[psutil.Process]:
    """Trial children (or their DataLoader workers) whose tuner is gone."""
    out = []
    for p in psutil.process_iter(["cmdline", "ppid"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "autotune.trial.worker" in cmd and p.info["ppid"] == 1:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _space_file(tmp_path, choices=(8, 16)):
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump({"name": "tiny", "device": "cpu",
                                 "parameters": {"batch_size": {"type": "int", "choices": list(choices)}},
                                 "baseline": {"batch_size": choices[0]}}))
    return p


def _run_cmd(space, storage, *extra):
    return [sys.executable, "-m", "autotune.cli", "run", "--model", "tests.study_fixtures:sleepy", "--image-size",
            "16", "--space", str(space), "--storage", storage, "--windows", "2", "--window-seconds", "0.5",
            "--finalists", "1", "--rounds", "1", "--no-progress", "--device", "cpu", *extra]


def _wait_for_running(storage, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.3)
        try:
            summaries = optuna.get_all_study_summaries(storage)
            if summaries:
                study = optuna.load_study(study_name=summaries[0].study_name, storage=storage)
                if any(t.state.name == "RUNNING" for t in study.trials):
                    return study
        except Exception:
            continue
    pytest.fail("no trial started in time")


# slow: a real study; by default a trial with a DataLoader worker runs and leaves no process
# (trial/test_runner.py::test_ok_with_a_dataloader_worker_leaves_no_process_behind) and a study goes on past failed
# trials with a scripted runner
@pytest.mark.slow
def test_a_killed_dataloader_worker_is_an_error_and_the_study_goes_on(tmp_path):
    space = space_from_dict({"name": "w", "device": "cpu",
                             "parameters": {"num_workers": {"type": "int", "low": 0, "high": 1}},
                             "baseline": {"num_workers": 0}, "oversubscribe": True}, hardware=HW)
    tuner = Tuner(Workload(model="tests.study_fixtures:worker_killer", image_size=16), space=space, measure=QUICK,
                  storage=f"sqlite:///{tmp_path}/w.db", hardware=HW, progress=False, log=lambda m: None,
                  finalists=1, finalist_rounds=1)
    tuner.run(trials=1)
    tuner.study().enqueue_trial({"num_workers": 1})
    rec = tuner.run(trials=1)
    bad = tuner.study().trials[1]
    assert bad.state.name == "FAIL" and bad.user_attrs["status"] == "error"
    assert "DataLoader worker" in bad.user_attrs["reason"]
    assert rec is not None and rec.config.num_workers == 0
    assert not _orphans()


@pytest.mark.slow  # ~38 s: a real run stopped and resumed (the default suite keeps it under 5 minutes)
def test_sigterm_stops_gracefully_and_resume_retries(tmp_path):
    space = _space_file(tmp_path)
    storage = f"sqlite:///{tmp_path}/g.db"
    proc = subprocess.Popen(_run_cmd(space, storage, "--trials", "3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    study = _wait_for_running(storage)
    running = [t.number for t in study.trials if t.state.name == "RUNNING"][0]
    assert running == 0  # the baseline runs first: stopped during it
    time.sleep(0.5)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 15, "the tuner did not stop promptly"
    assert proc.returncode == 130
    last = err.strip().splitlines()[-1]
    assert "resume" in last and "Traceback" not in err
    time.sleep(0.5)
    assert not _orphans()
    study = optuna.load_study(study_name=study.study_name, storage=storage)
    t = study.trials[running]
    assert t.state.name == "FAIL" and t.user_attrs["status"] == "interrupted"
    # the retry is queued behind what was queued before the stop (the batch walk's step): two trials run both
    out = subprocess.run(_run_cmd(space, storage, "--trials", "2"), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-1500:]
    assert "1 interrupted trial(s) re-queued" in out.stderr
    study = optuna.load_study(study_name=study.study_name, storage=storage)
    retries = [x for x in study.trials if x.user_attrs.get("retry_of") == running]
    assert len(retries) == 1 and retries[0].params == t.params and retries[0].state.name == "COMPLETE"
    assert t.user_attrs["baseline"] is True and retries[0].user_attrs["baseline"] is True  # its role comes with it


@pytest.mark.slow  # a real run held mid-trial for each test: over 7 s each (--durations, 2026-11-29)
class TestWhileARunMeasures:
    """What another run or an export does while one `autotune run` measures. The run is shared by the tests of
    this class (started once, killed when the class is done, so no later test meets its machine lock)."""

    @pytest.fixture(scope="class")
    @classmethod
    def measuring(cls, tmp_path_factory):  # a classmethod: pytest 10 drops class-scoped instance-method fixtures
        root = tmp_path_factory.mktemp("measuring")
        space = root / "space.yaml"  # 8 batch sizes x channels_last: 16 configs, more than the tests outlast
        space.write_text(yaml.safe_dump({"name": "tiny", "device": "cpu", "baseline": {"batch_size": 8},
                                         "parameters": {"batch_size": {"type": "int",
                                                                       "choices": [8, 10, 12, 14, 16, 20, 24, 32]},
                                                        "channels_last": {"type": "bool"}}}))
        storage = f"sqlite:///{root}/c.db"
        # The run must still be measuring (holding the machine lock) when the last test of the class starts, in
        # any order and on a loaded machine: 1 s windows are wall time whatever the load, so 16 configs at 2 s+ of
        # windows each (and the trials of the batch walk) outlast both tests, which end with the fixture's kill.
        # It once ran out of configs on a machine at load 5 and a second run slipped in after its finalists.
        proc = subprocess.Popen(_run_cmd(space, storage, "--trials", "60", "--patience", "0",
                                         "--window-seconds", "1"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            study = _wait_for_running(storage)
            yield SimpleNamespace(proc=proc, root=root, space=space, storage=storage, study_name=study.study_name)
        finally:
            proc.kill()
            proc.wait()

    def test_second_run_on_one_sqlite_study_is_refused(self, measuring):
        second = run_cli("run", "--model", "tests.study_fixtures:sleepy", "--image-size", "16", "--space",
                         str(measuring.space), "--storage", measuring.storage, "--trials", "1", "--device", "cpu",
                         "--no-progress")
        assert second.returncode == 2
        assert "another autotune run" in second.stderr.strip().splitlines()[-1]

    # slow: three exports, each a CLI process that stamps the environment (~35 s on 2 cores); by default `export`
    # writes a real recommendation in test_security.py (test_a_recommendation_keeps_no_password_in_its_yaml...)
    # and a failed write keeps the old file in test_recommend.py::test_failed_write_keeps_the_old_file_and_no_temp
    @pytest.mark.slow
    def test_exports_while_the_run_writes_are_refused_or_complete(self, measuring, tmp_path):
        first, storage = measuring.proc, measuring.storage
        # exports while the first run writes: each is either a clean refusal or a complete, valid file
        out = tmp_path / "best.yaml"
        exported = 0
        while first.poll() is None and exported < 3:
            r = run_cli("export", "--storage", storage, "--study-name", measuring.study_name, "-o", str(out))
            if r.returncode == 0:
                doc = yaml.safe_load(out.read_text())
                assert doc["config"]["batch_size"] in (8, 10, 12, 14, 16, 20, 24, 32)
                exported += 1
            else:
                assert r.returncode == 2 and "no finished feasible trial" in r.stderr
            time.sleep(0.5)
        assert not [p for d in (tmp_path, measuring.root) for p in os.listdir(d) if p.endswith(".tmp")]

    def test_a_run_of_another_study_on_this_machine_is_refused_before_it_writes_anything(self, measuring, tmp_path):
        """Two studies, two databases, one machine: their trials would share the cores, so the second run is
        refused, naming the first, and leaves no database, study or trial behind."""
        assert measuring.proc.poll() is None, "the shared run ended before this test"
        second = run_cli("run", "--model", "tests.workloads_fixtures:tiny", "--image-size", "16", "--space",
                         str(measuring.space), "--storage", f"sqlite:///{tmp_path}/b/b.db", "--trials", "1",
                         "--device", "cpu", "--no-progress")
        assert second.returncode == 2
        last = second.stderr.strip().splitlines()[-1]
        assert "another autotune run is measuring on this machine" in last and f"pid {measuring.proc.pid}" in last
        assert not (tmp_path / "b").exists()  # nothing written: no folder, no database


def test_a_workload_that_cannot_be_called_is_refused_before_a_study_is_written(tmp_path):
    """``--model os:system``: one line, exit 2, and no database, study or trial left behind."""
    out = run_cli("run", "--model", "os:system", "--device", "cpu", "--storage", f"sqlite:///{tmp_path}/s/s.db",
                  "--trials", "3", "--no-progress")
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]  # nothing before it: one line
    assert out.stderr.startswith("autotune run: error: os:system cannot be called as a workload")
    assert not (tmp_path / "s").exists()


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29: the suite at 317-342 s)
def test_a_workload_whose_build_raises_ends_the_run_at_its_first_trial(tmp_path, monkeypatch):
    """Any exception from the user's callable is the workload's, not a config's: the first trial ends the run
    (it used to fail every trial until the patience ran out, then report "converged"). The workload builds in
    the check that reads its first batch and fails from then on (a workload that never builds is refused by that
    check, before a study is written: tests/workloads/test_data_fit.py, test_faults' check-child tests)."""
    from autotune.errors import WorkloadError

    monkeypatch.setenv("AUTOTUNE_TEST_BUILT", str(tmp_path / "built-once"))
    space = space_from_dict({"name": "b", "device": "cpu",
                             "parameters": {"batch_size": {"type": "int", "choices": [4, 8, 16]}},
                             "baseline": {"batch_size": 4}}, hardware=HW)
    tuner = Tuner(Workload(model="tests.workloads_fixtures:breaks_after_the_check", image_size=16), space=space,
                  measure=QUICK, storage=f"sqlite:///{tmp_path}/b.db", hardware=HW, progress=False,
                  log=lambda m: None, finalists=1, finalist_rounds=1, patience=2)
    with pytest.raises(WorkloadError) as info:
        tuner.run(trials=3)
    msg = str(info.value)
    assert (tmp_path / "built-once").exists()  # the check built it: the failure below is the trial's
    assert "building the workload tests.workloads_fixtures:breaks_after_the_check raised RuntimeError: cannot open" \
        in msg
    assert "\n" not in msg and "trial-0.log" in msg
    trials = tuner.study().trials
    assert [t.state.name for t in trials if t.state.is_finished()] == ["FAIL"]
    assert "cannot open /data/shards" in trials[0].user_attrs["traceback"]
    assert "RuntimeError: cannot open" in (tuner.artifacts_dir / "trial-0.log").read_text()


def test_a_workload_that_never_builds_is_refused_before_a_trial(tmp_path):
    """The check that reads the first batch (in a child) builds the workload first: one that cannot build is a
    one-line ``WorkloadError`` before any trial runs, through the Python API as through the CLI."""
    from autotune.errors import WorkloadError

    space = space_from_dict({"name": "b", "device": "cpu",
                             "parameters": {"batch_size": {"type": "int", "choices": [4, 8]}},
                             "baseline": {"batch_size": 4}}, hardware=HW)
    db = tmp_path / "n.db"
    with pytest.raises(WorkloadError) as info:
        Tuner(Workload(model="tests.workloads_fixtures:broken_build", image_size=16), space=space, measure=QUICK,
              storage=f"sqlite:///{db}", hardware=HW, progress=False, log=lambda m: None).run(trials=3)
    msg = str(info.value)
    assert "broken_build raised RuntimeError: cannot open /data/shards" in msg and "\n" not in msg
    assert not list(tmp_path.glob("**/trial-*.log"))  # no trial ran
    if db.exists():
        import sqlite3

        with sqlite3.connect(db) as con:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
            assert "trials" not in tables or con.execute("select count(*) from trials").fetchone()[0] == 0


@pytest.mark.slow
def test_a_sigkill_during_the_finalists_loses_no_finished_round(tmp_path):
    """The real thing: `autotune run` SIGKILLed once its first finalist round is stored; the next run keeps that
    round and measures only the second."""
    space = _space_file(tmp_path)
    storage = f"sqlite:///{tmp_path}/f.db"
    cmd = _run_cmd(space, storage, "--trials", "2")
    cmd[cmd.index("--rounds") + 1] = "2"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:
                name = optuna.get_all_study_summaries(storage)[0].study_name
                runs = (optuna.load_study(study_name=name, storage=storage).user_attrs.get("finalist_rounds")
                        or {}).get("runs") or {}
            except Exception:
                continue
            if sum(k.startswith("0:") for k in runs) == 2:  # round 1: the finalist and the baseline
                break
        else:
            pytest.fail("the first finalist round was not stored before the run ended")
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cmd[cmd.index("--trials") + 1] = "0"
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "round 1/2: measured by an earlier, interrupted run of these finalists; kept" in out.stderr
    lines = out.stderr.splitlines()
    assert len([ln for ln in lines if ln.startswith("  round 1/2 bs=") and ln.endswith("(kept)")]) == 2, lines
    assert len([ln for ln in lines if ln.startswith("  round 2/2 bs=") and not ln.endswith("(kept)")]) == 2, lines


@pytest.mark.slow
def test_sigkill_twenty_times_loses_nothing(tmp_path):
    """SIGKILL the tuner 20 times at random moments; then it must finish with every finished trial intact."""
    space = _space_file(tmp_path, choices=(4, 8, 16))
    storage = f"sqlite:///{tmp_path}/k.db"
    rng = random.Random(1234)
    seen: dict[int, tuple] = {}  # finished trial number -> (state, value) as first seen
    name = None
    for i in range(20):
        proc = subprocess.Popen(_run_cmd(space, storage, "--trials", "3"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # during start-up, during a trial, between trials or in the finalists (start-up alone is ~4 s)
        time.sleep(rng.uniform(*rng.choice([(0.5, 4.0), (4.0, 12.0), (12.0, 25.0)])))
        proc.kill()  # the tuner only: its trial child must die by itself (parent-death signal)
        proc.wait()
        time.sleep(0.7)
        assert not _orphans(), f"kill {i}: a trial process outlived the tuner"
        try:
            summaries = optuna.get_all_study_summaries(storage)
        except Exception:
            continue
        if not summaries:
            continue
        name = summaries[0].study_name
        study = optuna.load_study(study_name=name, storage=storage)
        for t in study.trials:
            if t.state.is_finished() and t.user_attrs.get("status") != "interrupted":
                if t.number in seen:
                    assert seen[t.number] == (t.state, t.value), f"trial {t.number} changed after kill {i}"
                else:
                    seen[t.number] = (t.state, t.value)
    final = subprocess.run(_run_cmd(space, storage, "--trials", "2"), capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    study = optuna.load_study(study_name=name or optuna.get_all_study_summaries(storage)[0].study_name,
                              storage=storage)
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers))
    for number, (state, value) in seen.items():  # nothing finished was lost or rewritten
        t = study.trials[number]
        assert (t.state, t.value) == (state, value)
    interrupted = [t for t in study.trials if t.user_attrs.get("status") == "interrupted"]
    for t in interrupted:
        if t.params:
            assert sum(1 for x in study.trials if x.user_attrs.get("retry_of") == t.number) == 1, t.number
    assert sum(1 for t in study.trials if t.user_attrs.get("baseline") and t.user_attrs.get("status") == "ok") == 1
    assert study.user_attrs.get("recommendation"), "the study did not complete with a recommendation"
    assert seen and interrupted, "the kills did not land both between and during trials"
    print(f"kills: 20, finished trials tracked: {len(seen)}, interrupted and retried: {len(interrupted)}, lost: 0")
