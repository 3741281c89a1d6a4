"""The two ceilings (search.record.ceilings): the data path and the model measured alone, the climb over workers,
the one model of the pipeline that reads them, and the planned search that sizes the loader from them.

The tuner test's runner is a fake with a response model of a pipeline (end to end = the slower of the model and the
data path; the data path grows with workers until the cores run out): what is under test is which children the
tuner asks for and what it concludes. The real mechanism (real children over decoded JPEGs) is in
tests/trial/test_parts.py and the slow test at the end here."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig, TrialResult
from autotune.machine.hardware import detect
from autotune.search.plan import ceiling_runs
from autotune.search.record import ceilings
from autotune.search.plan.climb import MAX_POINTS, climb
from autotune.search.record.ceilings import Ceilings, Point
from autotune.search.space.search_space import space_from_dict
from autotune.search.record.trials import role as role_of
from autotune.search.tuner import Tuner

# AVX-512 with bf16 whatever this machine is: that kind's likely winners hold bf16 (AMX's do not:
# search_spaces/likely.yaml)
BF16_FLAGS = tuple(f for f in detect(with_torch=False).cpu_flags if not f.startswith("amx")) + ("avx512_bf16",)
HW = dataclasses.replace(detect(with_torch=False), compiler="g++", libc="glibc 2.36", usable_cores=8,
                         cpu_flags=BF16_FLAGS)
QUICK = MeasureSpec(windows=3, window_s=0.2, timeout_s=120, memory_cap_mb=4096.0)


def _c(model: float, *data: tuple[int, float]) -> Ceilings:
    return Ceilings(model=Point("model", {"batch_size": 64, "amp": "bf16"}, model),
                    data=tuple(Point("data", {"num_workers": w}, r) for w, r in data))


def test_workers_to_feed_interpolates_between_the_points_around_the_model():
    # model 1000/s, x1.15 headroom: 1150 needed; 2 workers give 600, 4 give 1300: 300/s a worker, 2 + ceil(550/350)
    assert _c(1000.0, (1, 300.0), (2, 600.0), (4, 1300.0)).workers_to_feed() == 4
    assert _c(1000.0, (1, 300.0), (2, 600.0), (8, 1800.0)).workers_to_feed() == 5  # 200/s a worker: 600 + 3 x 200
    assert _c(100.0, (1, 300.0), (2, 600.0)).workers_to_feed() == 1  # one worker already covers it
    # none covers it: the fastest data point's workers, and the data path binds whatever the knobs
    c = _c(5000.0, (1, 300.0), (2, 600.0), (4, 650.0))
    assert c.workers_to_feed() == 4 and not c.feeds()
    assert c.levers() and all("cannot feed the model" in lever for lever in c.levers())
    assert "decode_jpeg(device='cuda')" in " ".join(c.levers())
    cpu = dataclasses.replace(c, device="cpu")  # a CPU run has no GPU to decode on: the other levers only
    assert "decode on the GPU" not in " ".join(cpu.levers()) and len(cpu.levers()) == len(c.levers()) - 1
    assert Ceilings.from_dict(cpu.to_dict()).device == "cpu"
    assert _c(1000.0, (2, 1500.0)).levers() == []  # fed: no lever to name


def test_predict_and_verdict_say_which_ceiling_binds():
    c = _c(1000.0, (1, 300.0), (4, 1300.0))
    assert c.predict({"num_workers": 2}) == (pytest.approx(633.33, rel=1e-3), "data")
    assert c.predict({"num_workers": 4}) == (1000.0, "model")
    assert c.predict({"num_workers": 0}) == (None, "unknown")  # no point at 0 workers measured
    assert c.data_rate(16) == 1300.0  # beyond the climb: its last point (it stopped there)
    line = c.verdict({"num_workers": 2}, 600.0)
    assert line.startswith("600 samples/s end to end: the model alone runs 1000 samples/s")
    assert "your data path gives about 633 with 2 worker(s)" in line and line.endswith("input-bound")
    assert c.verdict({"num_workers": 4}, 990.0).endswith("model-bound")


def test_ceilings_of_ddp_ranks_say_their_workers_are_each_ranks():
    c = dataclasses.replace(_c(1000.0, (1, 300.0), (4, 1300.0)), world_size=8)
    back = Ceilings.from_dict(c.to_dict())
    assert back.world_size == 8 and back.to_dict() == c.to_dict()
    assert "with 2 worker(s) per rank (8 ranks)" in back.verdict({"num_workers": 2}, 600.0)
    assert any("in 8 DDP ranks at once" in line for line in back.lines())
    assert back.lines()[-1].endswith(": 4 per rank (8 ranks)")
    assert Ceilings.from_dict({"model": None}).world_size == 1  # a record from before: one process
    from autotune.view.ceilings_plot import ceilings_figure

    fig = ceilings_figure(back, [{"trial": 0, "status": "ok", "samples_per_s": 600.0, "config": "w=2"}], {0: 2}, 0)
    assert fig.layout.xaxis.title.text == "DataLoader workers per rank (8 DDP ranks)"
    assert fig.layout.yaxis.title.text == "samples/s, all ranks'"
    assert "per rank" not in "".join(_c(1000.0, (1, 300.0)).lines())


def _runner(asked: list, rate_of):
    def measure(config, part):
        asked.append((part, config.get("num_workers", 0)))
        return Point(part, config, rate_of(part, config.get("num_workers", 0)), windows=(1.0, 1.0, 1.0))
    return measure


# Which counts the climb measures, and what it gives, are held as properties over random curves in test_climb.py
# (a rise that covers the model, one that does not, one that goes flat, a count that fails, a starved host, two
# counts offered), not as the sequence one curve drew here.


def test_feed_takes_pinned_memory_and_persistent_workers_where_the_space_offers_them(tmp_path):
    import optuna

    space = space_from_dict({"name": "g", "device": "cuda", "parameters": {
        "batch_size": {"type": "int", "choices": [32, 64]},
        "num_workers": {"type": "int", "low": 0, "high": "cores"},
        "prefetch_factor": {"type": "int", "choices": [2, 4], "when": "num_workers > 0"},
        "persistent_workers": {"type": "bool", "when": "num_workers > 0"},
        "pin_memory": {"type": "bool"}}}, hardware=HW, device="cuda")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/f.db", study_name="f")
    assert ceilings.feed(study, space) is None  # nothing measured: nothing to feed
    data_config = ceiling_runs.loader_config({"batch_size": 64, "num_workers": 0, "pin_memory": False}, space)
    assert data_config["pin_memory"] is True and data_config["persistent_workers"] is True
    ceilings.store(study, Ceilings(model=Point("model", {}, 1000.0),
                                   data=(Point("data", {**data_config, "num_workers": 4}, 1300.0),)))
    assert ceilings.feed(study, space) == {"num_workers": 4, "pin_memory": True, "persistent_workers": True,
                                           "prefetch_factor": 2}
    # a count the space does not offer is rounded up to one it does: [0, 2, 4, 8] has no 3
    sparse = space_from_dict({"name": "s", "device": "cuda", "parameters": {
        "num_workers": {"type": "int", "choices": [0, 2, 4, 8]}}}, hardware=HW, device="cuda")
    ceilings.store(study, _c(1000.0, (1, 400.0), (4, 1600.0)))  # 1150 needed: 3 workers by the line between
    assert ceilings.load(study).workers_to_feed() == 3
    assert ceilings.feed(study, sparse) == {"num_workers": 4}


def _pipeline(model_rate: float, per_worker: float, cores: int):
    """A fake runner: the model alone runs ``model_rate`` (x1.2 with bf16), the data path ``per_worker`` a worker up
    to the cores (0 workers: one core's worth, in the training loop, serialised with the model)."""
    calls: list[tuple[str, TrialConfig]] = []

    def run(workload, c, measure, **kw):
        calls.append((measure.part, c))
        model = model_rate * (1.2 if c.amp == "bf16" else 1.0)
        data = per_worker * min(c.num_workers, cores) if c.num_workers else per_worker
        rate = {"model": model, "data": data}.get(measure.part)
        if rate is None:
            rate = 1 / (1 / model + 1 / data) if c.num_workers == 0 else min(model, data)
        wait = max(0.0, 1 / rate - 1 / model)
        return TrialResult(status="ok", samples_per_s=(0.99 * rate, rate, 1.01 * rate), wall_s=20.0, peak_host_mb=10.0,
                           batch_size=c.batch_size, data_wait_s_per_step=wait * c.batch_size,
                           compute_s_per_step=c.batch_size / model, cpu_cores_used=1.0)

    run.calls = calls
    return run


def _space():
    return space_from_dict({"name": "fake", "device": "cpu", "parameters": {
        "batch_size": {"type": "int", "choices": [32, 64]},
        "num_workers": {"type": "int", "low": 0, "high": "cores"},
        "prefetch_factor": {"type": "int", "choices": [2, 4], "when": "num_workers > 0"},
        "persistent_workers": {"type": "bool", "when": "num_workers > 0"},
        "amp": {"type": "categorical", "choices": ["off", "bf16"]}},
        "baseline": {"batch_size": 64, "num_workers": 0, "amp": "off"}}, hardware=HW)


def test_an_input_bound_baseline_sizes_the_loader_within_the_first_three_trials(tmp_path):
    """The model alone 1000/s (1200 with bf16), a worker 140/s on 8 cores: the baseline waits for data most of its
    step. The tuner measures the model alone, then the data path at counts the space offers, the most, 8, among them
    (8 x 140 = 1120 < 1200: none covers it, and the rise is even to the last core, so 8 is the data path's best;
    which other counts it measures is the climb's to choose, test_climb.py), trial 2 runs 8 workers, and the
    recommendation's YAML says the data path binds."""
    runner = _pipeline(1000.0, 140.0, cores=8)
    logs: list[str] = []
    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16), space=_space(), hardware=HW,
                  measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", progress=False, runner=runner, parity_steps=0,
                  seed=0, finalists=2, finalist_rounds=1, log=logs.append)
    rec = tuner.run(trials=4)
    parts = [(p, c.num_workers) for p, c in runner.calls if p != "full"]
    data = [w for p, w in parts if p == "data"]
    assert parts[0] == ("model", 0) and 8 in data and len(data) == len(set(data)) <= MAX_POINTS, parts
    assert set(data) <= set(range(1, 9)) and len(parts) == 1 + len(data), parts
    assert runner.calls[2][0] == "model"  # measured after the baseline and the likely winners, before trial 2
    trials = sorted(tuner.study().trials, key=lambda t: t.number)
    first3 = [TrialConfig.from_dict(t.user_attrs["config"]) for t in trials[:3]]
    assert [c.num_workers for c in first3] == [0, 0, 8]
    # the fed trials say what they are (`show`), and count as the plan's, not the sampler's (convergence)
    assert [role_of(t.user_attrs) for t in trials[:4]] == ["baseline", "likely winner", "baseline, fed",
                                                        "likely winners, fed"]
    assert any("from here every config runs with the loader the ceilings give (num_workers=8" in m for m in logs)
    doc = yaml.safe_load(rec.to_yaml())
    assert doc["ceilings"]["binds"] == "data" and doc["ceilings"]["workers_to_feed"] == 8
    assert doc["ceilings"]["model"]["samples_per_s"] == pytest.approx(1200.0, rel=0.02)  # the likely winner's
    assert [p["config"]["num_workers"] for p in doc["ceilings"]["data"]] == data  # every point it measured, in order
    assert doc["ceilings"]["verdict"].endswith("input-bound") and doc["ceilings"]["levers"]
    assert doc["ceilings"]["device"] == "cpu" and not any("GPU" in lever for lever in doc["ceilings"]["levers"])
    assert "ceilings: " in rec.summary() and "lever: " in rec.summary()


