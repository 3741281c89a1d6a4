"""Workloads for the worst-case batch and the latency bound (issue 28, items 2 and 3): their memory and latency
follow the batch in a known way, so a test knows which config must be refused."""

from __future__ import annotations

import itertools
import time

import torch
from torch import nn

SHORT, LONG, N, N_LONG = 8, 1024, 256, 8
WIDE = 16384  # floats per token in the forward: 64 KiB a token, so a batch's memory follows its longest sequence


class Sequences(torch.utils.data.Dataset):
    """Token sequences of length SHORT, but for the last N_LONG items, of length LONG."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        n = LONG if i >= N - N_LONG else SHORT
        return torch.full((n,), 1 + i % 97, dtype=torch.long), i % 2


def pad(items):
    longest = max(len(x) for x, _ in items)
    tokens = torch.zeros(len(items), longest, dtype=torch.long)
    for row, (x, _) in enumerate(items):
        tokens[row, :len(x)] = x
    return tokens, torch.tensor([y for _, y in items])


class LateLongOnes(torch.utils.data.Sampler):
    """A million short items first, the long ones at the very end: the real run meets them hours in, a trial's
    windows never do (as a dataset sorted by arrival, or a curriculum, would)."""

    def __len__(self) -> int:
        return 10**6 + N_LONG

    def __iter__(self):
        short = itertools.islice(itertools.cycle(range(N - N_LONG)), 10**6)
        return itertools.chain(short, range(N - N_LONG, N))


class Widens(nn.Module):
    """Each token widened to WIDE floats in the forward (and its gradient in the backward): cheap in compute,
    memory proportional to batch x longest sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.fc = nn.Linear(16, 2)

    def forward(self, tokens):
        e = self.emb(tokens)
        wide = e.repeat(1, 1, WIDE // 16)  # B x L x WIDE, resident while it lives
        return self.fc(wide.view(*tokens.shape, WIDE // 16, 16).mean(dim=(1, 2)))


def long_tail(image_size: int = 32):
    """Short batches in every trial; the longest batch (by ``length``) needs ~0.5 GiB more at batch size 8."""
    return {"model": Widens(), "dataset": Sequences(), "loss_fn": nn.CrossEntropyLoss(), "collate_fn": pad,
            "sampler": LateLongOnes(), "length": lambda item: len(item[0])}


def rejected_worst_case(image_size: int = 32):
    """A worst_case_batch of the data's structure that the model's forward refuses (token ids out of range)."""
    return {**long_tail(), "worst_case_batch": lambda bs: (torch.full((bs, 64), 10_000, dtype=torch.long),
                                                           torch.zeros(bs, dtype=torch.long))}


def unlike_worst_case(image_size: int = 32):
    """A worst_case_batch unlike the data's batches (a dict, where the data gives (tokens, labels))."""
    return {**long_tail(), "worst_case_batch": lambda bs: {"tokens": torch.zeros(bs, 64, dtype=torch.long)}}


def _own_step(model, batch, optimizer, ctx):
    tokens, labels = batch
    with ctx.autocast():
        loss = nn.functional.cross_entropy(model(tokens), labels)
    ctx.backward(loss)
    ctx.optimizer_step(optimizer)
    return loss


def rejected_in_the_step(image_size: int = 32):
    """With its own step the check child does not run the model: the worst-case child finds the rejection."""
    return {**rejected_worst_case(), "step": _own_step}


class Latency(nn.Module):
    """A step takes 4 ms plus 0.5 ms per sample: larger batches are faster per sample, slower per step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        time.sleep(0.004 + 0.0005 * x.shape[0])
        return self.fc(x.mean(dim=(2, 3)))


def latency(image_size: int = 16):
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 3, image_size, image_size, generator=g),
                                          torch.randint(0, 10, (512,), generator=g))
    return Latency(), data, nn.CrossEntropyLoss()


def make_rec(**over):
    """A Recommendation with plain figures (its own copy: test files are being moved into subfolders)."""
    from autotune.config import TrialConfig, Workload
    from autotune.recommendation import Recommendation

    fields = dict(config=TrialConfig(batch_size=4), workload=Workload(model="tests.limits_workloads:latency",
                                                                      task="infer", image_size=16),
                  median_samples_per_s=600.0, iqr_samples_per_s=3.0, samples_per_s=(598.0, 600.0, 602.0),
                  baseline_samples_per_s=500.0, speedup_vs_baseline=1.2, peak_host_mb=700.0, memory_cap_mb=2048.0,
                  margin_vs_runner_up=None, noisy=False, hardware={"summary": "a CPU"}, fingerprint="f0",
                  versions={"torch": "2"}, study_name="s", storage="sqlite:///t.db", trial_number=1,
                  created="2026-01-02T03:04:05+00:00")
    fields.update(over)
    return Recommendation(**fields)
