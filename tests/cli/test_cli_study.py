"""The study commands through the real CLI: bad input refused in one line, and run -> show -> export."""

from __future__ import annotations

import csv
import shlex

import pytest
import yaml

from autotune import Recommendation

from tests.helpers import run_cli

TINY_SPACE = {"name": "tiny", "device": "cpu",
              "parameters": {"batch_size": {"type": "int", "choices": [8, 16]}}, "baseline": {"batch_size": 8}}


@pytest.fixture
def space_file(tmp_path):
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(TINY_SPACE))
    return p


_BAD_SPACES = {
    "malformed": ("parameters: [oops\n", "not valid YAML"),
    "unknown_param": (yaml.safe_dump({"parameters": {"batch_sise": {"type": "int", "choices": [8]}}}), "batch_sise"),
    "empty_choices": (yaml.safe_dump({"parameters": {"batch_size": {"type": "int", "choices": []}}}), "non-empty"),
    "min_gt_max": (yaml.safe_dump({"parameters": {"num_workers": {"type": "int", "low": 3, "high": 1}}}),
                   "low 3 > high 1"),
    "contradiction": (yaml.safe_dump({"parameters": {"batch_size": {"type": "int", "choices": [8]}},
                                      "fixed": {"batch_size": 16}}), "both searched and fixed"),
}
_slow = pytest.mark.slow  # each row is a CLI process (~2 s): one row per kind of mistake runs by default

_BAD_STUDY_INPUT = [
    pytest.param(["run", "--model", "resnet18", "--trials", "1", "--space", "{space}"], "malformed", id="malformed"),
    *[pytest.param(["run", "--model", "resnet18", "--trials", "1", "--space", "{space}"], name, id=name, marks=_slow)
      for name in ("unknown_param", "empty_choices", "min_gt_max", "contradiction")],
    pytest.param(["run", "--model", "resnet18", "--trials", "1", "--memory-cap", "4TiB"], "larger than this machine"),
    pytest.param(["run", "--model", "resnet18", "--trials", "1", "--memory-cap", "200MiB"], "below", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--patience", "0"], "give a budget", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--ceiling", "5"], "--ceiling", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--patience", "-1"], "--patience -1 must be 0", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--timeout", "tonight"], "--timeout", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--timeout", "5"], "has no unit: write 5s, 5m or 5h"),
    pytest.param(["run", "--model", "resnet18", "--run-length", "6"], "--run-length '6' has no unit", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--run-length", "a while"], "--run-length", marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--planned-steps", "0"], "--planned-steps 0: give a whole number",
                 marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--run-length", "6h", "--planned-steps", "100"], "not allowed with",
                 marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--trials", "1", "--storage", "nosuchdb://x"], "not supported",
                 marks=_slow),
    pytest.param(["run", "--model", "resnet18", "--trials", "1", "--storage", "postgresql://u@127.0.0.1:1/x"],
                 "cannot open storage"),  # nothing listens on port 1: unreachable
    pytest.param(["run", "--model", "resnet18", "--trials", "1", "--storage", "sqlite:////proc/nope/a.db"],
                 "cannot create", marks=_slow),
    pytest.param(["export", "--storage", "sqlite:///{tmp}/empty.db"], "no study database", marks=_slow),
    pytest.param(["show", "--storage", "sqlite:///{tmp}/empty.db"], "no study database"),
]


@pytest.mark.parametrize("args, needle", _BAD_STUDY_INPUT)
def test_bad_study_input_is_one_line_exit_2(tmp_path, args, needle):
    if "{space}" in args:  # a bad space file: ``needle`` names it in _BAD_SPACES, which says what the line names
        text, space_needle = _BAD_SPACES[needle]
        (tmp_path / f"{needle}.yaml").write_text(text)
        args = [a.replace("{space}", str(tmp_path / f"{needle}.yaml")) for a in args]
        needle = space_needle
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    out = run_cli(*args, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (args, out.stderr[-1500:])
    assert "Traceback" not in out.stderr, args
    assert needle in lines[-1], (args, lines[-1])
    assert lines[-1].startswith("autotune "), lines


def test_export_with_no_finished_trial_is_refused(tmp_path):
    import optuna

    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=storage, study_name="only-failures", direction="maximize")
    study.set_user_attr("workload", {"model": "resnet18"})
    t = study.ask()
    study.tell(t, state=optuna.trial.TrialState.FAIL)
    out = run_cli("export", "--storage", storage)
    assert out.returncode == 2 and "no finished feasible trial" in out.stderr.strip().splitlines()[-1]