def test_ddp_ranks_measure_the_ceilings_in_their_ranks_and_climb_each_ranks_workers(tmp_path):
    """With 2 DDP ranks on 8 cores each rank may take 4 workers: the climb measures the parts with the ranks'
    workload (the runner runs them in 2 ranks, as a trial) and offers each rank's workers; the YAML says so."""
    runner = _pipeline(1000.0, 140.0, cores=8)
    logs: list[str] = []
    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16, nproc_per_node=2), space=_space(),
                  hardware=HW, measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", progress=False, runner=runner,
                  parity_steps=0, seed=0, finalists=2, finalist_rounds=1, log=logs.append)
    rec = tuner.run(trials=3)
    parts = [(p, c.num_workers) for p, c in runner.calls if p != "full"]
    data = [w for p, w in parts if p == "data"]
    assert parts[0] == ("model", 0) and len(data) == len(set(data)) and len(parts) == 1 + len(data), parts
    assert max(data) == 4 and min(data) >= 1, parts  # 4: the most a rank's share of 8 cores offers (the rise is even)
    assert any("in 2 DDP ranks at once as the trials run" in m for m in logs)
    doc = yaml.safe_load(rec.to_yaml())
    assert doc["ceilings"]["world_size"] == 2 and doc["ceilings"]["workers_to_feed"] == 4
    assert "worker(s) per rank (2 ranks)" in doc["ceilings"]["verdict"]


