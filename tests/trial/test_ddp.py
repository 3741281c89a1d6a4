"""A trial of N DDP ranks (autotune.trial.ddp, autotune.trial.ranks) on real gloo process groups on this CPU.

The fast tests check the parts a rank is made of (its shard of the data, the refusals); the slow ones run real
2-rank trials: figures per rank, one rank's OOM or death ending the trial with nothing left running, a hung rank
killed at the time limit.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from autotune.cli.main import main as cli_main
from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.errors import ConfigError
from autotune.machine.device import get_device
from autotune.trial.ddp import check_ranks, rank_threads
from autotune.trial.ranks import RankGroup, ShardedSampler
from autotune.trial.runner import run_trial
from tests.helpers import alive_pids, run_cli

W = "tests.ddp_workloads"
QUICK = MeasureSpec(windows=2, window_s=0.2, settle_windows=0, timeout_s=120)


def _indices(loader_kw, dataset, world):
    import torch

    out = []
    for rank in range(world):
        kw = RankGroup(rank, world, get_device("cpu"), seed=3).shard(loader_kw, dataset)
        loader = torch.utils.data.DataLoader(dataset, **kw)
        out.append([int(i) for batch in loader for i in batch["i"]])
    return out


def test_each_rank_gets_a_disjoint_equal_shard_of_a_map_style_dataset():
    from tests.ddp_workloads import Indexed

    data = Indexed(100)
    kw = {"batch_size": 4, "drop_last": True, "shuffle": True}
    shards = _indices(kw, data, 3)
    assert [len(s) for s in shards] == [32, 32, 32]  # 33 each, cut to whole batches
    assert all(set(a).isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1:])
    assert shards[0] != sorted(shards[0])  # still shuffled, as without ranks


def test_the_workloads_own_sampler_is_sharded_in_its_order():
    import torch

    from tests.ddp_workloads import Indexed

    data = Indexed(10)
    kw = {"batch_size": 1, "drop_last": True, "sampler": torch.utils.data.SequentialSampler(data)}
    assert _indices(kw, data, 2) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert list(ShardedSampler(range(11), rank=2, world_size=3)) == [2, 5, 8]  # 9 and 10 cut: equal lengths


@pytest.mark.parametrize("workload, cores, gpus, message", [
    (Workload(nproc_per_node=3), 2, 0, "--nproc-per-node 3 but this machine has 2 usable core(s)"),
    (Workload(nproc_per_node=3, device="cuda"), 16, 2, "--nproc-per-node 3 but 2 GPU(s) are visible"),
    (Workload(nproc_per_node=2, device="cuda:1"), 16, 2, "rank r uses GPU r; pass --device cuda"),
])
def test_more_ranks_than_the_machine_has_is_refused(workload, cores, gpus, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_ranks(workload, usable_cores=cores, gpus=gpus)


def test_oversubscribe_allows_more_ranks_than_cores_and_threads_are_shared_out():
    check_ranks(Workload(nproc_per_node=3), usable_cores=2, gpus=0, oversubscribe=True)
    check_ranks(Workload(nproc_per_node=2, device="cuda"), usable_cores=1, gpus=2)  # cores do not limit GPU ranks
    assert rank_threads(None, 2, 8) == 4 and rank_threads(None, 3, 2) == 1 and rank_threads(3, 2, 8) == 3


@pytest.mark.parametrize("args, line", [
    (["--nproc-per-node", "0"], "nproc_per_node=0 is not allowed"),
    (["--nproc-per-node", str((os.cpu_count() or 1) + 64)], "usable core(s)"),
])
def test_bad_rank_counts_are_one_line_and_exit_2(capsys, args, line):
    code = cli_main(["trial", "--model", f"{W}:mlp", "--device", "cpu", "--batch-size", "8", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and line in err and len(err.splitlines()) == 1, err


def test_a_study_of_n_ranks_is_never_one_process_study():
    from autotune.search.record.storage import study_name_for

    one, two = (study_name_for(Workload(nproc_per_node=n), "fp") for n in (1, 2))
    assert one == "resnet18-train-224px-synthetic-cpu-fp" and two == "resnet18-train-224px-synthetic-cpu-x2-fp"


def test_one_process_is_written_as_before():
    assert "nproc_per_node" not in Workload().to_dict()
    w = Workload(nproc_per_node=2)
    assert Workload.from_dict(w.to_dict()) == w and w.label().endswith("/x2") and w != Workload()


# --- real 2-rank trials ------------------------------------------------------------------------------------

class _Tree:
    """on_event for run_trial: keeps the rank pids and, at the first window, every process of the trial."""

    def __init__(self, kill_rank: int | None = None) -> None:
        self.kill_rank, self.pids, self.seen, self.killed_at = kill_rank, [], set(), None

    def __call__(self, ev):
        import psutil

        if ev.get("event") == "started":
            self.seen.add(ev["pid"])
        if ev.get("event") == "ranks":
            self.pids = ev["pids"]
        if ev.get("event") == "window" and self.killed_at is None:
            for pid in list(self.seen) + self.pids:
                try:
                    self.seen.update(p.pid for p in psutil.Process(pid).children(recursive=True))
                except psutil.Error:
                    pass
            self.seen.update(self.pids)
            if self.kill_rank is not None:
                self.killed_at = time.monotonic()
                os.kill(self.pids[self.kill_rank], signal.SIGKILL)


@pytest.mark.slow
def test_a_2_rank_trial_on_the_cli_records_world_size_per_rank_figures_and_disjoint_shards(tmp_path, monkeypatch):
    from autotune.machine.hardware import detect

    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    out = run_cli("trial", "--model", f"{W}:mlp", "--device", "cpu", "--nproc-per-node", "2",
                  "--batch-size", "8", "--num-workers", "1", "--windows", "3", "--window-seconds", "0.3",
                  "--trial-timeout", "120s", "--format", "json", timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)["result"]
    assert result["status"] == "ok" and result["world_size"] == 2
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["median_samples_per_s"] > 0 and 0 <= r["data_wait_share"] <= 1 for r in ranks)
    cores = detect(with_torch=False).usable_cores
    assert all(r["threads"] == max(1, cores // 2) for r in ranks)  # torch would give each rank every core
    # a window's throughput is both ranks' samples over the slower one's time: with equal shards, twice the slower
    # rank's rate, window by window (the faster rank's own rate is more, and does not count)
    per_window = list(zip(*(r["samples_per_s"] for r in ranks)))
    assert len(per_window) == len(result["samples_per_s"]) == 3
    for glob, rates in zip(result["samples_per_s"], per_window):
        assert glob == pytest.approx(2 * min(rates), rel=1e-3)
    shards = [set((tmp_path / f"rank{r}.idx").read_text().split()) for r in (0, 1)]
    assert shards[0] and shards[1] and shards[0].isdisjoint(shards[1])


@pytest.mark.slow
def test_an_oom_on_rank_1_only_ends_the_trial_as_oom_within_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    tree = _Tree()
    r = run_trial(Workload(model=f"{W}:oom_rank1", nproc_per_node=2), TrialConfig(batch_size=8, num_workers=1),
                  QUICK.replace(windows=50), on_event=tree)
    ended = time.time()
    assert r.status == "oom", (r.status, r.reason, r.traceback)
    assert r.reason.startswith("rank 1: ") and "out of memory" in r.reason and r.world_size == 2
    assert ended - float((tmp_path / "oom_at").read_text()) < 5.0  # not held up by rank 0's stuck all-reduce
    assert tree.pids and alive_pids(tree.pids) == []


@pytest.mark.slow
def test_sigkill_of_one_rank_ends_the_trial_as_crashed_with_no_orphan():
    tree = _Tree(kill_rank=1)
    r = run_trial(Workload(model=f"{W}:mlp", nproc_per_node=2), TrialConfig(batch_size=8, num_workers=1),
                  QUICK.replace(windows=50), on_event=tree)
    assert r.status == "crashed", (r.status, r.reason)
    assert "rank 1 killed by SIGKILL" in r.reason
    assert time.monotonic() - tree.killed_at < 5.0
    assert len(tree.seen) >= 5  # the trial child, 2 ranks and a DataLoader worker each
    assert alive_pids(tree.seen) == []


@pytest.mark.slow
def test_a_rank_stuck_in_a_collective_is_killed_at_the_time_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    tree = _Tree()
    t0 = time.monotonic()
    r = run_trial(Workload(model=f"{W}:hang_rank1", nproc_per_node=2), TrialConfig(batch_size=8),
                  QUICK.replace(windows=50, timeout_s=40), on_event=tree)
    assert r.status == "timeout" and (tmp_path / "hung_at").exists(), (r.status, r.reason)
    assert time.monotonic() - t0 < 40 + 15
    assert tree.pids and alive_pids(tree.pids) == []


@pytest.mark.slow
def test_a_model_ddp_cannot_wrap_is_one_line_naming_the_reason_and_exit_2():
    out = run_cli("trial", "--model", f"{W}:frozen", "--device", "cpu", "--nproc-per-node", "2",
                  "--batch-size", "8", "--windows", "1", "--window-seconds", "0.2", "--trial-timeout", "120s",
                  timeout=240)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert err[-1].startswith("autotune trial: error: DistributedDataParallel cannot wrap the workload's model: "
                              "DistributedDataParallel is not needed when a module doesn't have any parameter")
