"""One DDP rank of a trial: its process group, its shard of the data, its model wrapped, its windows aligned.

Each rank is a process the trial child starts (``autotune.trial.ddp``) and runs the trial's own code
(``worker.run``) with a ``RankGroup``, which changes four things and nothing else:

- **the model** is wrapped in ``DistributedDataParallel`` (training; inference has no gradients to reduce) after
  it is on the rank's device and before ``torch.compile``, as torch's DDP notes ask; the user's step gets the
  wrapped model, unchanged otherwise;
- **the data**: a map-style dataset without a sampler gets a ``DistributedSampler`` (shuffled, seeded, equal
  shards); the workload's own sampler is sharded (``ShardedSampler``: every world_size-th index of it, from the
  rank's offset, so the shards are disjoint and the user's order is kept within each); an ``IterableDataset``
  must shard itself (``torch.distributed.get_rank()``), as torch's docs say;
- **the steps**: rank 0 leads. Every step outside a window and every window is a command it broadcasts, so all
  ranks run the same number of steps (DDP's all-reduce in each backward needs every rank; a rank that ran one
  step more would hang the others). A window is a fixed number of steps, chosen by rank 0 from its last step time
  to last about ``window_s``, between a barrier (the windows start together) and an all-gather of each rank's
  samples, time, data wait and compute (so they end together, and every rank's figures reach rank 0);
- **the figures**: a window's throughput is all ranks' samples over the longest rank's time (the slowest rank
  decides); its data wait and compute are that rank's; each rank's own are kept (``per_rank``).

The leader's protocol decisions (warm-up, settled windows, pruning) are its own, made on the global figures; the
followers only obey, so no time-based decision can differ between ranks.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Iterator

__all__ = ["RankGroup", "ShardedSampler", "STOP", "STEP", "WINDOW"]

STOP, STEP, WINDOW = 0, 1, 2
_FIELDS = ("samples", "elapsed", "data_wait_s", "compute_s", "tokens")
_MAX_WINDOW_STEPS = 1_000_000


class ShardedSampler:
    """The rank's share of another sampler: its ``rank``-th of every ``world_size`` indices, cut to the same
    length on every rank (so every rank has as many batches per epoch).

    >>> list(ShardedSampler(range(10), rank=1, world_size=3))
    [1, 4, 7]
    """

    def __init__(self, sampler: Any, *, rank: int, world_size: int) -> None:
        self.sampler, self.rank, self.world_size = sampler, rank, world_size

    def __len__(self) -> int:
        return len(self.sampler) // self.world_size

    def __iter__(self) -> Iterator[Any]:
        n = len(self)
        for i, index in enumerate(self.sampler):
            if i // self.world_size >= n:
                return
            if i % self.world_size == self.rank:
                yield index


class RankGroup:
    """This rank's part in the trial's process group (``torch.distributed`` is initialised before it is made).

    ``dev``: the rank's device (``autotune.machine.device``), for its memory peak. ``collective_device``: where
    the small tensors of the protocol live (the CPU for gloo, the rank's GPU for NCCL, which moves only device
    tensors)."""

    def __init__(self, rank: int, world_size: int, dev: Any, *, seed: int = 0, collective_device: Any = "cpu",
                 device_ids: list[int] | None = None, measured: int = 1) -> None:
        self.rank, self.world_size, self.dev, self.seed = rank, world_size, dev, seed
        self.measured = measured  # the trial's last ``measured`` windows are its measured ones (before: warm-up)
        self.collective_device, self.device_ids = collective_device, device_ids
        self.windows: list[list[dict]] = []  # every window's per-rank figures, as gathered (rank 0)
        self.step_s: float | None = None  # rank 0's latest time per step: how many steps fill a window

    # --- what changes in the trial ----------------------------------------------------------------------------
    def wrapper(self, config: Any) -> Any:
        """``wrap`` with the config's DDP arguments (``TrialConfig.ddp_kwargs``: bucket size, gradients as
        bucket views, static graph)."""
        return lambda model: self.wrap(model, **config.ddp_kwargs())

    def wrap(self, model: Any, **ddp_kwargs: Any) -> Any:
        """The model in DDP; a model DDP refuses is the workload's fault, named (``WorkloadError``)."""
        from torch.nn.parallel import DistributedDataParallel

        from autotune.errors import WorkloadError

        try:
            return DistributedDataParallel(model, device_ids=self.device_ids, **ddp_kwargs)
        except (RuntimeError, ValueError, AssertionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise WorkloadError(f"DistributedDataParallel cannot wrap the workload's model: {reason}") from exc

    def shard(self, loader_kw: dict[str, Any], dataset: Any) -> dict[str, Any]:
        """``loader_kwargs`` for this rank's shard of the data (see the module docstring)."""
        import torch
        from torch.utils.data.distributed import DistributedSampler

        kw = dict(loader_kw)
        if kw.get("sampler") is not None:
            kw["sampler"] = ShardedSampler(kw["sampler"], rank=self.rank, world_size=self.world_size)
        elif not isinstance(dataset, torch.utils.data.IterableDataset):
            kw.pop("shuffle", None)
            kw.pop("generator", None)
            kw["sampler"] = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True,
                                               seed=self.seed, drop_last=True)
        return kw

    # --- the protocol -----------------------------------------------------------------------------------------
    def _command(self, kind: int = STOP, steps: int = 0) -> tuple[int, int]:
        """Rank 0's command to every rank (its arguments; the others' are ignored): (kind, steps)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([kind, steps], dtype=torch.int64, device=self.collective_device)
        dist.broadcast(t, src=0)
        return int(t[0]), int(t[1])

    def _gather(self, figures: dict) -> list[dict]:
        """Every rank's window figures, in rank order, on every rank (an all-gather: the window ends for all)."""
        import torch
        import torch.distributed as dist

        mine = torch.tensor([float(figures[f]) for f in _FIELDS], dtype=torch.float64, device=self.collective_device)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine)
        return [dict(zip(_FIELDS, (float(v) for v in t.cpu().tolist()))) for t in out]

    def _run_window(self, stepper: Any, steps: int) -> dict:
        """``steps`` steps on this rank, started together after a barrier, synchronised once at the end."""
        import torch.distributed as dist

        dist.barrier()
        samples, tokens0 = 0, stepper.tokens
        stepper.timer.start()
        start = time.perf_counter()
        for _ in range(steps):
            samples += stepper.step(stepper.timer)
        wait, comp = stepper.timer.finish()
        return {"samples": samples, "elapsed": time.perf_counter() - start, "data_wait_s": wait / steps,
                "compute_s": comp / steps, "tokens": stepper.tokens - tokens0}

    def follow(self, stepper: Any) -> dict:
        """A follower's trial: rank 0's commands until it says stop; returns this rank's last figures."""
        while True:
            kind, steps = self._command()
            if kind == STOP:
                return {"ranks": self._finish_figures()}
            if kind == STEP:
                stepper.timed_step()
            else:
                self._gather(self._run_window(stepper, steps))

    def lead(self, stepper: Any) -> "LeadStepper":
        """Rank 0's stepper: each of its steps and windows is first commanded to every rank."""
        return LeadStepper(self, stepper)

    def finish(self, out: dict) -> dict:
        """Rank 0, after measuring: stop the followers, gather their last figures; ``out`` with the ranks'."""
        self._command(STOP)
        last = self._finish_figures()
        per_rank = self.per_rank(last)
        devices = [r["peak_device_mb"] for r in per_rank if r.get("peak_device_mb") is not None]
        return {**out, "world_size": self.world_size, "ranks": per_rank,
                "peak_device_mb": max(devices) if devices else out.get("peak_device_mb")}

    def _finish_figures(self) -> list[dict]:
        """Each rank's threads and device peaks, gathered (a collective every rank makes once, at the end)."""
        import torch
        import torch.distributed as dist

        peak = self.dev.peak_memory_mb()
        mine = torch.tensor([float(torch.get_num_threads()), -1.0 if peak is None else float(peak)],
                            dtype=torch.float64, device=self.collective_device)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(out, mine)
        return [{"threads": int(t[0]), "peak_device_mb": None if t[1] < 0 else round(float(t[1]), 1)} for t in out]

    def per_rank(self, last: list[dict]) -> list[dict]:
        """Each rank's window rates and medians over the measured windows, with its threads and device peak."""
        out = []
        for r in range(self.world_size):
            mine = [w[r] for w in self.windows[-self.measured:]]
            rates = [w["samples"] / w["elapsed"] for w in mine if w["elapsed"] > 0]
            wait = statistics.median([w["data_wait_s"] for w in mine]) if mine else None
            comp = statistics.median([w["compute_s"] for w in mine]) if mine else None
            share = wait / (wait + comp) if wait is not None and comp and wait + comp > 0 else None
            out.append({"rank": r, "samples_per_s": [round(x, 3) for x in rates],
                        "median_samples_per_s": round(statistics.median(rates), 3) if rates else None,
                        "data_wait_s_per_step": wait, "compute_s_per_step": comp,
                        "data_wait_share": None if share is None else round(share, 4), **last[r]})
        return out