def test_a_trial_at_every_core_still_input_bound_is_told_the_levers_beyond_workers(tmp_path):
    """A worker gives 20/s against a model of 1000/s: trial 2 runs all 8 workers and still waits most of its step.
    Its stored diagnosis (what `run` prints, optuna-dashboard shows) does not ask for more workers than the
    space offers."""
    from autotune.search.record import trials as keys

    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16), space=_space(), hardware=HW,
                  measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", progress=False,
                  runner=_pipeline(1000.0, 20.0, cores=8), parity_steps=0, seed=0, finalists=2, finalist_rounds=1,
                  log=lambda m: None)
    tuner.run(trials=3)
    trials = sorted(tuner.study().trials, key=lambda t: t.number)
    base, fed = trials[0].user_attrs[keys.BOTTLENECK], trials[2].user_attrs[keys.BOTTLENECK]
    assert trials[2].user_attrs["config"]["num_workers"] == 8
    assert base.startswith("input-bound") and "more DataLoader workers" in base
    assert fed.startswith("input-bound") and "more DataLoader workers" not in fed, fed
    assert "8 worker(s) is the most the search space offers here" in fed


def test_ceilings_a_budget_skips_are_asked_once_a_run(tmp_path):
    """A 60 s budget: no finalists' reserve (it holds not even the search's first 12 trials of 20 s), and after one
    more 20 s trial the search's share is 40 s, under the climb's least (the model and two data points, ~20 s each):
    skipped, said once, not re-decided after each trial."""
    import optuna

    from autotune.search.budget import Budget
    from autotune.search.record import trials as keys

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s", direction="maximize")
    for role in (keys.BASELINE, keys.LIKELY_WINNER):
        study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs={
            role: True, "config": TrialConfig(batch_size=64).to_dict(), keys.STATUS: "ok", keys.WALL_S: 20.0,
            keys.DATA_WAIT_SHARE: 0.9}))
    logs: list[str] = []
    said: set[str] = set()
    for _ in range(3):
        assert ceiling_runs.measure_if_wanted(study, _space(), runner=None, workload=Workload(), measure=QUICK,
                                              log_dir=None, log=logs.append, budget=Budget.of(60.0), said=said) is None
    assert sum(m.startswith("ceilings not measured") for m in logs) == 1, logs
    assert "does not fit the 40 s the search's share of the budget leaves it after one more trial" in logs[0]
    assert ceilings.load(study).why.startswith("not measured: ~60 s")
    # the baseline is input-bound all the same: the planned search feeds every config a guess, a rank's cores less one
    space = _space()
    guess = max(1, space.rank_cores - 1)
    assert ceilings.load(study).guess == guess and f"the loader gets {guess} worker(s) instead, unmeasured" in logs[0]
    assert ceilings.feed(study, space)["num_workers"] == guess
    from tests.helpers import make_rec

    verdict = ceilings.recorded(study, make_rec()).ceilings["verdict"]
    assert verdict == f"not measured: ~60 s, over the search's share of the budget; the loader got {guess} " \
                      "worker(s) unmeasured (a rank's cores less one)"


