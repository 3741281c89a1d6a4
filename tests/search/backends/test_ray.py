"""The Ray backend end to end: a real local Ray (this machine's cores), Ray Tune + OptunaSearch, the real CLI."""

from __future__ import annotations

import math

import optuna
import pytest
import yaml

from autotune.machine.hardware import detect
from autotune.search.plan.pruning import NoHopePruner

from tests.helpers import TINY, assert_queued_are_walk_steps_or_reruns, run_cli

pytest.importorskip("ray.tune", reason='the Ray backend needs Ray Tune: pip install "ray[tune]"')

SPACE = {"name": "tiny", "device": "cpu",
         "parameters": {"batch_size": {"type": "int", "choices": [8, 16, 32]}, "channels_last": {"type": "bool"}},
         "baseline": {"batch_size": 8, "channels_last": False}}


# slow: Ray's start-up is ~30 s; by default the backend seam runs for real with the local backend (test_backends),
# Ray's resource arithmetic in test_backends
@pytest.mark.slow
def test_ray_backend_runs_a_study_into_the_same_storage(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    storage = f"sqlite:///{tmp_path}/ray.db"
    out = run_cli("run", "--backend", "ray", "--model", TINY, "--image-size", "16", "--device", "cpu",
                  "--space", str(space), "--storage", storage, "--windows", "2", "--window-seconds", "0.2",
                  "--finalists", "1", "--rounds", "1", "--trials", "3", "--no-progress", timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    cores = detect(with_torch=False).usable_cores
    assert f"{cores:g} CPU per trial, up to 1 at once" in out.stderr  # a whole node per trial
    assert "recommended:" in out.stdout

    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    queued = [t for t in study.trials if t.state.name == "WAITING"]
    assert_queued_are_walk_steps_or_reruns(study.trials)
    trials = [t for t in study.trials if t.state.name != "WAITING"]
    assert [t.number for t in trials] == [0, 1, 2]
    # then the batch walk up from the best so far, unless trial 1 came out within noise of the baseline and the
    # planned search measures one of them again first (a noise decision: it failed once on a loaded machine)
    ua = trials[2].user_attrs
    assert trials[1].user_attrs["likely_winner"] and (ua.get("batch_line") == 1 or ua.get("repeat_of") is not None
                                                      or ua.get("requeue_of") is not None), ua
    assert trials[0].user_attrs["baseline"] is True and trials[0].user_attrs["status"] == "ok"
    for t in trials:  # recorded like a local trial: state, status, figures, constraint, config, fingerprint
        assert t.state.name in ("COMPLETE", "PRUNED"), (t.number, t.state.name, t.user_attrs)
        assert t.user_attrs["fingerprint"] == study.user_attrs["fingerprint"]
        assert t.user_attrs["config"]["batch_size"] in (8, 16, 32)
        if t.user_attrs["status"] == "ok":
            assert t.value > 0 and t.constraints["memory"] <= 0 and t.user_attrs["samples_per_s"]
    assert study.user_attrs["recommendation"]["config"]["batch_size"] in (8, 16, 32)

    shown = run_cli("show", "--storage", storage, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-1500:]
    lines = shown.stdout.splitlines()
    assert f"{3 + len(queued)} trials" in lines[0]  # queued ones are listed too, as "queued"
    assert sum(1 for line in lines[2:] if line.split()[0].isdigit()) == 3 + len(queued)
    assert sum(1 for line in lines[2:] if " queued " in f" {line} ") == len(queued)


@pytest.mark.slow
def test_ray_prunes_through_the_scheduler_and_kills_the_trial_child(tmp_path):
    from autotune import MeasureSpec, Workload
    from autotune.search.space.search_space import space_from_dict
    from autotune.search.tuner import Tuner

    hw = detect()
    space = space_from_dict({"name": "tiny", "device": "cpu",
                             "parameters": {"batch_size": {"type": "int", "choices": [2, 64]}},
                             "baseline": {"batch_size": 64}}, hardware=hw)
    # a 20 ms sleep's windows spread widely on a loaded machine, which the default pruner takes as no evidence;
    # this test is about the scheduler's kill, so its pruner decides on any windows
    tuner = Tuner(Workload(model="tests.study_fixtures:sleepy", image_size=16), space=space, hardware=hw,
                  measure=MeasureSpec(windows=5, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0),
                  storage=f"sqlite:///{tmp_path}/p.db", progress=False, log=lambda m: None, finalists=1,
                  finalist_rounds=1, seed=0, pruner=NoHopePruner(noisy_rel_iqr=math.inf))
    tuner.run(trials=1, backend="ray")
    study = tuner.study()
    study.enqueue_trial({"batch_size": 2})  # 32x slower per sample than the baseline
    tuner.run(trials=1, backend="ray")
    slow = study.trials[1]
    assert slow.state.name == "PRUNED" and slow.user_attrs["status"] == "pruned"
    assert 2 <= len(slow.intermediate_values) < 5
    assert not _trial_children_writing_under(tmp_path), "a pruned trial's child outlived its Ray actor"


def _trial_children_writing_under(root) -> list[int]:
    """Trial children (of this test: their log is under ``root``) still alive; others' tests may run too."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "autotune.trial.worker" in " ".join(p.info["cmdline"] or ()) and any(
                    f.path.startswith(str(root)) for f in p.open_files()):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_without_an_address_a_run_starts_a_ray_of_its_own_beside_one_already_running():
    """Another Ray is up on this machine, started as ``ray start --head`` does (``ray.cluster_utils.Cluster``: it
    records its address as the latest in /tmp/ray, which ``ray.init()`` with no address joins, and then refuses
    ``num_cpus``: "When connecting to an existing cluster, num_cpus and num_gpus must not be provided"). Without
    --address the run starts a Ray of its own instead, on its own cores; the other is left running."""
    import os
    import subprocess
    import sys

    hold = ("import sys; from ray.cluster_utils import Cluster; "
            "c = Cluster(initialize_head=True, head_node_args={'num_cpus': 1}); print(c.address, flush=True); "
            "sys.stdin.read(); c.shutdown()")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    other = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        theirs = other.stdout.readline().strip()
        assert theirs and other.poll() is None
        mine = subprocess.run(
            [sys.executable, "-c", "import ray; from autotune.search.backends.ray.cluster import connect; "
             "print(connect(ray, None, 2)); print(ray.get_runtime_context().gcs_address); "
             "print(ray.cluster_resources().get('CPU')); ray.shutdown()"],
            capture_output=True, text=True, timeout=300, env=env)
        assert mine.returncode == 0, mine.stderr[-2000:]
        started, address, cpus = mine.stdout.split()[-3:]
        assert started == "True" and address != theirs and float(cpus) == 2.0, mine.stdout
        assert other.poll() is None  # theirs is still up
    finally:
        other.communicate("", timeout=120)


def test_connect_starts_its_own_ray_unless_given_an_address(monkeypatch):
    """The arguments ``connect`` gives ``ray.init`` (a recorder in Ray's place; the slow test above runs the real
    one): no address and no RAY_ADDRESS, or ``local``: a Ray of the run's own on its usable cores (``address=
    "local"``: never the latest Ray another run or user started); RAY_ADDRESS or --address: that cluster, with no
    core count (Ray refuses one when joining)."""
    from autotune.search.backends.ray.cluster import connect

    class Recorder:
        def __init__(self):
            self.calls = []

        def is_initialized(self):
            return False

        def init(self, **kw):
            self.calls.append({k: v for k, v in kw.items() if k in ("address", "num_cpus")})

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    seen = []
    for address, env in ((None, None), ("local", None), (None, "10.0.0.5:6379"), ("auto", "10.0.0.5:6379")):
        if env:
            monkeypatch.setenv("RAY_ADDRESS", env)
        ray = Recorder()
        assert connect(ray, address, 3) is True
        seen += ray.calls
    assert seen == [{"address": "local", "num_cpus": 3}, {"address": "local", "num_cpus": 3},
                    {"address": "10.0.0.5:6379"}, {"address": "auto"}]
