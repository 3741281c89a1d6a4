"""The numerics check under DDP (issue 27 item 6): the candidate as N real gloo ranks against one fp32 eager process
at the same global batch, on the same samples (autotune.trial.parity, autotune.trial.parity_ranks).

The fast tests check the parts (the plan of global batches and each rank's slice of it, the per-sample seeding,
the record, when a check is needed); the slow ones run real 2-rank checks in real child processes: an honest
config passes on exactly the reference's samples, a config broken only under DDP fails, a rank that raises, runs
out of memory or hangs ends the check with nothing left running.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from autotune.config import TrialConfig, Workload
from autotune.trial.parity import (DEFAULT_TOLERANCE, ParityResult, check_seconds, judge, needs_parity,
                                   parity_check, reference_config)
from autotune.trial.parity_ranks import SeededSamples, global_batches, shard

from tests.helpers import alive_pids

W = "tests.ddp_workloads"
STEPS = 6


def _ddp(model: str, **kw) -> Workload:
    return Workload(model=f"{W}:{model}", nproc_per_node=2, **kw)


def test_n_ranks_need_the_check_even_in_fp32_eager():
    assert not needs_parity(TrialConfig(batch_size=8, num_workers=2))
    assert needs_parity(TrialConfig(batch_size=8), world_size=2)
    ref = reference_config(TrialConfig(batch_size=8, amp="bf16", bucket_cap_mb=5, gradient_as_bucket_view=True,
                                       intra_op_threads=1), world_size=2)
    assert (ref.batch_size, ref.amp, ref.bucket_cap_mb, ref.gradient_as_bucket_view) == (16, "off", 25, False)
    assert ref.intra_op_threads == 2  # the ranks' cores, in one process
    # one process: the reference at the config's own batch, as before
    assert reference_config(TrialConfig(batch_size=8, amp="bf16")).batch_size == 8


def test_the_check_of_n_ranks_is_priced_at_the_global_batch_with_the_ranks_start_up():
    one = check_seconds(TrialConfig(batch_size=16, amp="bf16"), samples_per_s=80.0, fp32_samples_per_s=80.0, steps=10)
    two = check_seconds(TrialConfig(batch_size=16, amp="bf16"), samples_per_s=80.0, fp32_samples_per_s=80.0, steps=10,
                        workload=Workload(nproc_per_node=2, global_batch=64))  # 16 x 2 accumulation x 2 ranks
    assert one == pytest.approx(10 + 3 * 10 * 16 / 80)
    assert two == pytest.approx(25 + 3 * 10 * 64 / 80)
    assert check_seconds(TrialConfig(batch_size=16), samples_per_s=80.0, fp32_samples_per_s=80.0) == 0.0
    # fp32 eager on 2 ranks is checked; for inference the ranks are one process's arithmetic
    assert check_seconds(TrialConfig(batch_size=16), samples_per_s=80.0, fp32_samples_per_s=80.0, steps=10,
                         workload=Workload(nproc_per_node=2)) == pytest.approx(25 + 3 * 10 * 32 / 80)
    assert check_seconds(TrialConfig(batch_size=16), samples_per_s=80.0, fp32_samples_per_s=80.0, steps=10,
                         workload=Workload(nproc_per_node=2, task="infer")) == 0.0


def test_each_rank_gets_a_disjoint_contiguous_slice_and_together_the_reference_batch():
    plan = global_batches(range(100), None, batch=12, count=20, seed=3)  # 8 batches an epoch: 2.5 epochs
    assert len(plan) == 20 and all(len(b) == 12 for b in plan)
    assert sorted(set(plan[0])) != plan[0]  # shuffled
    assert plan != global_batches(range(100), None, batch=12, count=20, seed=4)
    assert plan == global_batches(range(100), None, batch=12, count=20, seed=3)  # every process draws the same
    shards = [shard(plan, rank=r, world_size=3) for r in range(3)]
    for k, batch in enumerate(plan):
        parts = [s[k] for s in shards]
        assert [len(p) for p in parts] == [4, 4, 4]
        assert sum(parts, []) == batch  # disjoint, in order, and exactly the reference's batch
    # an epoch's samples are drawn once: 96 of the 100 in the first 8 batches, none twice
    first_epoch = sum(plan[:8], [])
    assert len(first_epoch) == len(set(first_epoch)) == 96


def test_the_workloads_own_sampler_is_batched_in_its_order():
    plan = global_batches(range(10), torch.utils.data.SequentialSampler(range(10)), batch=4, count=3, seed=0)
    assert plan == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert shard(plan, rank=1, world_size=2) == [[2, 3], [6, 7], [2, 3]]
    with pytest.raises(ValueError, match="fewer samples than one global micro-batch of 16"):
        global_batches(range(10), None, batch=16, count=1, seed=0)


def test_a_random_augmentation_does_the_same_to_a_sample_in_any_process():
    class Augmented(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.rand(3) + i  # draws from torch's global generator, as RandomResizedCrop does

    data = SeededSamples(Augmented(), seed=0)
    torch.manual_seed(1)
    first = [data[i] for i in (3, 7)]
    torch.manual_seed(2)
    torch.rand(5)  # another state, another order: as a rank that loaded other samples before
    assert torch.equal(data[7], first[1]) and torch.equal(data[3], first[0])
    assert not torch.equal(data[3] - 3, data[7] - 7)  # still random across samples
    before = torch.get_rng_state()
    data[5]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's stream is left as it was


def test_the_record_says_the_ranks_and_one_process_reads_as_before():
    raw = {"losses_reference": [2.0] * 3, "losses_candidate": [2.0, 2.0, 2.01], "losses_control": [2.0] * 3}
    r = judge(raw, steps=3, tolerance=0.05, label="fp32 eager on 2 DDP ranks",
              against="one fp32 eager process at the global batch 32", world_size=2, per_rank_batch=8,
              accumulation_steps=2, global_batch=32)
    assert r.ok and "of one fp32 eager process at the global batch 32" in r.reason
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert (d["world_size"], d["per_rank_batch"], d["accumulation_steps"], d["global_batch"]) == (2, 8, 2, 32)
    assert ParityResult.from_dict(d) == r
    one = ParityResult(ok=True, steps=3, reason="x").to_dict()
    assert not {"world_size", "per_rank_batch", "accumulation_steps", "global_batch"} & set(one)
    assert ParityResult.from_dict(one).world_size == 1


def test_inference_on_n_ranks_is_one_process_arithmetic():
    # DDP does not wrap inference (each rank infers its shard): fp32 eager needs no check, with any world size
    r = parity_check(Workload(model="tests.workloads_fixtures:tiny", image_size=16, task="infer", nproc_per_node=2),
                     TrialConfig(batch_size=8))
    assert r.ok and r.steps == 0 and r.world_size == 1


# --- real 2-rank checks (gloo on this CPU): about 15 s each on 2 cores -----------------------------------------

def _lines(path):
    return [[int(i) for i in line.split()] for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_an_honest_2_rank_config_matches_one_process_on_exactly_its_samples(tmp_path, monkeypatch):
    """A BatchNorm-free MLP, fp32 eager on 2 ranks with a global batch of 32 (8 per rank x 2 accumulation steps x
    2 ranks): the check runs, and the ranks' loss follows the reference's to rounding, because every micro-batch
    of each rank is its slice of the reference's micro-batch (checked from what each process trained on)."""
    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    r = parity_check(_ddp("mlp_noted", global_batch=32), TrialConfig(batch_size=8), steps=STEPS,
                     log_path=tmp_path / "parity.log")
    assert r.ok, r.reason
    assert (r.world_size, r.per_rank_batch, r.accumulation_steps, r.global_batch) == (2, 8, 2, 32)
    assert "on 2 DDP ranks" in r.reason and "one fp32 eager process at the global batch 32" in r.reason
    assert len(r.losses_candidate) == len(r.losses_reference) == STEPS
    assert r.losses_control == ()  # within the tolerance: the control could not change the verdict
    assert r.max_rel_diff < 1e-4 and r.limit == DEFAULT_TOLERANCE  # no BatchNorm: only the sums' order differs
    d = r.to_dict()
    assert d["world_size"] == 2 and d["global_batch"] == 32
    micro = STEPS * 2
    rank0, rank1 = _lines(tmp_path / "rank0.idx"), _lines(tmp_path / "rank1.idx")
    ref = _lines(tmp_path / "ref.idx")  # the reference's micro-batches (no control: see above)
    assert len(rank0) == len(rank1) == micro and len(ref) == micro
    for k in range(micro):
        assert len(ref[k]) == 16 and len(rank0[k]) == len(rank1[k]) == 8
        assert set(rank0[k]).isdisjoint(rank1[k]) and rank0[k] + rank1[k] == ref[k]


