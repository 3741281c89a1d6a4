"""Variable-length workloads whose first items are short and the rest long (issue 52, items 1 and 13): a padding
collate pads a batch to its longest item, so a batch of 64 is ~32 MiB while the first 4 items make a batch of a few
KiB. ``DIM`` float32 features per position: an item of 512 positions is 512 KiB."""

from __future__ import annotations

import torch
from torch import nn

DIM = 256
SHORT, LONG = 10, 512


class Tail(torch.utils.data.Dataset):
    """Items ``(features [length, DIM], label)`` with the given lengths, made when asked (1004 long items would
    be 500 MiB held)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        return torch.full((self.lengths[i], DIM), float(i % 7)), i % 2


def pad(items: list) -> tuple:
    """Pads the batch to its longest item, as a tokenizer's collator does: plain (not shared) memory, which a
    DataLoader worker's queue moves to /dev/shm when it hands the batch over."""
    xs = nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
    return xs, torch.tensor([y for _, y in items])


class Pool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(DIM, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.mean(1))


def _workload(lengths: list[int], *, with_length: bool) -> dict:
    torch.manual_seed(0)
    out = {"model": Pool(), "dataset": Tail(lengths), "collate_fn": pad, "loss_fn": nn.CrossEntropyLoss()}
    if with_length:
        out["length"] = lambda item: int(item[0].shape[0])
    return out


def short_first():
    """The issue's lengths, ``[10] * 4 + [512] * 1000``, with ``length``."""
    return _workload([SHORT] * 4 + [LONG] * 1000, with_length=True)


def short_first_unsized():
    """The same data without ``length``: nothing before a trial says how long its items are."""
    return _workload([SHORT] * 4 + [LONG] * 1000, with_length=False)


def short_batch_first():
    """``[10] * 64 + [512] * 1000`` without ``length``: a full batch of the first items is short too, so only a
    batch the trial's shuffled loader draws overflows /dev/shm; the parent sees it in the trial's log."""
    return _workload([SHORT] * 64 + [LONG] * 1000, with_length=False)