def test_ceilings_wait_for_the_retry_of_a_likely_winner_a_killed_run_interrupted(tmp_path):
    """Resumed after a kill during the likely winners' trial: that trial measured nothing, so the ceilings are not
    measured yet (the model's would be the baseline's config); once its retry ran they are."""
    import optuna

    from autotune.search.record import trials as keys

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s", direction="maximize")
    likely = _space().likely_params()
    likely_config = _space().effective(likely).to_dict()
    study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs={
        keys.BASELINE: True, "config": TrialConfig(batch_size=64).to_dict(), keys.STATUS: "ok", keys.WALL_S: 20.0,
        keys.DATA_WAIT_SHARE: 0.9}))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={
        keys.LIKELY_WINNER: True, "config": likely_config, keys.STATUS: "interrupted"}))
    runner = _pipeline(1000.0, 140.0, cores=8)
    kw = dict(runner=runner, workload=Workload(), measure=QUICK, log_dir=None, log=lambda m: None)
    assert ceiling_runs.measure_if_wanted(study, _space(), **kw) is None and not runner.calls
    study.add_trial(optuna.trial.create_trial(value=120.0, user_attrs={
        keys.LIKELY_WINNER: True, keys.RETRY_OF: 1, "config": likely_config, keys.STATUS: "ok", keys.WALL_S: 20.0}))
    c = ceiling_runs.measure_if_wanted(study, _space(), **kw)
    assert c is not None and c.model.config["amp"] == likely_config["amp"] == "bf16"  # the likely winners' config


def test_ceilings_a_short_budget_skipped_are_measured_by_a_later_run_with_time(tmp_path):
    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16), space=_space(), hardware=HW,
                  measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", progress=False,
                  runner=(runner := _pipeline(1000.0, 140.0, cores=8)), parity_steps=0, seed=0, finalists=2,
                  finalist_rounds=1, log=lambda m: None)
    ceilings.store(tuner.study(), Ceilings(model=None, why="not measured: ~400 s, over the budget's share"))
    rec = tuner.run(trials=3)
    parts = [p for p, _ in runner.calls if p != "full"]
    assert parts[0] == "model" and set(parts[1:]) == {"data"} and len(parts) >= ceiling_runs.MIN_CHILDREN, parts
    assert rec.ceilings["model"] is not None and rec.ceilings["workers_to_feed"] == 8


def test_a_config_without_workers_is_input_bound_by_its_loader_in_the_training_process():
    c = _c(1000.0, (1, 300.0), (4, 1300.0))
    line = c.verdict({"num_workers": 0, "batch_size": 64, "amp": "bf16"}, 250.0)
    assert line.endswith("input-bound: with no workers the loader runs in the training process, between the "
                         "model's steps, and the two costs add up"), line
    # another batch or precision than the model ceiling's: its rate is not that ceiling's, and the line says so
    other = c.verdict({"num_workers": 0, "batch_size": 16, "amp": "off"}, 250.0)
    assert "input-bound" not in other and "the config differs from the ceilings'" in other


def test_a_compute_bound_cpu_baseline_measures_no_ceilings(tmp_path):
    runner = _pipeline(100.0, 5000.0, cores=8)  # the data path 50x the model: the baseline barely waits
    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16), space=_space(), hardware=HW,
                  measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", progress=False, runner=runner, parity_steps=0,
                  seed=0, finalists=2, finalist_rounds=1, log=lambda m: None)
    rec = tuner.run(trials=3)
    assert all(p == "full" for p, _ in runner.calls)
    assert rec.ceilings is None and ceilings.load(tuner.study()) is None


def test_a_ceiling_child_that_fails_for_the_workload_stops_the_run_with_its_message(tmp_path):
    """The baseline ran without workers; the data path with one worker fails in the workload's code (as a dataset
    that cannot cross to a worker process does): one line naming the data path, nothing retried."""
    from autotune.errors import WorkloadError

    base = _pipeline(1000.0, 140.0, cores=8)

    def runner(workload, c, measure, **kw):
        if measure.part == "data":
            base.calls.append((measure.part, c))
            return TrialResult(status="error", user_error=True, reason="WorkloadError: the data path alone (the "
                               "workload's DataLoader, 1 worker(s), no model) failed: PicklingError: can't pickle")
        return base(workload, c, measure, **kw)

    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16), space=_space(), hardware=HW,
                  measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", progress=False, runner=runner, parity_steps=0,
                  seed=0, finalists=2, finalist_rounds=1, log=lambda m: None)
    with pytest.raises(WorkloadError, match=r"^the data path alone .* failed: PicklingError: can't pickle$"):
        tuner.run(trials=4)
    assert [p for p, _ in base.calls].count("data") == 1  # not retried


