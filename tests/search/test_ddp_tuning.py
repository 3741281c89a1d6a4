"""Tuning N DDP ranks (issue 27 items 4 and 5): the space for N ranks, DDP's knobs, the global batch across ranks
with ``no_sync`` on the accumulation micro-steps, the recommendation's ``distributed`` section and launch line,
and (slow) a real 2-rank ``autotune run``.

The no_sync tests run real DDP in this process on a one-rank gloo group: DDP's reducer calls its communication
hook once per bucket it all-reduces whatever the world size, so counting the hook's calls counts the all-reduces.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig


# --- no_sync on the accumulation micro-steps ------------------------------------------------------------------

@pytest.fixture(scope="module")
def gloo_group(tmp_path_factory):
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _allreduces(config: TrialConfig, *, accumulation: int, micro_batches: int) -> int:
    """How many buckets DDP all-reduced over ``micro_batches`` calls of the trial's step (``worker.make_step``)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from autotune.machine.device import get_device
    from autotune.trial.worker import make_step

    calls = []

    def hook(state, bucket):
        calls.append(bucket.index())
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    def wrap(model):
        ddp = DistributedDataParallel(model, **config.ddp_kwargs())
        ddp.register_comm_hook(None, hook)
        return ddp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    step = make_step(model, torch.nn.functional.cross_entropy, config, get_device("cpu"), train=True,
                     accumulation_steps=accumulation, wrap=wrap)
    for _ in range(micro_batches):
        step((torch.randn(config.batch_size, 16), torch.randint(0, 4, (config.batch_size,))))
    return len(calls)


def test_ddp_all_reduces_once_per_optimizer_step_under_accumulation(gloo_group):
    # 3 optimizer steps of 4 micro-batches: one all-reduce each (the model is one bucket), not one per micro-batch
    assert _allreduces(TrialConfig(batch_size=4), accumulation=4, micro_batches=12) == 3
    assert _allreduces(TrialConfig(batch_size=4), accumulation=1, micro_batches=5) == 5  # no accumulation: every step


def test_static_graph_syncs_its_first_step_whole_then_uses_no_sync(gloo_group):
    # DDP records a static graph in its first backward, which must not run under no_sync (its reducer asserts)
    config = TrialConfig(batch_size=4, static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=1)
    assert _allreduces(config, accumulation=4, micro_batches=12) == 4 + 1 + 1


# --- the global batch across ranks ------------------------------------------------------------------------------

def test_the_global_batch_is_micro_batch_times_accumulation_times_world_size():
    from autotune.errors import ConfigError
    from autotune.workloads.global_batch import accumulation_steps, describe, divisors_among

    assert accumulation_steps(256, 32, world_size=2) == 4
    assert accumulation_steps(256, 32) == 8  # one process: as before
    assert divisors_among(96, [8, 16, 32, 48], world_size=2) == [8, 16, 48]  # 2 x 32 = 64 does not divide 96
    assert describe(32, 256, world_size=2) == ("micro-batch 32 \u00d7 4 accumulation steps \u00d7 2 ranks = "
                                               "global batch 256")
    with pytest.raises(ConfigError, match="batch_size=32 x 2 ranks does not divide the global batch 96"):
        accumulation_steps(96, 32, world_size=2)


# --- the space for N ranks -------------------------------------------------------------------------------------

def _hardware(cores: int):
    from autotune.machine.hardware import detect

    return dataclasses.replace(detect(with_torch=False), usable_cores=cores)


_SPACE = {"name": "t", "device": "cpu",
          "parameters": {"batch_size": {"type": "int", "choices": [8, 16]},
                         "num_workers": {"type": "int", "low": 0, "high": "cores"},
                         "intra_op_threads": {"type": "int", "low": 1, "high": "cores"}},
          "baseline": {"batch_size": 8, "num_workers": 0, "intra_op_threads": "cores"}}


