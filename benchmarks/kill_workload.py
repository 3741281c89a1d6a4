"""The workload `benchmarks/kill_anywhere.py` runs the real CLI on: tiny and cheap (it sleeps rather than computes,
so the shared machine's other work moves it little), built so that one run goes through every phase a run has.

- the data path costs ``ITEM_S`` a sample in whichever process loads it: the baseline (no workers) waits for data
  ~40% of its step, so the ceilings are climbed, and a worker feeds the model;
- a step costs ``STEP_S``, less with bf16 (x0.75) and channels_last (x0.97): the winner has both, so it is checked
  for numerics and confirmed against the baseline; a config with one of them fewer is a few % behind and lighter,
  often within the noise of two rounds, so extra rounds settle the two;
- each process has a level of its own (x0.9 to x1.1, from its pid), as a fresh process on these VMs has;
- it returns ``worst_case_batch``, so the winner's worst case is checked in a child.
"""

from __future__ import annotations

import os
import random
import time

import torch
from torch import nn

ITEM_S = 0.0004
STEP_S = 0.020
LEVEL = random.Random(os.getpid()).uniform(0.9, 1.1)


class _Data(torch.utils.data.Dataset):
    def __init__(self, image_size: int, n: int = 512) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, image_size, image_size, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(ITEM_S)
        return self.x[i], self.y[i]


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        s = STEP_S * LEVEL
        if torch.is_autocast_enabled("cpu"):
            s *= 0.75
        if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            s *= 0.97
        time.sleep(s)
        return self.fc(x.mean(dim=(2, 3)))


def build(image_size: int = 16):
    size = image_size
    return {"model": _Model(), "dataset": _Data(size), "loss_fn": nn.CrossEntropyLoss(),
            "worst_case_batch": lambda bs: (torch.randn(bs, 3, size, size), torch.randint(0, 10, (bs,)))}
