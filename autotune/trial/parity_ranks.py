"""The child of an N-rank numerics check: the candidate as N real DDP ranks, the reference and the control as one
fp32 eager process at the same global batch, on the same samples. Run as ``python -m autotune.trial.parity_ranks``
by ``parity.parity_check`` for a training workload with ``nproc_per_node`` N > 1 (issue 27 item 6).

The spec (stdin, JSON) is the one-process check's (``parity_child``) plus ``accumulation`` (micro-batches per
optimizer step on each rank) and ``timeout_s``; the result file gets the three curves, as there.

1. **The candidate** is started by the trial's own launcher, ``ddp.supervise`` (torch's ``start_processes``,
   spawn; a ``file://`` rendezvous in a 0700 folder; gloo on the loopback, NCCL one GPU per rank; the group's
   timeout is the check's): each rank runs ``rank_pass``, which builds the workload, wraps the model in DDP with
   the config's arguments (``RankGroup.wrapper``, as the trial does), and trains ``steps`` optimizer steps of
   ``accumulation`` micro-batches under DDP's ``no_sync`` but the last (``make_step``, the trial's step). A
   step's loss is the mean over its micro-batches, then over the ranks (an all-reduce every rank makes at every
   step, so all stop together at a non-finite one). A rank's failure is the check's (``ddp.RankFailure``; the
   others are killed after a short grace), and a hung rank dies with the child's tree at the check's time limit.
2. **The reference and the control** then run here, in this one process: fp32 eager, no DDP, micro-batches of
   B x N (the per-rank batch times the ranks), ``accumulation`` of them per optimizer step, so each optimizer
   step sees the global batch (B x N x accumulation) as the ranks together do; the control from the weights
   nudged by 1e-6 (``parity_child.nudged``), the noise floor, as in the one-process check.

**The same samples**: rank 0 draws the plan (``global_batches``: ``steps x accumulation`` batches of B x N
indices from the workload's sampler, else a seeded shuffle), broadcasts it to the ranks and sends it back here
with its curve. The reference's batches are the plan's; rank r's are its contiguous slice ``[r*B, (r+1)*B)`` of
each (``shard``): disjoint, and together exactly the reference's batch. (Contiguous rather than strided: a length-
bucketing sampler's batch of B stays whole on one rank.) Every sample is loaded with the global generators seeded
from its index (``SeededSamples``), so a random augmentation crops sample i alike in whichever process loads it.
Every process starts from rank 0's initial weights: rank 0 saves them before DDP broadcasts them to the others,
and the reference loads them.

**Why DDP may legitimately differ** from one process at the global batch, which the control and the tolerance
judge (``parity.judge``): BatchNorm normalises each rank's micro-batch with its own statistics (B samples, not
B x N), and DDP broadcasts rank 0's running statistics; the gradients are summed in another order (a bucketed
all-reduce, then divided by N); a loss that is not a plain mean over samples (tokens, padding) weighs the ranks'
shares as DDP averages them; dropout draws other masks. A config that is broken under DDP (a rank that sees
another model, gradients not reduced) leaves the reference's trajectory by far more.

An ``IterableDataset`` shards itself by rank (``torch.distributed.get_rank()``), so the samples of the ranks cannot
be laid out as one process's batches: such a workload is not checked (no verdict either way, said in the
recommendation), as is a check that runs out of memory.
"""

from __future__ import annotations

import copy
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from autotune.trial.parity_child import nudged, run_steps, serve
from autotune.trial.worker import apply_threads, make_step

__all__ = ["global_batches", "shard", "SeededSamples", "rank_pass", "run", "ITERABLE_NOT_CHECKED"]

ITERABLE_NOT_CHECKED = ("the workload's dataset is an IterableDataset, which shards itself by rank: its ranks' "
                        "samples cannot be laid out as one process's batches, so DDP's numerics were not compared")


