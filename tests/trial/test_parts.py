"""Each ceiling alone in a real trial child (autotune.trial.parts): the data path with no model, the model on one
batch already on the device, over JPEGs really decoded by PIL (tests/heavy_data_workloads.py); a data path that
fails alone is the workload's failure, with its own message, named as the data path's."""

from __future__ import annotations

import os

import pytest

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig
from autotune.trial.runner import run_trial

SPEC = MeasureSpec(windows=2, window_s=0.3, settle_windows=0, timeout_s=120, memory_cap_mb=4096.0)
HEAVY = Workload(model="tests.heavy_data_workloads:build", image_size=32)


@pytest.fixture(scope="module")
def alone():
    """The model alone and the data path alone (one worker, persistent), each in its own child."""
    model = run_trial(HEAVY, TrialConfig(batch_size=16, intra_op_threads=1), SPEC.replace(part="model"))
    data = run_trial(HEAVY, TrialConfig(batch_size=16, num_workers=1, persistent_workers=True, intra_op_threads=1),
                     SPEC.replace(part="data"))
    return model, data


def test_the_model_alone_never_waits_for_data_and_outruns_the_data_path(alone):
    model, data = alone
    assert model.status == "ok" and data.status == "ok", (model.reason, data.reason)
    assert len(model.samples_per_s) == 2 and len(data.samples_per_s) == 2  # the trial's own windows
    assert model.data_wait_share < 0.2  # the batch is on the device already: no loader in its steps
    # a few hundred parameters against a JPEG decode per sample: the model alone is many times faster
    assert model.median_samples_per_s > 5 * data.median_samples_per_s


def test_the_data_path_alone_reports_the_cores_its_workers_kept_busy(alone):
    _, data = alone
    assert data.data_wait_share > 0.5  # its "step" only copies the batch: nearly all of it is the loader
    # the one worker decoding (a share of a core on a busy VM); the main process alone, which only waits on the
    # worker's queue, keeps well under 0.15
    assert data.cpu_cores_used is not None and 0.15 < data.cpu_cores_used < 2.5


def test_a_data_path_that_fails_alone_says_so_with_the_workloads_message():
    r = run_trial(Workload(model="tests.heavy_data_workloads:bad_collate", image_size=32),
                  TrialConfig(batch_size=8, intra_op_threads=1), SPEC.replace(part="data"))
    assert r.status == "error" and r.user_error
    assert r.reason.startswith("WorkloadError: the data path alone (the workload's DataLoader, 0 worker(s), no model) "
                               "failed: ValueError: labels of mixed types: cannot stack"), r.reason


def test_a_worker_that_dies_is_a_failed_point_not_the_workloads_error():
    """A DataLoader worker killed by a signal (the OOM killer's way) may be the config's doing (more workers, more
    memory): the data path's point fails, and nothing says the workload is wrong."""
    r = run_trial(Workload(model="tests.study_fixtures:worker_killer", image_size=16),
                  TrialConfig(batch_size=8, num_workers=1, intra_op_threads=1), SPEC.replace(part="data"))
    assert r.status in ("error", "crashed") and not r.user_error, (r.status, r.reason)
    assert "DataLoader worker" in r.reason


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two DDP ranks need two usable cores (check_ranks)")
def test_each_part_runs_in_n_ddp_ranks_at_once_as_the_trials_do():
    """Two real gloo ranks, each with its shard and one worker decoding JPEGs, against one process with one worker
    (interleaved): the data path's rate is both ranks' together, its cores busy the whole trial's (both ranks'
    workers, not rank 0's alone); the model part's steps (with DDP's all-reduce) never wait for data."""
    import dataclasses
    import statistics

    two = dataclasses.replace(HEAVY, nproc_per_node=2)
    cfg = TrialConfig(batch_size=16, num_workers=1, persistent_workers=True, intra_op_threads=1)
    spec = SPEC.replace(part="data", windows=3, window_s=0.5)
    ones, twos = [], []
    for _ in range(3):  # interleaved pairs: this VM's load moves between runs, less within a pair
        ones.append(run_trial(HEAVY, cfg, spec))
        twos.append(run_trial(two, cfg, spec))
    model = run_trial(two, TrialConfig(batch_size=16, intra_op_threads=1), SPEC.replace(part="model"))
    assert all(r.status == "ok" for r in [*ones, *twos, model]), [r.reason for r in [*ones, *twos, model]]
    assert all(r.world_size == 2 for r in twos) and model.world_size == 2
    assert model.data_wait_share < 0.2
    rate = statistics.median(b.median_samples_per_s / a.median_samples_per_s for a, b in zip(ones, twos))
    cores = statistics.median(b.cpu_cores_used / a.cpu_cores_used for a, b in zip(ones, twos))
    print("one process, 1 worker: " + ", ".join(f"{r.cpu_cores_used:.2f} cores busy {r.median_samples_per_s:.0f}/s"
                                                for r in ones)
          + "; 2 ranks, 1 worker each: " + ", ".join(f"{r.cpu_cores_used:.2f} cores busy {r.median_samples_per_s:.0f}/s"
                                                     for r in twos)
          + f"; median ratio of the pairs: cores x{cores:.2f}, rate x{rate:.2f}")
    # two workers decoding on this machine's cores (at least 2): rank 0's tree alone would hold one worker, and its
    # samples alone would be about one process's (ratios near 1 or below)
    assert cores > 1.2 and rate > 1.1


def test_a_ranks_cores_busy_are_its_whole_trials():
    """``tree_cpu_s(whole_trial=True)`` in a process reads its parent's tree: a sibling burning a core (another rank
    and its workers) counts, where the process's own tree does not see it. Real processes, real CPU time."""
    import subprocess
    import sys
    import textwrap

    burn = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # until killed below
    try:
        # the sibling's own seconds, read at the same instants: what it got of a busy VM's cores
        probe = textwrap.dedent("""
            import sys, time
            import psutil
            from autotune.trial.parts import tree_cpu_s
            sib = psutil.Process(int(sys.argv[1]))
            s0, a, b = sum(sib.cpu_times()[:2]), tree_cpu_s(), tree_cpu_s(whole_trial=True)
            time.sleep(1.5)
            s1, c, d = sum(sib.cpu_times()[:2]), tree_cpu_s(), tree_cpu_s(whole_trial=True)
            print((c[0] - a[0]) / (c[1] - a[1]), (d[0] - b[0]) / (d[1] - b[1]), (s1 - s0) / (d[1] - b[1]))
        """)
        out = subprocess.run([sys.executable, "-c", probe, str(burn.pid)], capture_output=True, text=True, timeout=60,
                             check=True)
    finally:
        burn.kill()
        burn.wait()
    own, whole, burned = (float(x) for x in out.stdout.split())
    assert own < 0.2  # it slept
    assert burned > 0.05, burned  # the sibling ran
    assert whole - own >= 0.8 * burned, (own, whole, burned)  # and counts in the whole trial's cores


def test_a_worker_that_exits_between_two_readings_keeps_its_cpu_seconds():
    """A child that burns a second and is reaped between the two readings (a DataLoader worker at an epoch's end,
    without persistent workers) still counts: its seconds are in its parent's children's times."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent("""
        import subprocess, sys
        from autotune.trial.parts import tree_cpu_s
        a = tree_cpu_s()
        burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1: pass"
        subprocess.run([sys.executable, "-c", burn])
        b = tree_cpu_s()
        print(b[0] - a[0])
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert float(out.stdout) >= 0.9, out.stdout  # the child's second of CPU, gone before the second reading