@pytest.mark.slow
def test_a_workload_bound_by_its_data_path_gets_its_loader_sized_and_show_report_and_yaml_agree(tmp_path):
    """The real mechanism on the CPU: a model of a few hundred parameters over JPEGs decoded by PIL (the data path is
    nearly all of a step), `autotune run` with real children: the ceilings are measured after the baseline and the
    likely winners, a trial among the first three has workers, and the recommendation names the binding ceiling
    in the YAML, `show` and the HTML report alike."""
    import optuna

    from tests.helpers import run_cli

    db = f"sqlite:///{tmp_path}/heavy.db"
    common = ["--storage", db]
    run = run_cli("run", "--model", "tests.heavy_data_workloads:build", "--image-size", "32", "--trials", "4",
                  "--windows", "3", "--window-seconds", "0.5", "--parity-steps", "0", "--no-progress", *common,
                  timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    said = run.stdout + run.stderr
    assert "measuring the two ceilings" in said and "  ceilings: " in said  # the log, then run's closing lines
    out = tmp_path / "best.yaml"
    assert run_cli("export", "--format", "yaml", "-o", str(out), *common).returncode == 0
    doc = yaml.safe_load(out.read_text())
    verdict = doc["ceilings"]["verdict"]
    assert doc["ceilings"]["model"]["samples_per_s"] > 0 and doc["ceilings"]["data"]
    assert verdict.endswith(("input-bound", "model-bound", "neither ceiling is reached (the two share the cores, "
                             "or the config differs from the ceilings')"))
    (name,) = optuna.get_all_study_names(db)
    trials = sorted(optuna.load_study(study_name=name, storage=db).trials, key=lambda t: t.number)
    assert any(t.user_attrs["config"]["num_workers"] > 0 for t in trials[:3])
    show = run_cli("show", "--explain", *common)
    assert show.returncode == 0 and f"ceilings: {verdict}" in show.stdout and "data path w=" in show.stdout
    html = tmp_path / "r.html"
    report = run_cli("report", "-o", str(html), "--no-profile", *common, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    page = html.read_text()
    assert 'id="plot-ceilings"' in page
    from html import escape

    assert escape(verdict) in page


@pytest.mark.slow  # ~25 s: a real run to its first failing workers
def test_a_data_path_that_fails_only_with_workers_stops_the_run_in_one_line(tmp_path):
    """The real CLI: a dataset that loads in the training process and fails in any worker (the baseline and the
    likely winners run without workers, the data path's ceiling with one): one line naming the data path with the
    workload's own message, exit 2, no traceback."""
    from tests.helpers import run_cli

    out = run_cli("run", "--model", "tests.heavy_data_workloads:fails_in_a_worker", "--image-size", "32",
                  "--trials", "4", "--windows", "2", "--window-seconds", "0.3", "--parity-steps", "0", "--no-progress",
                  "--storage", f"sqlite:///{tmp_path}/w.db", timeout=300)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert last == ("autotune run: error: the data path alone (the workload's DataLoader, 1 worker(s), no model) "
                    "failed: RuntimeError: the image store is not reachable from a worker process"), last


class _SimClock:
    """``time.monotonic`` for a budget test: each child's wall advances it; the real clock's time adds a tenth."""

    def __init__(self) -> None:
        import time

        self.real = time.monotonic
        self.t0 = self.real()
        self.offset = 0.0

    def __call__(self) -> float:
        return self.t0 + 0.1 * (self.real() - self.t0) + self.offset


def _gpu_host(clock: _SimClock, *, cores: int = 16, knee: int = 5):
    """A fake runner of a GPU host whose data path peaks at ``knee`` workers (memory bandwidth) and then loses 4%
    a worker: the likely winners' guess (a rank's cores less one) is wrong. The model alone runs 8000/s (10000 with
    bf16); a trial's child takes 12 s on the simulated clock, a ceiling's point 6 s. Keeps (part, workers, start,
    end) of each child."""
    calls: list[tuple[str, int, float, float]] = []

    def data(w: int) -> float:
        return 330.0 * min(w, knee) / (1 + 0.04 * max(0, w - knee)) if w else 400.0

    def run(workload, c, measure, **kw):
        start = clock()
        model = 10000.0 if c.amp == "bf16" else 8000.0
        rate = {"model": model, "data": data(c.num_workers)}.get(measure.part)
        if rate is None:
            rate = 1 / (1 / model + 1 / data(0)) if c.num_workers == 0 else min(model, data(c.num_workers))
        clock.offset += 12.0 if measure.part == "full" else 6.0
        calls.append((measure.part, c.num_workers, start, clock()))
        wait = max(0.0, 1 / rate - 1 / model)
        return TrialResult(status="ok", samples_per_s=(0.99 * rate, rate, 1.01 * rate), wall_s=clock() - start,
                           peak_host_mb=10.0, batch_size=c.batch_size, data_wait_s_per_step=wait * c.batch_size,
                           compute_s_per_step=c.batch_size / model, cpu_cores_used=1.0 + c.num_workers,
                           peak_device_mb=100.0, peak_device_allocated_mb=80.0)

    run.calls = calls
    return run


def _gpu_space(cores: int):
    from tests.helpers import fake_hw

    gpu = {"index": 0, "name": "NVIDIA H200 (fake)", "compute_capability": "9.0", "memory_total_mb": 143771.0,
           "memory_free_mb": 143000.0, "driver": "580.159.04", "uuid": "GPU-fake", "pci_bus_id": "0000:01:00.0"}
    hw = dataclasses.replace(fake_hw(cores, gpus=(gpu,)), cuda="13.0", torch="2.11.0+cu130")
    return hw, space_from_dict({"name": "g", "device": "cuda", "parameters": {
        "batch_size": {"type": "int", "choices": [64, 128]},
        "num_workers": {"type": "int", "low": 0, "high": "cores"},
        "prefetch_factor": {"type": "int", "choices": [2, 4], "when": "num_workers > 0"},
        "persistent_workers": {"type": "bool", "when": "num_workers > 0"},
        "pin_memory": {"type": "bool"},
        "amp": {"type": "categorical", "choices": ["off", "bf16"]},
        "intra_op_threads": {"type": "int", "low": 1, "high": "cores"}},
        "baseline": {"batch_size": 64, "num_workers": 0, "amp": "off", "pin_memory": False}}, hardware=hw,
        device="cuda")


@pytest.mark.parametrize("budget_s, cut", [(95.0, True), (180.0, False), (600.0, False)])
def test_the_climb_is_priced_inside_the_search_share_and_stops_where_its_next_point_would_not_fit(
        budget_s, cut, tmp_path, monkeypatch):
    """64 cores, a data path that peaks at 21 workers: the climb wants 5 or more data points of 6 s. With 95 s
    (trials 0 and 1 took 30 s; no finalists' reserve: the budget holds not even the search's first 12 trials; the
    confirmation's two rounds of 30 s do not fit 35%) the search's share after one more trial holds fewer: the
    climb stops before its next point would end past it, says so, and keeps what it measured. With 3 minutes (the
    confirmation's two rounds, 60 s, kept back; the finalists' share none, for the same 12 trials) and with 10 it
    finishes. Either way the count it gives the search is one it measured, with no more threads than its workers
    leave."""
    import time

    import optuna

    from autotune.search.budget import Budget, long_trial_s
    from autotune.search.record import trials as keys

    clock = _SimClock()
    monkeypatch.setattr(time, "monotonic", clock)
    hw, space = _gpu_space(64)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s", direction="maximize")
    likely = space.effective(space.likely_params()).to_dict()
    for role, config, value in ((keys.BASELINE, space.baseline_config().to_dict(), 380.0),
                                (keys.LIKELY_WINNER, likely, 5000.0)):
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            role: True, keys.CONFIG: config, keys.STATUS: "ok", keys.WALL_S: 15.0, keys.DATA_WAIT_SHARE: 0.9}))
    budget = Budget.of(budget_s, started=clock() - 30.0, measure=QUICK, finalists=3, rounds=2)
    runner = _gpu_host(clock, cores=64, knee=21)
    logs: list[str] = []
    c = ceiling_runs.measure_if_wanted(study, space, runner=runner, workload=Workload(device="cuda"), measure=QUICK,
                                       log_dir=None, log=logs.append, budget=budget, check_s=lambda: 0.0)
    assert c is not None and c.model is not None, logs
    end = runner.calls[-1][3]
    walls = [15.0, 15.0]
    assert budget.deadline - end - budget.search_reserve_s(walls) >= long_trial_s(walls)  # a fed trial still fits
    assert any("ended the climb" in n for n in c.notes) == cut, c.notes
    measured = [p.workers for p in c.measured()]
    assert len(measured) >= 2 and ceilings.feed(study, space)["num_workers"] in measured, (measured, c.notes)
    assert all(p.config["intra_op_threads"] + p.workers <= 64 for p in c.data)
    assert max(measured) <= 63  # on a GPU the climb leaves the training process its core


