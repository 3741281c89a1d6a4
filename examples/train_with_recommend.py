"""Train a torchvision model with the settings autotune measured as fastest on this machine.

The first run tunes (within --budget and/or --trials) and stores the study; later runs with the same model,
image size and storage answer from the stored recommendation at once.

    python examples/train_with_recommend.py --model resnet18 --image-size 224 --budget 20m
    python examples/train_with_recommend.py --model mobilenet_v3_small --image-size 128 --trials 10 \
        --storage sqlite:///trials/autotune.db
    python examples/train_with_recommend.py --model resnet18 --global-batch 256   # keep 256 samples per step

The training loop below is ordinary PyTorch; autotune only supplies the DataLoader keyword arguments and,
through ``rec.apply()``, the threads, cudnn.benchmark, channels_last, torch.compile, autocast and (for fp16) the
GradScaler. The README's usage loop is this one. With ``--global-batch N`` the batch size is a micro-batch and
the loop accumulates ``run.accumulation_steps`` of them (N samples) per optimizer step, as the trials measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms

import autotune


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", help="torchvision classification model (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=224, help="square image size in pixels (default: %(default)s)")
    p.add_argument("--budget", default="20m", help="time the tuning may take, e.g. 90s, 20m, 2h (default: %(default)s)")
    p.add_argument("--trials", type=int, default=None, help="stop the search after this many trials")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: sqlite:///trials/autotune.db)")
    p.add_argument("--space", default=None, help="search space YAML (default: the shipped one for the device)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps to run (default: %(default)s)")
    p.add_argument("--global-batch", type=int, default=None, metavar="N",
                   help="samples per optimizer step to keep: tune the micro-batch, accumulate gradients")
    p.add_argument("--quick", action="store_true", help="very short measurements (for smoke tests, not for real use)")
    return p.parse_args()


def main() -> None:
    args = parse_args()

    # 1. Ask autotune. This runs trials only when no recommendation for this workload and machine is stored.
    measure = None
    if args.quick:
        measure = autotune.MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0)
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    rec = autotune.recommend(args.model, image_size=args.image_size, budget=args.budget, trials=args.trials,
                             storage=args.storage, space=args.space, measure=measure, global_batch=args.global_batch)
    from_cache = dt.datetime.fromisoformat(rec.created) < started
    print("recommendation from cache (no new trials)" if from_cache else "recommendation freshly measured")
    print(rec.summary())

    # Some settings are read once, when a process starts (OpenMP's thread count, glibc's malloc, PyTorch's
    # huge-page switch): start this script again with them, as the measured trial was. The second start finds
    # the recommendation stored and goes straight to training.
    missing = {k: v for k, v in rec.launch_env().items() if os.environ.get(k) != v}
    if missing and not os.environ.get("AUTOTUNE_EXAMPLE_RELAUNCHED"):
        print("restarting with " + " ".join(f"{k}={v}" for k, v in missing.items()), flush=True)
        env = {**os.environ, **missing, "AUTOTUNE_EXAMPLE_RELAUNCHED": "1"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    # 2. Data and model: your own code. Only the DataLoader keyword arguments come from the recommendation.
    loader_kwargs = rec.dataloader_kwargs()
    batch_size = loader_kwargs["batch_size"]  # the micro-batch when a global batch is kept
    accumulation = rec.accumulation_steps  # micro-batches per optimizer step (1 without a global batch)
    transform = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    # exactly --steps optimizer steps of full batches: one pass over the loader is the whole run
    dataset = torchvision.datasets.FakeData(size=max(1, args.steps) * accumulation * batch_size,
                                            image_size=(3, args.image_size, args.image_size),
                                            num_classes=10, transform=transform)
    loader = DataLoader(dataset, shuffle=True, drop_last=True, **loader_kwargs)
    # two held-out batches to predict on after training (other images: a different random offset)
    held_out = torchvision.datasets.FakeData(size=2 * batch_size, image_size=(3, args.image_size, args.image_size),
                                             num_classes=10, transform=transform, random_offset=len(dataset))
    eval_loader = DataLoader(held_out, **loader_kwargs)
    model = torchvision.models.get_model(args.model, weights=None, num_classes=10)
    loss_fn = torch.nn.CrossEntropyLoss()

    # 3. Train with the recommended process settings; they are restored when the block ends.
    with rec.apply() as run:
        model = run.prepare_model(model.to(rec.workload.device))  # + channels_last / torch.compile
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = run.grad_scaler()  # a GradScaler for fp16 on a GPU, else None
        model.train()
        loss = torch.tensor(float("nan"))
        optimizer_steps = 0
        t0 = time.perf_counter()
        for i, (images, labels) in enumerate(loader):
            images, labels = run.prepare_input(images), run.prepare_input(labels)  # inputs AND targets to the device
            with run.autocast():
                loss = loss_fn(model(images), labels)
            # gradients add up over run.accumulation_steps micro-batches: each loss is a share of the global batch's
            scaled = loss / run.accumulation_steps
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
            if (i + 1) % run.accumulation_steps:
                continue  # not the last micro-batch of this optimizer step
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            optimizer_steps += 1
        elapsed = time.perf_counter() - t0

        # 4. Predict: eval mode (batch norm uses its running statistics, dropout is off) and no autograd, under
        # the same autocast. Tuning with task="infer" (--task infer) measures exactly this loop.
        model.eval()
        correct = seen = 0
        with torch.inference_mode(), run.autocast():
            for images, labels in eval_loader:
                images, labels = run.prepare_input(images), run.prepare_input(labels)
                correct += int((model(images).argmax(dim=1) == labels).sum())
                seen += len(labels)

    print(f"final loss {loss.item():.4f} after {optimizer_steps} steps; {optimizer_steps / elapsed:.2f} steps/s "
          f"({optimizer_steps * accumulation * batch_size / elapsed:.1f} samples/s)")
    if rec.global_batch:
        print(f"{optimizer_steps} optimizer steps of {accumulation} micro-batches of {batch_size} = "
              f"{accumulation * batch_size} samples each")
    print(f"eval: {correct}/{seen} held-out images right (model.eval(), torch.inference_mode())")


if __name__ == "__main__":
    main()
