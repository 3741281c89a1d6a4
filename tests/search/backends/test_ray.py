"""The Ray backend end to end: a real local Ray (this machine's cores), Ray Tune + OptunaSearch, the real CLI."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.machine.hardware import detect
from autotune.trial.forkserver import ENV_SWITCH
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
    # Tune reused an actor for the next trial (reuse_actors, the actor's reset_config; a shortcut trial between two
    # would take a fresh one: other resources), and the actor's fork server served the trials it ran: the same
    # server pid in the last result of each measured trial of one actor (Tune's own ``pid``)
    root = Path(re.search(r"Tune's files in (\S+)", out.stderr).group(1))
    last = [json.loads(f.read_text().splitlines()[-1]) for f in root.glob("*/trial-*/result.json")]
    by_actor: dict[int, list[set]] = {}
    for r in last:
        if r.get("fork_servers") is not None:  # measured (not a shortcut, not pruned)
            by_actor.setdefault(r["pid"], []).append(set(r["fork_servers"]))
    if os.environ.get(ENV_SWITCH) != "0":  # fork servers on (the default)
        assert max(map(len, by_actor.values()), default=0) >= 2, last
        for pid, servers in by_actor.items():
            assert set.intersection(*servers), (pid, servers)

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
    """Trial children of this test (working in, or writing to, a folder under ``root``; their DataLoader workers
    too) still alive; others' tests may run too. A fork server is no trial: it runs no trial code."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or ())
            if "autotune.trial.worker" not in line or p.status() == psutil.STATUS_ZOMBIE:
                continue
            parent = p.parent()
            if "worker_forkserver" in line and "worker_forkserver" not in " ".join(parent.cmdline() if parent else ()):
                continue  # the server itself (a trial it forked has its command line, and it as parent)
            if p.cwd().startswith(str(root)) or any(f.path.startswith(str(root)) for f in p.open_files()):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def _forked_here() -> set[int]:
    """The live children of this process's fork servers: its forked trial children (and their workers)."""
    import psutil

    out = set()
    for server in psutil.Process().children():
        try:
            if "worker_forkserver" in " ".join(server.cmdline()):
                out |= {c.pid for c in server.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE}
        except psutil.Error:
            pass
    return out


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


@pytest.mark.slow  # a fork server's torch import and two trials: ~15 s
def test_a_kept_actor_ends_a_stopped_trial_at_once_and_its_fork_server_serves_the_next(tmp_path):
    """The actor as Tune drives it with reuse_actors: a trial measuring, the scheduler's STOP (``end_trial``: Tune
    calls nothing else on an actor it keeps), the next trial (``reset_config``), the run's end (``cleanup``). The
    stopped trial's child (forked by the actor's fork server: a grandchild) dies at once; the server lives on and
    forks the next trial's child."""
    import psutil
    from ray import tune

    from autotune.config import MeasureSpec, TrialConfig, Workload
    from autotune.search.backends.ray.actor import METRIC, make_trainable
    from autotune.search.backends.ray.cluster import PLAN_KEY

    class Here(make_trainable(tune)):
        def node_cap(self, device, cap_mb):  # the node query needs a Ray worker; all else runs as in one
            return "here", cap_mb

    actor = Here.__new__(Here)  # Tune's own set-up of an actor (logdir, storage) is Tune's; autotune's part runs
    actor._logdir = str(tmp_path)
    endless = MeasureSpec(windows=5, window_s=30.0, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=300)

    def plan(number: int) -> dict:
        return {PLAN_KEY: {"config": TrialConfig(batch_size=2).to_dict(), "number": number}}

    def measuring(before: set[int]) -> psutil.Process:
        """The trial's child, forked since ``before``, running (in its first 30-second window or before it: a stop
        that waited for a window's end would take that long)."""
        assert actor.step()[METRIC] == 0.0  # started: the node and the cap
        deadline = time.monotonic() + 120
        while not (_forked_here() - before) and time.monotonic() < deadline:
            time.sleep(0.1)
        (child,) = _forked_here() - before
        time.sleep(1.0)  # past its start: a session of its own
        return psutil.Process(child)

    before = _forked_here()
    actor.setup(plan(1), workload=Workload(model="tests.study_fixtures:sleepy", image_size=16).to_dict(),
                measure=endless.to_dict())
    first = measuring(before)
    server = first.ppid()
    assert "worker_forkserver" in " ".join(psutil.Process(server).cmdline())
    t0 = time.monotonic()
    actor.end_trial()  # pruned
    assert time.monotonic() - t0 < 10, "the stopped trial did not end at once"
    assert not first.is_running() or first.status() == psutil.STATUS_ZOMBIE
    assert psutil.Process(server).is_running()
    before = _forked_here()
    assert actor.reset_config(plan(2)) is True
    second = measuring(before)
    assert second.ppid() == server  # the same server: torch was not imported again
    actor.cleanup()
    assert not second.is_running() or second.status() == psutil.STATUS_ZOMBIE