@pytest.mark.slow  # a whole 3-minute run on a simulated clock: ~10 s of CPU, more on a loaded VM
def test_the_climb_fits_the_search_share_of_a_3_minute_budget_and_measures_the_count_it_gives(tmp_path, monkeypatch):
    """Issue 42: on a 16-core GPU host whose data path peaks at 5 workers, a 3-minute budget. The climb runs after
    trials 0 and 1, priced inside the search's share (``Budget.search_left_s``): it ends while that share still
    holds one more trial, its time is not trial 1's (a fed trial runs after it), the count it gives the search is
    one of its measured points, the fed trials run it, and the recommendation's YAML keeps the climb."""
    import time

    from autotune.machine.envstamp import collect_env_stamp
    from autotune.search.budget import long_trial_s
    from autotune.search.record import trials as keys

    collect_env_stamp()  # the stamp the recommendation keeps (a child importing torch): cached, before the clock
    clock = _SimClock()
    monkeypatch.setattr(time, "monotonic", clock)
    hw, space = _gpu_space(16)
    runner = _gpu_host(clock)
    logs: list[str] = []
    tuner = Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=16, device="cuda"), space=space,
                  hardware=hw, measure=MeasureSpec(windows=3, window_s=1.0, memory_cap_mb=4096.0), parity_steps=0,
                  storage=f"sqlite:///{tmp_path}/t.db", progress=False, runner=runner, seed=0, log=logs.append)
    rec = tuner.run(timeout_s=180.0)
    parts = [c for c in runner.calls if c[0] != "full"]
    full = [c for c in runner.calls if c[0] == "full"]
    assert parts and parts[0][0] == "model" and full[1][3] <= parts[0][2]  # after trials 0 and 1
    # inside the search's share: when the climb ended, the search's time left still held one more trial
    budget, walls = tuner.budget, [full[0][3] - full[0][2], full[1][3] - full[1][2]]
    climb_end = parts[-1][3]
    assert budget.deadline - climb_end - budget.search_reserve_s(walls) >= long_trial_s(walls), logs
    # the count the ceilings give is a measured point, and the search ran it end to end after the climb
    doc = yaml.safe_load(rec.to_yaml())
    measured = [p["config"]["num_workers"] for p in doc["ceilings"]["data"]]
    feed = doc["ceilings"]["workers_to_feed"]
    assert feed in measured and 4 <= feed <= 6, (measured, feed)
    fed = [c for c in full if c[2] >= climb_end and c[1] == feed]
    assert fed and fed[0][3] <= budget.deadline - budget.search_reserve_s(walls), full
    assert rec.config.num_workers == feed
    # the threads of a point are those its workers leave (never more threads than cores): the fed configs' own
    for p in doc["ceilings"]["data"]:
        assert (p["config"]["intra_op_threads"] or 0) + p["config"]["num_workers"] <= 16, p["config"]
    trials = sorted(tuner.study().trials, key=lambda t: t.number)
    assert trials[1].user_attrs[keys.CONFIG]["prefetch_factor"] == 2  # the likely winners' prefetch: set, not sampled
    # the run ends by its budget, plus 5%, plus the tenth of the VM's real time the clock counts (its pace is the VM's)
    assert clock() - budget.started <= 180.0 * 1.05 + 0.1 * (clock.real() - clock.t0), clock() - budget.started


