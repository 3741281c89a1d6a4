"""User workloads (``tests.ddp_workloads:NAME``) for the DDP trials of tests/trial/test_ddp.py and the N-rank
numerics checks of tests/trial/test_parity_ddp.py: a tiny MLP that trains for real, one that runs out of memory on
rank 1 only, one that hangs on rank 1 only, one that raises on rank 1 only, one whose model DDP cannot wrap, one
whose logits are biased only under a process group of several ranks, and one that writes down the indices each
rank (and the one-process reference) trained on.

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


def _who() -> str:
    """``rank{r}`` in a process group, ``ref`` in a process without one (the numerics check's reference)."""
    import torch.distributed as dist

    return f"rank{dist.get_rank()}" if dist.is_initialized() else "ref"


def _step(misbehave=None, *, who=lambda: f"rank{_rank()}"):
    calls = {"n": 0}

    def step(model, batch, optimizer, ctx):
        import torch.distributed as dist

        calls["n"] += 1
        if calls["n"] == 1 and dist.is_initialized():
            _note("pids", str(os.getpid()))  # the ranks: none may outlive the trial or the check
        _note(f"{who()}.idx", " ".join(str(int(i)) for i in batch["i"]))
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


def mlp_noted():
    """As ``mlp``, each process writing the indices of every micro-batch it trained on to ``{who}.idx``: ``rank{r}``
    in a process group, ``ref`` without one (the reference, then the control, of a numerics check)."""
    return {**mlp(), "step": _step(who=_who)}


def _raise_on_rank1(n: int) -> None:
    if _rank() == 1 and n >= 3:
        _note("raised_at", repr(time.time()))
        raise RuntimeError("rank 1 broke at its 3rd step (raised by the test)")


def raise_rank1():
    """Rank 1 raises at its 3rd step; rank 0 is then left waiting in the gradients' all-reduce."""
    return {**mlp(), "step": _step(_raise_on_rank1)}


class _BiasedUnderRanks(nn.Module):
    """The tiny MLP, but in a process group of several ranks its logits get a large bias on one class: what a
    config whose numerics break only under DDP looks like to the N-rank numerics check."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp()

    def forward(self, x):
        import torch.distributed as dist

        out = self.body(x)
        if dist.is_initialized() and dist.get_world_size() > 1:
            return out + torch.tensor([20.0, 0.0, 0.0, 0.0], dtype=out.dtype)
        return out


def biased_under_ranks():
    return {**mlp(), "model": _BiasedUnderRanks()}


class _TinyBN(nn.Module):
    """A tiny conv net with BatchNorm on 16 px images: per-rank batch statistics make DDP differ from one process."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x):
        return self.net(x)


def tiny_bn(image_size: int = 16):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 3, image_size, image_size, generator=g),
                                          torch.randint(0, 10, (256,), generator=g))
    return _TinyBN(), data, nn.CrossEntropyLoss()