class LeadStepper:
    """Rank 0's view of the trial's stepper (``worker``'s): the same methods, each step and window commanded to
    every rank first, a window's figures global (all ranks' samples over the slowest rank's time)."""

    def __init__(self, group: RankGroup, stepper: Any) -> None:
        self.group, self.inner = group, stepper

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def timed_step(self) -> float:
        self.group._command(STEP)
        took = self.inner.timed_step()
        self.group.step_s = took
        return took

    def step(self, timer: Any = None) -> int:
        # profiling steps: not supported with ranks (refused up front), so a bare step would hang the others
        raise RuntimeError("a step outside the leader's protocol would leave the other ranks behind")

    def window(self, spec: Any) -> dict:
        group = self.group
        step_s = group.step_s or spec.window_s
        steps = max(spec.min_window_steps, min(_MAX_WINDOW_STEPS, math.ceil(spec.window_s / max(step_s, 1e-6))))
        group._command(WINDOW, steps)
        gathered = group._gather(group._run_window(self.inner, steps))
        group.windows.append(gathered)
        slowest = max(gathered, key=lambda w: w["elapsed"])
        elapsed = slowest["elapsed"]
        group.step_s = elapsed / steps
        samples = int(sum(w["samples"] for w in gathered))
        tokens = sum(w["tokens"] for w in gathered)
        counted = {"tokens_per_s": tokens / elapsed} if self.inner.counts_tokens else {}
        return {"samples_per_s": samples / elapsed, "steps": steps, "data_wait_s": slowest["data_wait_s"],
                "compute_s": slowest["compute_s"], "started": time.perf_counter() - elapsed, "elapsed": elapsed,
                "samples": samples, "rank_samples_per_s": [round(w["samples"] / w["elapsed"], 3) for w in gathered],
                **counted}
