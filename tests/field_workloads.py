"""A data-bound workload for the field-run tests (``tests.field_workloads:sleepy``): each sample waits 30 ms, as a
read from a slow disk does, so loading in the training process makes the step wait, and DataLoader workers (which
overlap the waits, whatever the cores) feed it about twice as fast. Imported by trial children: no pytest."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset

SAMPLE_WAIT_S = 0.03


class SleepyImages(Dataset):
    def __init__(self, image_size: int, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 3, image_size, image_size, generator=g)
        self.y = torch.randint(0, 10, (64,), generator=g)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(SAMPLE_WAIT_S)
        return self.x[i % 64], self.y[i % 64]


def sleepy(image_size: int = 16, task: str = "train"):
    """A tiny conv net fed by a dataset that waits 30 ms a sample."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    return model, SleepyImages(image_size), nn.CrossEntropyLoss()


SPACE = """\
name: sleepy
device: cpu
parameters:
  batch_size: {type: int, choices: [16]}
  num_workers: {type: int, choices: [0, 2]}
baseline: {batch_size: 16, num_workers: 0}
"""