@pytest.mark.slow
def test_a_config_broken_only_under_ddp_fails_the_check():
    r = parity_check(_ddp("biased_under_ranks"), TrialConfig(batch_size=8), steps=STEPS)
    assert not r.ok and r.checked, r.reason
    assert "numerics diverge" in r.reason and "on 2 DDP ranks" in r.reason
    assert r.max_rel_diff > r.limit and r.world_size == 2 and r.global_batch == 16
    # over the tolerance the control ran; the reference and the control, one process without a group, were not
    # biased
    assert len(r.losses_control) == len(r.losses_reference) == STEPS
    assert max(abs(a - b) for a, b in zip(r.losses_reference, r.losses_control)) < 1e-4


def _rank_pids(tmp_path):
    return [int(x) for x in (tmp_path / "pids").read_text().split()]


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_check_at_once_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    r = parity_check(_ddp("raise_rank1"), TrialConfig(batch_size=8), steps=STEPS, timeout_s=120,
                     log_path=tmp_path / "parity.log")
    ended = time.time()
    assert not r.ok and r.checked and r.world_size == 2
    assert "the parity check of fp32 eager on 2 DDP ranks failed: rank 1: RuntimeError: rank 1 broke" in r.reason
    assert ended - float((tmp_path / "raised_at").read_text()) < 10  # not held up by rank 0's all-reduce
    pids = _rank_pids(tmp_path)
    assert len(pids) == 2 and alive_pids(pids + [r.child_pid]) == []
    assert "rank 1 broke" in (tmp_path / "parity.log").read_text()  # the rank's traceback is in the log


@pytest.mark.slow
def test_out_of_memory_on_one_rank_is_no_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    r = parity_check(_ddp("oom_rank1"), TrialConfig(batch_size=8), steps=STEPS, timeout_s=120)
    assert not r.ok and not r.checked and r.reason.startswith("not checked: out of memory"), r.reason
    assert "rank 1: " in r.reason and r.world_size == 2


@pytest.mark.slow
def test_a_hung_rank_is_killed_with_the_check_at_its_time_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEST_DDP_DIR", str(tmp_path))
    t0 = time.monotonic()
    r = parity_check(_ddp("hang_rank1"), TrialConfig(batch_size=8), steps=STEPS, timeout_s=40)
    assert not r.ok and "did not finish in 40 s" in r.reason and (tmp_path / "hung_at").exists(), r.reason
    assert time.monotonic() - t0 < 40 + 15
    pids = _rank_pids(tmp_path)
    assert len(pids) == 2 and alive_pids(pids + [r.child_pid]) == []
