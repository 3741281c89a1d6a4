"""The Ray backend on a real two-node Ray cluster made on this machine (``ray.cluster_utils.Cluster``: a head and a
worker node, each its own raylet with one CPU and its own declared memory), driven by the real CLI.

Each node stands for a one-core machine: its processes (raylet, Tune's actors, the trial children) are pinned to a
core of their own, so its trials share no core with the other node's and ``detect()`` on it sees one core; and it
has its own measuring lock (``$AUTOTUNE_MACHINE_LOCK``: the lock is per machine, and two nodes sharing one would
refuse each other's trials). The CLI sees both cores, a machine unlike the nodes: so the study is the nodes'
and the finalists run on one node (``cluster.remote_runner``), as from a laptop driving a cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import optuna
import pytest
import yaml

from tests.helpers import REPO_ROOT, assert_queued_are_walk_steps_or_reruns

pytest.importorskip("ray.tune", reason='the Ray backend needs Ray Tune: pip install "ray[tune]"')

MODEL = "tests.workloads_fixtures:tiny_on_test_nodes"
# Ten configs, five trials: the worker's second trial must be a config to measure. When the head holds the
# baseline (waiting for that second trial), the planned search waits for it too and the sampler proposes; a
# proposal is only answered without running (so no trial for the worker) if it is one of the two configs known or
# running, so three proposals all missing is about 1 in 125 (a 6-config space and 4 trials failed 1 run in 5).
SPACE = {"name": "tiny", "device": "cpu", "baseline": {"batch_size": 8, "channels_last": False},
         "parameters": {"batch_size": {"type": "int", "choices": [4, 8, 16, 32, 64]},
                        "channels_last": {"type": "bool"}}}
# the CLI and every node's processes import this checkout's tests (the workload) and autotune
PATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
HEAD_MB, WORKER_MB = 3072, 2048  # each node's declared `memory`: below 85% of this machine's, so it is the cap


@pytest.fixture
def two_nodes(tmp_path):
    """(cluster, worker node, worker's runs folder): head on the first core, worker on the second; shut down after."""
    from ray.cluster_utils import Cluster

    head_runs, worker_runs = tmp_path / "head-runs", tmp_path / "worker-runs"
    head_runs.mkdir()
    worker_runs.mkdir()
    cores = sorted(os.sched_getaffinity(0))
    cluster = None
    try:
        os.sched_setaffinity(0, {cores[0]})  # a node's processes inherit the core it starts on
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "memory": HEAD_MB * 2**20, "include_dashboard": False,
            "env_vars": {**PATH, "AUTOTUNE_MACHINE_LOCK": str(tmp_path / "head.lock"),
                         "AUTOTUNE_TEST_RUNS_DIR": str(head_runs), "AUTOTUNE_TEST_FIRST_WAITS_FOR": str(worker_runs)}})
        os.sched_setaffinity(0, {cores[1]})
        worker = cluster.add_node(num_cpus=1, memory=WORKER_MB * 2**20, env_vars={
            **PATH, "AUTOTUNE_MACHINE_LOCK": str(tmp_path / "worker.lock"), "AUTOTUNE_TEST_RUNS_DIR": str(worker_runs),
            "AUTOTUNE_TEST_HANG_LATER": "1"})
        os.sched_setaffinity(0, cores)
        cluster.wait_for_nodes()
        yield cluster, worker, worker_runs
    finally:
        os.sched_setaffinity(0, cores)
        if cluster is not None:
            cluster.shutdown()


def _running_on(storage: str, node_id: str) -> int | None:
    """The number of a RUNNING trial on ``node_id``, if the study (once it exists) shows one."""
    for summary in optuna.get_all_study_summaries(storage):
        for t in optuna.load_study(study_name=summary.study_name, storage=storage).trials:
            if t.state.name == "RUNNING" and t.user_attrs.get("node") == node_id:
                return t.number
    return None


# slow: a two-node cluster and ~8 trial processes
@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two nodes of a core each, and a driver unlike them")
def test_two_nodes_share_the_study_and_a_killed_node_loses_nothing(tmp_path, two_nodes):
    import psutil

    cluster, worker, worker_runs = two_nodes
    head_id, worker_id = cluster.head_node.node_id, worker.node_id
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    storage = f"sqlite:///{tmp_path}/nodes.db"
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--backend", "ray", "--address", cluster.address,
           "--model", MODEL, "--image-size", "16", "--device", "cpu", "--space", str(space), "--storage", storage,
           "--windows", "2", "--window-seconds", "0.2", "--finalists", "1", "--rounds", "1", "--trials", "5",
           "--no-progress"]
    env = {**os.environ, **PATH}
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err)
    try:
        # the worker's second trial hangs in its first step (the head waits for it): kill the node under it
        killed, deadline = None, time.monotonic() + 300
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
            if len(os.listdir(worker_runs)) == 2:
                killed = _running_on(storage, worker_id)
        assert killed is not None, "no trial ran on the worker node a second time:\n" + \
            (tmp_path / "err").read_text()[-3000:]
        hung = [int(p) for p in os.listdir(worker_runs)]
        cluster.remove_node(worker, allow_graceful=False)
        gone = time.monotonic() + 30
        while any(psutil.pid_exists(p) for p in hung) and time.monotonic() < gone:
            time.sleep(0.2)
        assert not any(psutil.pid_exists(p) for p in hung), "a trial process outlived its killed node"
        assert proc.wait(timeout=600) == 0, (tmp_path / "err").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "recommended:" in (tmp_path / "out").read_text()

    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert not [t.number for t in study.trials if t.state.name == "RUNNING"]
    assert_queued_are_walk_steps_or_reruns(study.trials)
    # measured trials (not copies of another's figures) ran on both nodes, each under its own node's cap
    measured = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")
                and "duplicate_of" not in t.user_attrs and t.user_attrs.get("status") in ("ok", "pruned")]
    assert {t.user_attrs["node"] for t in measured} == {head_id, worker_id}
    caps = {head_id: HEAD_MB, worker_id: WORKER_MB}
    assert all(t.user_attrs["memory_cap_mb"] == pytest.approx(caps[t.user_attrs["node"]]) for t in measured)
    assert all(t.user_attrs["fingerprint"] == study.user_attrs["fingerprint"] for t in measured)  # the nodes'
    # the trial that was running on the killed node: Tune ran it again, on the head, and it was measured
    again = study.trials[killed]
    assert again.state.name in ("COMPLETE", "PRUNED"), (again.state.name, again.user_attrs)
    assert again.user_attrs["ray_retries"] == 1 and again.user_attrs["node"] == head_id
    assert again.user_attrs["samples_per_s"] and again.user_attrs["memory_cap_mb"] == pytest.approx(HEAD_MB)
    # every finalist run (their logs come back here, headed by the node) ran on one node: the one still alive
    logs = sorted(tmp_path.rglob("finalist-*.log"))
    assert logs and {p.read_text().splitlines()[0] for p in logs} == {f"# ran on Ray node {head_id}"}
    assert study.user_attrs["recommendation"]["config"]["batch_size"] in (4, 8, 16, 32, 64)