# slow: a real `autotune run`; by default the CLI's run, report and `show --explain` run on conftest's report_study
# (view/test_report.py), and `export` writes a real recommendation in
# test_security.py::test_a_recommendation_keeps_no_password_in_its_yaml_report_or_mlflow
@pytest.mark.slow
def test_run_show_export_round_trip(tmp_path, space_file):
    storage = f"sqlite:///{tmp_path}/flow.db"
    common = ["--model", "tests.workloads_fixtures:tiny", "--image-size", "16", "--device", "cpu",
              "--storage", storage]
    out = run_cli("run", *common, "--space", str(space_file), "--trials", "2", "--windows", "2",
                  "--window-seconds", "0.2", "--finalists", "2", "--rounds", "1", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "recommended:" in out.stdout and "trial 0 is the PyTorch-defaults baseline" in out.stderr

    csv_path = tmp_path / "trials.csv"
    shown = run_cli("show", "--storage", storage, "--csv", str(csv_path))
    assert shown.returncode == 0, shown.stderr
    assert "samples/s" in shown.stdout and "bs=8" in shown.stdout
    # where the run's time went (issue 50): in its closing lines and in `show`, the same figures
    said = next(ln.strip() for ln in out.stdout.splitlines() if "the run's time went to: start-up" in ln)
    assert said in shown.stdout and " search " in said, (said, shown.stdout)
    rows = list(csv.DictReader(csv_path.open()))
    measured = [r for r in rows if not r["status"].startswith("copy of")]  # copies do not use up --trials
    assert len(measured) == 2 and {r["config"] for r in measured} == {"bs=8 w=0", "bs=16 w=0"}

    # the closing hint is a command that works as printed: it names the storage the run used
    hint = next(ln for ln in out.stdout.splitlines() if ln.startswith("export it with: "))
    assert f"--storage {storage}" in hint, hint
    hinted = shlex.split(hint.removeprefix("export it with: "))
    assert hinted[0] == "autotune"
    best = tmp_path / hinted[hinted.index("-o") + 1]
    exported = run_cli(*hinted[1:-1], str(best))
    assert exported.returncode == 0, exported.stderr
    rec = Recommendation.from_yaml(best)
    assert rec.median_samples_per_s > 0 and rec.config.batch_size in (8, 16)
    assert rec.reproduce.startswith("autotune trial --model tests.workloads_fixtures:tiny")
    assert rec.fingerprint and rec.versions["torch"]
    assert rec.budget_split["of"] == "run" and rec.budget_split["phases"][0]["phase"] == "start-up"


def test_the_export_hint_names_the_storage_without_its_password():
    from autotune.cli.study import export_hint

    assert export_hint("s", None) == "autotune export --study-name s -o best.yaml"
    assert export_hint("s", "postgresql://tuner:p@ss:w0rd@db.lan:5432/autotune") == (
        "autotune export --storage 'postgresql://tuner:***@db.lan:5432/autotune' --study-name s -o best.yaml")


def test_show_leaves_blank_what_a_failed_trial_did_not_measure(tmp_path):
    """Every trial failed: their samples/s and speedup are blank, not "None" (an all-None column)."""
    from autotune.config import TrialResult

    from tests.helpers import make_tuner

    def crashed(workload, config, measure, **kw):
        return TrialResult(status="crashed", reason="killed by SIGSEGV", wall_s=1.0, batch_size=config.batch_size)

    make_tuner(tmp_path, finalists=1, runner=crashed, parity_steps=0).run(trials=2)
    shown = run_cli("show", "--storage", f"sqlite:///{tmp_path}/t.db")
    assert shown.returncode == 0, shown.stderr
    assert "crashed" in shown.stdout and "None" not in shown.stdout, shown.stdout


def test_show_picks_the_only_study_with_trials_over_an_empty_one(tmp_path):
    """A run stopped before its first trial leaves an empty study; show/export without --study-name go on."""
    import optuna

    storage = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(storage=storage, study_name="empty-one", direction="maximize")
    study = optuna.create_study(storage=storage, study_name="with-trials", direction="maximize")
    t = study.ask()
    t.set_user_attr("config", {"batch_size": 8})
    t.set_user_attr("status", "ok")
    t.set_user_attr("median_samples_per_s", 50.0)
    study.tell(t, 50.0)
    shown = run_cli("show", "--storage", storage)
    assert shown.returncode == 0, shown.stderr
    assert "with-trials" in shown.stdout + shown.stderr and "bs=8" in shown.stdout
    optuna.create_study(storage=storage, study_name="also-trials", direction="maximize").optimize(
        lambda tr: 1.0, n_trials=1)
    ambiguous = run_cli("show", "--storage", storage)
    assert ambiguous.returncode == 2 and "pick one with --study-name" in ambiguous.stderr
