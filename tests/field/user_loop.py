"""The user's own script for the field-run tests, run in a child process: the README's loop under ``rec.apply()``
on the study's stored recommendation, for ``--seconds``. ``--ignore-loader``: the DataLoader is built with the
batch size only (no workers: the samples load in the training process), as a user who skipped
``rec.dataloader_kwargs()`` would."""

from __future__ import annotations

import argparse
import importlib
import time

import optuna
import torch
from torch.utils.data import DataLoader

from autotune.field import FieldSpec
from autotune.recommendation import stored_recommendation


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("storage")
    p.add_argument("study_name")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--ignore-loader", action="store_true")
    p.add_argument("--workload", default="tests.field_workloads:sleepy")
    p.add_argument("--window-s", type=float, default=0.3)
    args = p.parse_args()
    rec = stored_recommendation(optuna.load_study(study_name=args.study_name, storage=args.storage))
    module, fn = args.workload.split(":")
    model, ds, loss_fn = getattr(importlib.import_module(module), fn)(rec.workload.image_size)
    kwargs = {"batch_size": rec.config.batch_size} if args.ignore_loader else rec.dataloader_kwargs()
    loader = DataLoader(ds, shuffle=True, **kwargs)
    with rec.apply(field=FieldSpec(window_s=args.window_s, keep_every_s=1.0, host_every_s=0.5)) as run:
        model = run.prepare_model(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model.train()
        end = time.monotonic() + args.seconds
        for x, y in _forever(loader):
            x, y = run.prepare_input(x), run.prepare_input(y)
            optimizer.zero_grad(set_to_none=True)
            with run.autocast():
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            if time.monotonic() > end:
                break
    print("trained", flush=True)


def _forever(loader):
    while True:
        yield from loader


if __name__ == "__main__":
    main()
