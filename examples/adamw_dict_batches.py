"""Tune your own training, not a stand-in: AdamW, gradient clipping, dict batches and a custom collate.

The workload function ``build`` returns, besides the model and dataset, its own optimizer factory, collate_fn,
training step and count (the workload contract: ``autotune.workloads.contract``). Every trial then measures this step:
AdamW's two extra copies of the weights are in the measured peak memory, the clipping in the step time. Run it
from the repository root (the folder that contains ``examples/``):

    python examples/adamw_dict_batches.py --trials 4 --storage sqlite:///trials/adamw.db

    # or one config, through the CLI
    autotune trial --model examples.adamw_dict_batches:build --image-size 32 --batch-size 16

It tunes (``autotune.tune(build, ...)``; a second run answers from the stored recommendation), prints the
recommendation and which parts of the training were yours, then trains a few steps with it, using the same
step, the recommended DataLoader settings and ``rec.apply()``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 10


class Pixels(Dataset):
    """Dict items ``{"pixels": 3xSxS float, "label": int64}``, made on the fly (as decoding a file would be)."""

    def __init__(self, image_size: int, length: int = 512) -> None:
        self.image_size, self.length = image_size, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        label = index % NUM_CLASSES
        x = 0.1 * torch.randn(3, self.image_size, self.image_size, generator=g)
        x[label % 3] += 0.5  # a learnable hint: the class moves one channel
        return {"pixels": x, "label": torch.tensor(label)}


def collate(items: list[dict]) -> dict:
    return {"pixels": torch.stack([it["pixels"] for it in items]), "label": torch.stack([it["label"] for it in items])}


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)


def train_step(model: nn.Module, batch: dict, optimizer, ctx) -> torch.Tensor:
    """One training step: autotune calls it with the batch on the device; ``ctx`` brings the trial's AMP."""
    with ctx.autocast():
        loss = nn.functional.cross_entropy(model(batch["pixels"]), batch["label"])
    ctx.backward(loss)
    ctx.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ctx.optimizer_step(optimizer)  # steps (through the grad scaler under fp16) and zeroes the gradients
    return loss


def count(batch: dict) -> int:
    return len(batch["label"])


def make_model(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(2 * width, NUM_CLASSES))


def build(image_size: int = 32) -> dict:
    """The workload autotune measures: everything but the DataLoader's knobs is yours."""
    return {"model": make_model(), "dataset": Pixels(image_size), "optimizer": adamw, "collate_fn": collate,
            "step": train_step, "count": count}


class _Ctx:
    """The same helpers outside autotune, from the applied recommendation (no grad scaler on the CPU)."""

    def __init__(self, run) -> None:
        self.autocast, self.scaler = run.autocast, None

    def backward(self, loss):
        loss.backward()

    def unscale_(self, optimizer):
        pass

    def optimizer_step(self, optimizer):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> None:
    import autotune
    from autotune import MeasureSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--budget", default=None, help="a duration like 10m (default: only --trials)")
    ap.add_argument("--storage", default=None)
    ap.add_argument("--space", default=None)
    ap.add_argument("--steps", type=int, default=5, help="training steps with the recommendation")
    ap.add_argument("--quick", action="store_true", help="short measurement windows (for tests)")
    args = ap.parse_args(argv)

    measure = MeasureSpec(windows=2, window_s=0.2, warmup_min_s=0.0, warmup_min_steps=2) if args.quick else None
    rec = autotune.tune(build, image_size=args.image_size, trials=args.trials, budget=args.budget,
                        storage=args.storage, space=args.space, measure=measure, device="cpu", progress=False)
    print(rec.summary())
    print(f"user parts: {', '.join(rec.user_parts)}")

    model, dataset = make_model(), Pixels(args.image_size)
    loader = DataLoader(dataset, collate_fn=collate, shuffle=True, drop_last=True, **rec.dataloader_kwargs())
    with rec.apply() as run:
        model = run.prepare_model(model)
        optimizer, ctx = adamw(model.parameters()), _Ctx(run)
        t0, loss, it = time.perf_counter(), None, iter(loader)
        for _ in range(args.steps):
            batch = next(it)
            batch = {"pixels": run.prepare_input(batch["pixels"]), "label": batch["label"]}
            loss = train_step(model, batch, optimizer, ctx)
        print(f"final loss {loss.item():.4f} after {args.steps} steps; "
              f"{args.steps / (time.perf_counter() - t0):.1f} steps/s")


if __name__ == "__main__":
    main()