def test_the_climbs_count_survives_into_the_yaml_when_the_budget_cut_the_trials_that_would_run_it(tmp_path):
    """The climb measured 5 workers as the data path's best, then the budget ended before a fed trial ran them: the
    recommendation (trial 1's guess, 15 workers) keeps the climb in its YAML and says which count to try. Once a
    trial ran 5 workers end to end (and lost), it says nothing more."""
    import optuna

    from autotune.search.record import trials as keys
    from tests.helpers import make_rec

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s", direction="maximize")
    guess = TrialConfig(batch_size=64, num_workers=15, pin_memory=True, persistent_workers=True, prefetch_factor=2)
    for config in (TrialConfig(batch_size=64), guess):
        study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs={keys.CONFIG: config.to_dict(),
                                                                             keys.STATUS: "ok"}))
    ceilings.store(study, _c(10000.0, (1, 330.0), (15, 1100.0), (8, 1400.0), (5, 1450.0)))
    rec = ceilings.recorded(study, make_rec(config=guess))
    doc = yaml.safe_load(rec.to_yaml())
    assert doc["ceilings"]["workers_to_feed"] == 5 and [p["config"]["num_workers"] for p in doc["ceilings"]["data"]] \
        == [1, 15, 8, 5]
    assert "try num_workers=5" in doc["ceilings"]["untried"] and doc["ceilings"]["untried"] in doc["notes"]
    study.add_trial(optuna.trial.create_trial(value=90.0, user_attrs={
        keys.CONFIG: guess.replace(num_workers=5).to_dict(), keys.STATUS: "ok"}))
    again = ceilings.recorded(study, make_rec(config=guess))
    assert "untried" not in again.ceilings and not any("try num_workers" in n for n in again.notes)


def test_on_a_gpu_likely_winners_their_loader_already_feeds_skip_the_climb(tmp_path):
    """A model-bound GPU path: trial 1's loader (a rank's cores less one) waited for data 2% of its step. The climb
    could only find fewer workers for the same rate: it is not run, the search's time goes to the model's knobs,
    and the feed is that loader, measured end to end by trial 1 (not called unmeasured)."""
    import optuna

    from autotune.search.record import trials as keys
    from tests.helpers import make_rec

    hw, space = _gpu_space(16)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s", direction="maximize")
    likely = space.effective(space.likely_params()).to_dict()
    for role, config, wait in ((keys.BASELINE, space.baseline_config().to_dict(), 0.4), (keys.LIKELY_WINNER, likely,
                                                                                         0.02)):
        study.add_trial(optuna.trial.create_trial(value=1000.0, user_attrs={
            role: True, keys.CONFIG: config, keys.STATUS: "ok", keys.WALL_S: 15.0, keys.DATA_WAIT_SHARE: wait}))
    logs: list[str] = []
    runner = _pipeline(1000.0, 3000.0, cores=16)
    assert ceiling_runs.measure_if_wanted(study, space, runner=runner, workload=Workload(device="cuda"),
                                          measure=QUICK, log_dir=None, log=logs.append) is None
    assert not runner.calls and "already feeds the model" in logs[0]
    assert ceilings.feed(study, space)["num_workers"] == likely["num_workers"] == 15
    verdict = ceilings.recorded(study, make_rec()).ceilings["verdict"]
    assert verdict.startswith("not measured: the likely winners' 15 worker(s) fed the model") and "unmeasured" \
        not in verdict


