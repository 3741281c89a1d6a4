"""Tuning N DDP ranks (issue 27 items 4 and 5): the space for N ranks, DDP's knobs, the global batch across ranks
with ``no_sync`` on the accumulation micro-steps, the recommendation's ``distributed`` section and launch line,
and (slow) a real 2-rank ``autotune run``.

The no_sync tests run real DDP in this process on a one-rank gloo group: DDP's reducer calls its communication
hook once per bucket it all-reduces whatever the world size, so counting the hook's calls counts the all-reduces.
"""

from __future__ import annotations

import pytest

from autotune.config import TrialConfig

pytestmark = []


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