def global_batches(dataset: Any, sampler: Any, *, batch: int, count: int, seed: int) -> list[list]:
    """``count`` batches of ``batch`` indices of ``dataset``: the workload's ``sampler`` batched, else a shuffle
    seeded with ``seed``; epoch after epoch as needed, each epoch's last short batch dropped (the trial's
    ``drop_last``). Fewer samples than one batch is a ValueError.

    >>> global_batches(range(5), None, batch=2, count=3, seed=0)
    [[4, 0], [1, 3], [2, 4]]
    """
    import torch

    if sampler is None:
        sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    out: list[list] = []
    while len(out) < count:
        before = len(out)
        for b in torch.utils.data.BatchSampler(sampler, batch, drop_last=True):
            out.append(list(b))
            if len(out) == count:
                break
        if len(out) == before:
            raise ValueError(f"the dataset has fewer samples than one global micro-batch of {batch} "
                             "(the batch size x the ranks)")
    return out


def shard(batches: list[list], *, rank: int, world_size: int) -> list[list]:
    """Rank ``rank``'s share of each batch: its contiguous slice, ``len(batch) // world_size`` long.

    >>> shard([[0, 1, 2, 3], [4, 5, 6, 7]], rank=1, world_size=2)
    [[2, 3], [6, 7]]
    """
    out = []
    for b in batches:
        n = len(b) // world_size
        out.append(list(b[rank * n:(rank + 1) * n]))
    return out


