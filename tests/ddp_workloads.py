"""User workloads (``tests.ddp_workloads:NAME``) for the DDP trials of tests/test_ddp.py: a tiny MLP that
trains for real, one that runs out of memory on rank 1 only, one that hangs on rank 1 only, one whose model
DDP cannot wrap, and one that writes down the indices each rank trained on.

What a test needs to see from inside a rank is written to files under ``$AUTOTUNE_TEST_DDP_DIR``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

_DIR = "AUTOTUNE_TEST_DDP_DIR"


class Indexed(torch.utils.data.Dataset):
    """Random vectors and labels, each item carrying its index."""

    def __init__(self, n: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return {"x": self.x[i], "y": self.y[i], "i": torch.tensor(i)}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _note(name: str, text: str) -> None:
    folder = os.environ.get(_DIR)
    if folder:
        with open(Path(folder) / name, "a") as f:
            f.write(text + "\n")


def _step(misbehave=None):
    calls = {"n": 0}

    def step(model, batch, optimizer, ctx):
        calls["n"] += 1
        _note(f"rank{_rank()}.idx", " ".join(str(int(i)) for i in batch["i"]))
        if misbehave is not None:
            misbehave(calls["n"])
        with ctx.autocast():
            loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        ctx.backward(loss)
        ctx.optimizer_step(optimizer)
        return loss

    return step


def mlp():
    """A tiny MLP on indexed vectors; each rank writes the indices it trained on to ``rank{r}.idx``."""
    return {"model": _mlp(), "dataset": Indexed(), "step": _step(), "count": lambda b: len(b["y"])}


def mlp_sampled():
    """As ``mlp``, with the workload's own sampler (in order): each rank gets its share of it."""
    data = Indexed()
    return {**mlp(), "dataset": data, "sampler": torch.utils.data.SequentialSampler(data)}


def _oom_on_rank1(n: int) -> None:
    if _rank() == 1 and n >= 4:
        _note("oom_at", repr(time.time()))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (raised by the test on rank 1)")


def oom_rank1():
    """Rank 1 runs out of memory at its 4th step; rank 0 is then left waiting in the gradients' all-reduce."""
    return {**mlp(), "step": _step(_oom_on_rank1)}


def _hang_on_rank1(n: int) -> None:
    if _rank() == 1 and n >= 4:
        _note("hung_at", repr(time.time()))
        time.sleep(3600)


def hang_rank1():
    """Rank 1 stops at its 4th step (rank 0 waits for it in a collective): only the time limit ends it."""
    return {**mlp(), "step": _step(_hang_on_rank1)}


def frozen():
    """A model with no parameter that needs a gradient: DDP refuses to wrap it."""
    model = _mlp()
    for p in model.parameters():
        p.requires_grad_(False)
    return {**mlp(), "model": model}