def test_on_a_peak_the_climb_measures_and_gives_the_centre_of_the_points_within_the_noise_not_the_noisy_fastest():
    """A data path that peaks at 23 workers (memory bandwidth: gpu_host_sim's membw64 shape) with the point at 32
    measured 10% high, as a process's own level does (5% sigma on the H200): where the climb measures 32 (today's
    does), it is the fastest point measured, though 32 runs under 0.97 of the best. The climb gives a count it
    measured on the top (within ``PLATEAU`` of the fastest), not at either end where the top has points between
    them, and it runs within 1% of the best. (Which counts it measures on the way is the climb's to choose: the
    properties over random curves are in test_climb.py.)"""
    def true(w: int) -> float:
        rise, bandwidth = 330.0 * w / (1 + 0.02 * w), 21 * 330.0 / 1.42
        return (rise ** -4 + bandwidth ** -4) ** -0.25 / (1 + 0.0125 * max(0, w - 21))

    best = max(true(w) for w in range(1, 64))
    asked: list[tuple[str, int]] = []
    c = climb({}, {}, list(range(1, 64)),
              _runner(asked, lambda part, w: 9000.0 if part == "model" else true(w) * (1.10 if w == 32 else 1.0)))
    assert true(32) / best < 0.97
    top = ceilings.plateau(c.measured())
    feed = c.workers_to_feed()
    assert feed in [p.workers for p in top] and (len(top) < 3 or top[0].workers < feed < top[-1].workers), (asked, feed)
    assert true(feed) / best > 0.99 and len(asked) - 1 <= MAX_POINTS
    # flat to the most workers measured (no fall): the fastest, the fewest among equals, as before
    flat = _c(9000.0, (1, 300.0), (3, 650.0), (20, 650.0), (64, 650.0))
    assert flat.workers_to_feed() == 3


def test_a_climb_the_budget_cut_before_the_centre_of_a_wide_top_gives_that_centre_not_either_noisy_end(tmp_path):
    """Hand-made points on a data path that peaks (membw64's shape): 1, 16, 22, 36 and 63 workers measured, 22 and 36
    within the noise of each other, and the budget ended the climb before the count it was about to measure, 29
    (``Ceilings.cut``). The rate is unimodal, so the count between them runs at least as fast as the slower end: the
    ceilings give 29, say it was not measured alone, and the feed gives the fed trials (which measure it end to end)
    that count with the loader knobs and threads both ends ran with. Only a cut climb does this: the same points
    measured to the end (a climb that chose to stop) give the measured point nearest the centre. (That a cut climb
    keeps the count it would have measured next is held over random curves in test_climb.py.)"""
    import optuna

    from autotune.search.record import trials as keys
    from tests.helpers import make_rec

    loader = {"pin_memory": True, "intra_op_threads": 1}
    c = Ceilings(model=Point("model", {}, 10000.0), cut=29, notes=(
        "the budget's share of the search ended the climb after 5 data point(s) (next: 29 workers)",),
        data=tuple(Point("data", {**loader, "num_workers": w}, r)
                   for w, r in ((1, 340.0), (36, 4100.0), (63, 2800.0), (16, 3570.0), (22, 4090.0))))
    best = c.best_data()
    assert c.workers_to_feed() == 29 and "unmeasured alone" in best.reason and 4090.0 < best.samples_per_s < 4100.0
    # what the study keeps reads back the same, and every place a person reads says it was not measured alone
    again = Ceilings.from_dict(c.to_dict())
    assert again.workers_to_feed() == 29 and "between 22 and 36 workers on the top" in " ".join(again.lines())
    assert "29 worker(s): unmeasured alone" in " ".join(ceilings.ceiling_lines(c.to_dict()))
    assert "29 worker(s) per rank (2 ranks): unmeasured" in " ".join(ceilings.ceiling_lines({**c.to_dict(),
                                                                                           "world_size": 2}))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s", direction="maximize")
    ceilings.store(study, c)
    assert ceilings.feed(study, _gpu_space(64)[1]) == {"num_workers": 29, "pin_memory": True, "intra_op_threads": 1}
    trial1 = TrialConfig(batch_size=64, num_workers=63, pin_memory=True, persistent_workers=True, prefetch_factor=2)
    study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs={keys.CONFIG: trial1.to_dict(),
                                                                         keys.STATUS: "ok"}))
    untried = ceilings.recorded(study, make_rec(config=trial1)).ceilings["untried"]
    assert untried.startswith("the ceilings gave 29 worker(s) (unmeasured alone") and "try num_workers=29" in untried
    # the same points, the climb not cut: the measured point nearest the centre, the faster of two as near
    whole = dataclasses.replace(c, cut=None)
    assert whole.workers_to_feed() == 36 and not whole.unmeasured()
    # cut at a count outside the top, or at one that failed: the measured pick
    assert dataclasses.replace(c, cut=45).workers_to_feed() == 36
    failed = Point("data", {"num_workers": 29}, 0.0, status="oom")
    assert dataclasses.replace(c, data=c.data + (failed,)).workers_to_feed() == 36
    # measured near the centre: that point
    near = dataclasses.replace(c, data=c.data + (Point("data", {"num_workers": 28}, 3900.0),))
    assert near.workers_to_feed() == 28 and not near.unmeasured()