class SeededSamples:
    """``dataset`` whose item i is loaded with torch's and Python's generators seeded from (``seed``, i), and
    restored after: a random transform does to sample i the same in every process, whatever it loaded before."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        import hashlib
        import random

        import torch

        state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            # not hash(): a str's is salted per process
            key = int(hashlib.sha256(repr((self.seed, index)).encode()).hexdigest()[:15], 16)
            torch.manual_seed(key)
            random.seed(key)
            try:
                return self.dataset[index]
            finally:
                random.setstate(state)


def _loader(built: Any, batches: list[list], seed: int) -> Any:
    import torch

    return torch.utils.data.DataLoader(SeededSamples(built.dataset, seed), batch_sampler=batches,
                                       collate_fn=built.collate_fn, num_workers=0)


def _mean_over_ranks(torch: Any, world_size: int, device: Any) -> Any:
    """A step's loss on this rank -> the mean over the ranks (NaN anywhere is NaN everywhere)."""
    import torch.distributed as dist

    def reduce(value: float | None) -> float:
        t = torch.tensor([math.nan if value is None else value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item()) / world_size

    return reduce


def rank_pass(payload: dict, send: Any, *, device: Any, ranks: Any) -> dict:
    """One rank of the candidate (``ddp.rank_main`` calls it in the group, with the rank's ``device`` and
    ``RankGroup``): returns the global loss curve, the steps fp16's scaler skipped, and the plan (rank 0's)."""
    import torch
    import torch.distributed as dist

    from autotune.config import TrialConfig, Workload
    from autotune.workloads.build import build

    workload, config = Workload.from_dict(payload["workload"]), TrialConfig.from_dict(payload["config"])
    check = payload["parity"]
    seed, steps, accumulation = int(check["seed"]), int(check["steps"]), int(check["accumulation"])
    apply_threads(payload["config"])
    torch.manual_seed(seed)
    device.prepare(config)
    built = build(workload, seed=seed, config=config)
    if isinstance(built.dataset, torch.utils.data.IterableDataset):  # every rank alike, before any collective
        return {"unchecked": ITERABLE_NOT_CHECKED}
    plan: list[Any] = [None]
    if ranks.rank == 0:
        plan[0] = global_batches(built.dataset, built.sampler, batch=config.batch_size * ranks.world_size,
                                 count=steps * accumulation, seed=seed)
        torch.save(built.model.state_dict(), check["initial_path"])  # before DDP broadcasts them: the reference's
    dist.broadcast_object_list(plan, src=0)
    step = make_step(built.model, built.loss_fn, config, device, train=True, parts=built,
                     accumulation_steps=accumulation, wrap=ranks.wrapper(config))
    loader = _loader(built, shard(plan[0], rank=ranks.rank, world_size=ranks.world_size), seed)
    curve, _, skipped = run_steps(torch, step, loader, steps=steps, seed=seed,
                                  cuda_index=device.index if device.type == "cuda" else None, skip=set(),
                                  keep_outputs=False, accumulation=accumulation,
                                  reduce=_mean_over_ranks(torch, ranks.world_size, ranks.collective_device))
    return {"losses_candidate": curve, "skipped": sorted(skipped), "plan": plan[0] if ranks.rank == 0 else None}


def _reference_passes(spec: dict, plan: list[list], skip: set[int], initial_path: str, *,
                      needs_control: Callable[[list], bool]) -> tuple[list, list]:
    """The reference and the control, here: fp32 eager from rank 0's initial weights (the control's nudged), over
    the plan's batches of B x N, ``accumulation`` per optimizer step. The control runs only when
    ``needs_control(reference curve)`` (else its curve is empty)."""
    import torch

    from autotune.config import TrialConfig, Workload
    from autotune.machine.device import get_device
    from autotune.workloads.build import build

    workload, reference = Workload.from_dict(spec["workload"]), TrialConfig.from_dict(spec["reference"])
    candidate = TrialConfig.from_dict(spec["candidate"])
    seed, steps, accumulation = int(spec["seed"]), int(spec["steps"]), int(spec["accumulation"])
    apply_threads(spec["reference"])
    torch.manual_seed(seed)
    dev = get_device(workload.device)
    dev.prepare(reference)
    built = build(workload, seed=seed, config=candidate)  # built as each rank built it (a text workload's sampler)
    built.model.load_state_dict(torch.load(initial_path, map_location="cpu"))
    cuda_index = dev.index if dev.type == "cuda" else None
    curves: list[list] = []
    for nudge in (False, True):
        if nudge and not needs_control(curves[0]):  # the control only widens the limit (parity.control_needed)
            curves.append([])
            break
        model = copy.deepcopy(built.model)
        step = make_step(nudged(torch, model, seed) if nudge else model, built.loss_fn, reference, dev, train=True,
                         parts=built, accumulation_steps=accumulation)
        curves.append(run_steps(torch, step, _loader(built, plan, seed), steps=steps, seed=seed,
                                cuda_index=cuda_index, skip=skip, keep_outputs=False,
                                accumulation=accumulation)[0])
        del step, model
        dev.release_cached_memory()
    return curves[0], curves[1]


def run(spec: dict) -> dict:
    """The candidate's ranks, then the reference and the control here; the three curves on the steps the
    candidate's optimizer took (see the module docstring)."""
    import time

    from autotune.trial.ddp import supervise
    from autotune.trial.parity import control_needed

    world = int(spec["workload"]["nproc_per_node"])
    initial_path = str(Path(spec["result_path"]).with_name("initial.pt"))
    payload = {"workload": spec["workload"], "config": spec["candidate"],
               "measure": {"timeout_s": float(spec["timeout_s"]), "seed": int(spec["seed"]), "windows": 1},
               "parity": {"seed": spec["seed"], "steps": spec["steps"], "accumulation": spec["accumulation"],
                          "initial_path": initial_path}}
    t0 = time.perf_counter()
    done = supervise(payload, lambda event: None, rank_pass)  # raises ddp.RankFailure when a rank fails
    ranks_s = time.perf_counter() - t0
    if "unchecked" in done:
        return {"unchecked": done["unchecked"], "pid": os.getpid()}
    skipped = set(done["skipped"])
    kept = lambda xs: [x for i, x in enumerate(xs) if i not in skipped]  # noqa: E731
    cand = kept(done["losses_candidate"])
    tolerance = float(spec["tolerance"])
    ref, control = _reference_passes(spec, done["plan"], skipped, initial_path,
                                     needs_control=lambda r: control_needed(kept(r), cand, tolerance=tolerance))
    return {"losses_reference": kept(ref), "losses_candidate": cand,
            "losses_control": kept(control), "skipped_steps": sorted(i + 1 for i in skipped), "compared": "loss",
            "pid": os.getpid(), "world_size": world, "ranks_s": ranks_s}


def main() -> int:
    serve(run)
    return 0  # not reached: serve exits


if __name__ == "__main__":
    sys.exit(main())
