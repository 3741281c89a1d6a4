"""The user's own script under ``rec.apply()``, in a child process, against a recommendation whose trials are real
trial children of the recommended config (each a fresh process, as the confirmation's rounds are), kept in a real
SQLite study: the script ends with the one line, ``autotune show`` and ``autotune export`` list the run, and a loop
that ignores ``dataloader_kwargs()`` on the data-bound workload is said below the trials with the data wait named.
"""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.search.record.field_runs import PREFIX
from autotune.trial.runner import run_trial
from tests.helpers import REPO_ROOT, make_rec, run_cli

WORKLOAD = Workload(model="tests.field_workloads:sleepy", image_size=16, device="cpu")
CONFIG = TrialConfig(batch_size=16, num_workers=2, prefetch_factor=2)
ROUNDS = 4


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study holding ``ROUNDS`` real trials of the config (fresh processes), and its recommendation, whose
    confirmation rounds are those trials' windows."""
    root = tmp_path_factory.mktemp("field-study")
    storage, name = f"sqlite:///{root / 'study.db'}", "field-sleepy"
    s = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    measure = MeasureSpec(windows=3, window_s=1.0, timeout_s=120)
    rounds = []
    for _ in range(ROUNDS):
        r = run_trial(WORKLOAD, CONFIG, measure)
        assert r.status == "ok", r.reason
        s.add_trial(optuna.trial.create_trial(value=r.summary.median, user_attrs=r.figures()))
        rounds.append({"winner": list(r.samples_per_s), "baseline": list(r.samples_per_s)})
    medians = sorted(x for rd in rounds for x in rd["winner"])
    rec = make_rec(config=CONFIG, workload=WORKLOAD, storage=storage, study_name=name, trial_number=0,
                   median_samples_per_s=medians[len(medians) // 2], confirmation={"rounds": rounds},
                   fingerprint=_fingerprint())
    s.set_user_attr("recommendation", rec.to_dict())
    return storage, name


def _fingerprint() -> str:
    from autotune.machine.hardware import detect

    return detect(with_torch=False).fingerprint


def _user_script(storage: str, name: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "tests.field.user_loop", storage, name, *extra], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # ~40 s: a real search for its study, then the script and three CLI calls
def test_a_script_under_apply_ends_with_the_line_and_show_and_export_list_it(study):
    storage, name = study
    p = _user_script(storage, name, "--seconds", "4", "--window-s", "0.5")
    assert p.returncode == 0, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("autotune field: your run ") and "samples/s (median of" in last, p.stderr[-2000:]
    assert "vs the trials'" in last and "data wait" in last, last
    kept = [v for k, v in optuna.load_study(study_name=name, storage=storage).user_attrs.items()
            if k.startswith(PREFIX)]
    assert len(kept) == 1 and kept[0]["state"] == "ended" and kept[0]["line"] == last, kept
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == ROUNDS  # not a trial
    show = run_cli("show", "--storage", storage, "--study-name", name)
    assert show.returncode == 0, show.stderr
    assert "your runs, measured (1;" in show.stdout and last.removeprefix("autotune field: ") in show.stdout
    export = run_cli("export", "--storage", storage, "--study-name", name)
    assert export.returncode == 0, export.stderr
    import yaml

    doc = yaml.safe_load(export.stdout)
    assert doc["field_runs"][0]["line"] == last and "window_list" not in doc["field_runs"][0]
    import html

    from autotune.view.report import build_report

    page = build_report(optuna.load_study(study_name=name, storage=storage), storage_url=storage)
    assert "<dt>your run</dt>" in page and html.escape(last.removeprefix("autotune field: ")) in page


@pytest.mark.slow
def test_a_loop_that_loads_in_the_training_process_is_below_the_trials_with_the_data_wait_named(study):
    storage, name = study
    p = _user_script(storage, name, "--seconds", "10", "--ignore-loader", "--window-s", "1.0")
    assert p.returncode == 0, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "below the trials' 95% range" in last and "likely: the data wait grew" in last, last


@pytest.mark.slow
def test_a_killed_run_keeps_what_it_measured_up_to_its_last_write(study):
    import signal
    import time

    storage, name = study
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-m", "tests.field.user_loop", storage, name, "--seconds", "300",
                              "--window-s", "0.5"], cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline, kept = time.monotonic() + 120, []
        while time.monotonic() < deadline and not any(r.get("windows", 0) >= 2 for r in kept):
            time.sleep(1)
            kept = [v for k, v in optuna.load_study(study_name=name, storage=storage).user_attrs.items()
                    if k.startswith(PREFIX) and v["pid"] == child.pid]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    (r,) = kept
    assert r["state"] == "running" and r["steps"] > 0 and r["windows"] >= 2, r
    show = run_cli("show", "--storage", storage, "--study-name", name)
    assert "running or killed (last kept " in show.stdout, show.stdout[-2000:]
