"""User workloads (``tests.data_fit_workloads:NAME``) whose data, not their name, decides the search space:
a sequence classifier with dict batches, a padding collate and ``length``; an image one with dict batches; and
workloads whose ``length`` returns what it must not. Tiny, so the check child builds them in well under a second."""

from __future__ import annotations

import torch
from torch import nn

PAD = 0


class Sentences(torch.utils.data.Dataset):
    """``n`` token sequences of 2 to ``max_len`` tokens (ids 1..vocab-1), items as a tokenizer gives them."""

    def __init__(self, n: int = 96, max_len: int = 24, vocab: int = 50) -> None:
        g = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(2, max_len + 1, (n,), generator=g)
        self.ids = [torch.randint(1, vocab, (int(k),), generator=g) for k in self.lengths]
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "label": self.labels[i]}


def pad(items: list[dict]) -> dict:
    ids = nn.utils.rnn.pad_sequence([it["input_ids"] for it in items], batch_first=True, padding_value=PAD)
    return {"input_ids": ids, "attention_mask": ids != PAD, "labels": torch.stack([it["label"] for it in items])}


class Bag(nn.Module):
    """Embeddings averaged over the real tokens, a linear head: an embedding model in a few hundred weights."""

    def __init__(self, vocab: int = 50, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        keep = attention_mask.unsqueeze(-1).float()
        return self.head((self.embed(input_ids) * keep).sum(1) / keep.sum(1).clamp(min=1))


def step(model, batch, optimizer, ctx):
    with ctx.autocast():
        loss = nn.functional.cross_entropy(model(batch["input_ids"], batch["attention_mask"]), batch["labels"])
    ctx.backward(loss)
    ctx.optimizer_step(optimizer)
    return loss


def sequences():
    """A Hugging Face-style text classifier: dict batches, a padding collate, its own step and ``length``."""
    torch.manual_seed(0)
    return {"model": Bag(), "dataset": Sentences(), "collate_fn": pad, "step": step,
            "optimizer": lambda params: torch.optim.AdamW(params, lr=1e-3),
            "count": lambda batch: (len(batch["labels"]), int(batch["attention_mask"].sum())),
            "length": lambda item: len(item["input_ids"])}


class Pixels(torch.utils.data.Dataset):
    def __init__(self, image_size: int, n: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, image_size, image_size, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"image": {"pixels": self.x[i]}, "label": self.y[i]}  # nested: the tensor sits two levels down


def images(image_size: int = 32):
    """An image classifier with nested dict batches (PyTorch's default collate) and its own step."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 4))

    def image_step(model, batch, optimizer, ctx):
        with ctx.autocast():
            loss = nn.functional.cross_entropy(model(batch["image"]["pixels"]), batch["label"])
        ctx.backward(loss)
        ctx.optimizer_step(optimizer)
        return loss

    return {"model": model, "dataset": Pixels(image_size), "step": image_step,
            "count": lambda batch: len(batch["label"])}


def _with_length(length):
    out = sequences()
    out["length"] = length
    return out


def length_float():
    return _with_length(lambda item: len(item["input_ids"]) / 2)


def length_negative():
    return _with_length(lambda item: -1)


def length_text():
    return _with_length(lambda item: "long")