@pytest.mark.parametrize("cores, ranks", [(8, 2), (8, 3), (2, 2), (3, 2)])
def test_no_config_of_the_space_for_n_ranks_gives_them_more_threads_and_workers_than_cores(cores, ranks):
    import itertools

    from autotune.search.space.rank_space import for_ranks
    from autotune.search.space.search_space import space_from_dict

    space = for_ranks(space_from_dict(_SPACE, hardware=_hardware(cores)), ranks)
    choices = {p.name: p.choices for p in space.params}
    share = cores // ranks
    # a rank's workers may take its whole share (search.record.ceilings measures whether that feeds it)
    assert max(choices["intra_op_threads"]) == share and max(choices["num_workers"]) == share
    # every point the sampler can propose keeps each rank within its share: its threads get what its workers leave
    # (at least one), even asking for the most of both
    for workers, threads in itertools.product(range(cores + 1), [None, *range(1, cores + 1)]):
        config = space.effective({"num_workers": workers, "intra_op_threads": threads})
        assert config.num_workers <= share, (workers, threads, config)
        assert config.intra_op_threads <= max(1, share - config.num_workers), (workers, threads, config)
    base = space.baseline_config()
    assert ranks * (base.intra_op_threads + base.num_workers) <= cores
    assert base.intra_op_threads == share  # the baseline's `cores` is each rank's share
    assert {"bucket_cap_mb", "gradient_as_bucket_view", "static_graph"} <= set(choices)
    assert base.ddp_kwargs() == {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "static_graph": False}
    assert any("ranks share" in n for n in space.notes) or cores // ranks == cores


def test_one_process_never_searches_ddps_knobs_and_oversubscribe_trims_nothing():
    from autotune.search.space.rank_space import for_ranks
    from autotune.search.space.search_space import space_from_dict

    hw = _hardware(4)
    plain = space_from_dict(_SPACE, hardware=hw)
    assert for_ranks(plain, 1) is plain
    listed = space_from_dict({**_SPACE, "parameters": {**_SPACE["parameters"], "static_graph": {"type": "bool"}}},
                             hardware=hw)
    one = for_ranks(listed, 1)
    assert "static_graph" not in {p.name for p in one.params} and "static_graph dropped" in one.notes[-1]
    assert "static_graph" not in one.baseline_config().to_dict()  # a one-process config is written as before
    over = for_ranks(space_from_dict({**_SPACE, "oversubscribe": True}, hardware=hw), 2)
    assert max(next(p for p in over.params if p.name == "intra_op_threads").choices) == 4


def test_the_space_for_ranks_keeps_the_batch_sizes_whose_ranks_divide_the_global_batch():
    from autotune.config import Workload
    from autotune.search.space.search_space import space_for, space_from_dict

    doc = {**_SPACE, "parameters": {**_SPACE["parameters"], "batch_size": {"type": "int", "choices": [8, 16, 32]}}}
    workload = Workload(model="tests.ddp_workloads:mlp", global_batch=32, nproc_per_node=2,
                        data={"tensors": []})
    space = space_for(workload, _hardware(4), space=space_from_dict(doc, hardware=_hardware(4)))
    assert next(p for p in space.params if p.name == "batch_size").choices == (8, 16)  # 2 x 32 > 32


# --- never mixed with one-process studies ------------------------------------------------------------------------

def test_warm_start_never_imports_winners_across_world_sizes(tmp_path):
    import optuna

    from autotune.config import Workload
    from autotune.search.record import trials as keys
    from autotune.search.plan.warm_start import earlier_winners

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/t.db")
    names = {}
    for ranks in (1, 2):  # two stored studies on this hardware, each with its recommendation, as a run leaves them
        names[ranks] = f"s-x{ranks}"
        study = optuna.create_study(study_name=names[ranks], storage=storage, direction="maximize")
        study.set_user_attr(keys.STUDY_FINGERPRINT, "fp")
        study.set_user_attr(keys.STUDY_WORKLOAD, Workload(model="m:f", nproc_per_node=ranks).to_dict())
        study.set_user_attr(keys.STUDY_RECOMMENDATION, {
            "config": TrialConfig(batch_size=8 * ranks).to_dict(), "hardware": {"fingerprint": "fp"},
            "provenance": {"trial": 0}, "measured": {"median_samples_per_s": 1.0}})
    for ranks, other in ((1, 2), (2, 1)):
        found = earlier_winners(storage, fingerprint="fp", device="cpu", exclude="none", world_size=ranks)
        assert [(w.study_name, w.config.batch_size) for w in found] == [(names[ranks], 8 * ranks)]


