"""The backend interface: a backend owns the search only; the tuner opens, seeds and finishes the study."""

from __future__ import annotations

import pytest

from autotune.search.backends import protocol
from autotune.search.backends import SearchBackend, load_backend
from autotune.search.plan.context import SearchOutcome
from autotune.config import TrialResult
from autotune.errors import AutotuneError
from tests.helpers import make_tuner, search_run


def test_a_backend_must_implement_search():
    with pytest.raises(TypeError):
        SearchBackend()  # type: ignore[abstract]


def test_unknown_backend_and_an_address_without_ray_are_one_line_errors():
    with pytest.raises(AutotuneError, match="unknown backend 'slurm'"):
        load_backend("slurm")
    with pytest.raises(AutotuneError, match="use it with --backend ray"):
        load_backend("local", address="auto")


class _AskTell(SearchBackend):
    """A minimal backend on Optuna's ask/tell: the protocol functions are all it needs."""

    def __init__(self, *, address=None) -> None:
        super().__init__(address=address)
        self.seen_queued = None

    def search(self, ctx, study, *, trials) -> SearchOutcome:
        self.seen_queued = sum(1 for t in study.trials if t.state.name == "WAITING")
        for _ in range(trials):
            trial = study.ask()
            config = ctx.space.suggest(trial)
            protocol.begin(trial, config, fingerprint=ctx.fingerprint)
            state, value = protocol.settle(lambda: protocol.record(
                trial, ctx.runner(ctx.workload, config, ctx.measure), limit=ctx.limit))
            study.tell(trial, value, state=state)
            ctx.after_trial(study)
        return SearchOutcome(trials)


def test_tuner_runs_any_backend_between_seeding_and_the_finalists(tmp_path, monkeypatch):
    import autotune.search.backends as backends

    ran = []

    def fake(workload, config, measure, **kw):
        ran.append((search_run(measure, kw), config.batch_size))  # after the search: a finalist's, the claim's
        v = 10.0 * config.batch_size
        return TrialResult(status="ok", samples_per_s=(v, v), wall_s=1.0, peak_host_mb=10.0,
                           batch_size=config.batch_size)

    backend = _AskTell()
    monkeypatch.setattr(backends, "load_backend", lambda name, address=None: backend)
    tuner = make_tuner(tmp_path, runner=fake, finalists=1)
    rec = tuner.run(trials=3)
    assert backend.seen_queued >= 2  # the baseline and the likely winner were queued before the search
    search = [b for searching, b in ran if searching]
    assert search[:2] == [8, 8] and len(search) == 3
    assert len(ran) > 3 and rec is not None and rec.config.batch_size == 16  # finalists re-measured by the tuner


def test_ray_trials_on_a_node_share_its_memory_and_reserve_their_threads():
    """The cap is the node's (not the driver's: its available memory, at most its Ray `memory`) and is divided
    among the trials a node runs at once; a GPU trial reserves the cores its threads and workers use."""
    import dataclasses

    from autotune.search.backends.ray.cluster import gpu_trial, node_memory_cap_mb
    from autotune.machine.hardware import detect
    from autotune.machine.limits import default_memory_cap_mb

    node = dataclasses.replace(detect(with_torch=False), ram_available_mb=64_000.0, ram_total_mb=65_536.0,
                               gpus=({"index": 0}, {"index": 1}, {"index": 2}, {"index": 3}))
    whole = default_memory_cap_mb(node)
    assert node_memory_cap_mb(node, "cpu", None) == (whole, 1)
    assert node_memory_cap_mb(node, "cuda", None) == (whole / 4, 4)  # four GPU trials at once
    assert node_memory_cap_mb(node, "cuda", 5000.0) == (5000.0, 4)  # the user's smaller cap stands
    # no more than the memory the node gives Ray's tasks (its `memory` resource), shared the same way
    assert node_memory_cap_mb(node, "cpu", None, ray_memory_mb=3072.0) == (3072.0, 1)
    assert node_memory_cap_mb(node, "cuda", None, ray_memory_mb=40_000.0) == (10_000.0, 4)
    assert node_memory_cap_mb(node, "cpu", None, ray_memory_mb=100_000.0) == (whole, 1)
    assert node_memory_cap_mb(node, "cpu", 2000.0, ray_memory_mb=3072.0) == (2000.0, 1)
    assert gpu_trial({"intra_op_threads": 4, "num_workers": 2}) == {"CPU": 6.0, "GPU": 1.0}
    assert gpu_trial({"intra_op_threads": None, "num_workers": 0}) == {"CPU": 1.0, "GPU": 1.0}


def test_a_ray_gpu_trial_runs_on_its_one_gpu_whatever_cuda_n_the_study_names():
    from autotune.search.backends.ray.cluster import trial_device
    from autotune.config import Workload

    # Ray sets CUDA_VISIBLE_DEVICES to the trial's GPU: inside the worker it is cuda:0, and cuda:1 names nothing
    assert trial_device(Workload(device="cuda:1")).device == "cuda"
    assert trial_device(Workload(device="cuda")).device == "cuda"
    cpu = Workload(device="cpu")
    assert trial_device(cpu) is cpu
