"""Workloads whose speed or memory depends on the config in a known way, for tuner tests."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset


def _data(image_size: int, n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, image_size, image_size, generator=g),
                         torch.randint(0, 10, (n,), generator=g))


class _Sleepy(nn.Module):
    """Each forward takes 20 ms whatever the batch: throughput is proportional to the batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        time.sleep(0.02)
        return self.fc(x.mean(dim=(2, 3)))


def sleepy(image_size: int = 16):
    return _Sleepy(), _data(image_size), nn.CrossEntropyLoss()


class _BatchHog(nn.Module):
    """Holds 48 MiB per sample during forward: memory grows with the batch size, like activations do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        hog = torch.ones(x.shape[0], 48 * 2**20 // 4)  # touched, so resident
        time.sleep(0.05)  # long enough for the parent's 0.1 s memory sampling to see it
        return self.fc(x.mean(dim=(2, 3))) + hog[:, :1] * 0


def batch_hog(image_size: int = 16):
    return _BatchHog(), _data(image_size, n=256), nn.CrossEntropyLoss()


class _KillsItsWorker(torch.utils.data.Dataset):
    """Fine in the main process; a DataLoader worker that loads from it is SIGKILLed (like the OOM killer)."""

    def __init__(self, image_size: int) -> None:
        self.inner = _data(image_size, n=256)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        import os
        import signal

        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner[i]


def worker_killer(image_size: int = 16):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
    return model, _KillsItsWorker(image_size), nn.CrossEntropyLoss()