# --- bad input on `autotune run` ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ranks, line", [("0", "nproc_per_node=0 is not allowed"), ("64", "usable core(s)")])
def test_bad_rank_counts_on_run_are_one_line_and_exit_2(capsys, tmp_path, ranks, line):
    from autotune.cli.main import main as cli_main

    code = cli_main(["run", "--model", "tests.ddp_workloads:mlp", "--device", "cpu", "--nproc-per-node", ranks,
                     "--trials", "1", "--storage", f"sqlite:///{tmp_path}/t.db", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and line in err and len(err.splitlines()) == 1, err


# --- a real 2-rank study --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_2_rank_run_records_world_size_2_and_never_gives_the_ranks_more_than_the_cores(tmp_path):
    import optuna
    import yaml

    from autotune.machine.hardware import detect
    from tests.helpers import run_cli

    cores = detect(with_torch=False).usable_cores
    if cores < 2:
        pytest.skip("2 ranks need 2 usable cores (more is refused without --oversubscribe)")
    db = f"sqlite:///{tmp_path}/t.db"
    out = run_cli("run", "--model", "tests.ddp_workloads:mlp", "--device", "cpu", "--nproc-per-node", "2",
                  "--global-batch", "64", "--trials", "3", "--windows", "2", "--window-seconds", "0.3",
                  "--trial-timeout", "120s", "--finalists", "1", "--rounds", "1", "--parity-steps", "0",
                  "--no-progress", "--no-warm-start", "--storage", db, timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]
    (name,) = optuna.get_all_study_names(db)
    assert "-x2-" in name  # never one process's study
    finished = [t for t in optuna.load_study(study_name=name, storage=db).trials if t.user_attrs.get("status")]
    assert len(finished) >= 3
    for t in finished:
        config = TrialConfig.from_dict(t.user_attrs["config"])
        assert t.user_attrs["world_size"] == 2
        # each rank within its share of the usable cores (search_space.effective): its workers at most the share
        # (the ceilings measure whether they feed it, and the fed configs keep them), its threads what the workers
        # leave, at least one; so the ranks' compute threads together never exceed the cores
        share = cores // 2
        assert config.num_workers <= share and config.intra_op_threads <= max(1, share - config.num_workers)
        assert 2 * config.intra_op_threads <= cores
        if t.user_attrs["status"] == "ok":  # a trial stopped early (pruned) has no per-rank figures
            assert [r["threads"] for r in t.user_attrs["ranks"]] == [config.intra_op_threads] * 2  # as each ran
            assert t.user_attrs["samples_per_step"] == 64  # micro-batch x accumulation x 2 ranks: the global batch
    assert any(t.user_attrs["status"] == "ok" for t in finished)
    assert run_cli("export", "--storage", db, "--study-name", name, "-o", str(tmp_path / "best.yaml")).returncode == 0
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    # what it says was never measured was never measured: DDP's arguments at their defaults ran in the baseline
    ran = {(k, v) for t in finished
           for k, v in dataclasses.asdict(TrialConfig.from_dict(t.user_attrs["config"])).items()}
    assert not [(k, v) for k, vs in (best.get("try") or {}).items() for v in vs if (k, v) in ran], best.get("try")
    dist = best["distributed"]
    assert dist["world_size"] == 2 and dist["global_batch"] == 64 and "--nproc-per-node 2" in dist["launch"]
    assert dist["per_rank_batch"] * dist["accumulation_steps"] * 2 == 64
