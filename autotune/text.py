"""The built-in text workload: a small BERT-like encoder on synthetic token sequences, nothing downloaded.

``--model transformer`` (``transformer_tiny`` for a quick look) is a pure-PyTorch ``nn.TransformerEncoder``
classifier: token + learned position embeddings, post-LN encoder layers (GELU, as BERT), mean pooling over the
real (non-pad) tokens, a linear head, cross-entropy. For text, ``Workload.image_size`` is the **maximum sequence
length** (``--seq-len`` is the same flag as ``--image-size``, spelled for text); ``num_classes`` is the head's.

The data is a workload of the contract (``autotune.contract``): sequences of varying length drawn once from a
lognormal (median ``max_len / 4``, sigma 0.7, clipped to ``[8, max_len]``: most short, a long tail, as real
sentences and documents are), tokens taken from one random pool, so loading costs what reading an already
tokenised corpus costs. The workload brings its own parts:

* ``collate_fn``: pads each batch to its longest sequence with ``PAD`` (0); the model's attention mask is
  ``tokens != PAD`` (as a BERT's ``pad_token_id``), so the batch stays ``(tokens, labels)`` and autotune's own step
  runs it;
* ``count``: ``(samples, real tokens)``, the non-pad tokens, so tokens/s counts text, not padding;
* ``optimizer``: AdamW, as transformers are trained (its two moment buffers are part of the peak memory).

Channels-last means nothing here (no 4-D image tensors): ``fit_space`` takes it out of the search space.

>>> import autotune.workloads
>>> from autotune.config import Workload
>>> built = autotune.workloads.build(Workload(model="transformer_tiny", image_size=32, dataset_size=64))   # doctest: +SKIP
>>> tokens, labels = built.collate_fn([built.dataset[i] for i in range(4)])            # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from .errors import WorkloadError

__all__ = ["TEXT_MODELS", "PAD", "is_text", "check", "build", "pad_collate", "count_tokens", "attention_mask",
           "TokenSequences", "fit_space", "sequence_lengths"]

PAD = 0
MIN_LEN = 8
# name -> (vocabulary, d_model, layers, heads, feed-forward width)
TEXT_MODELS: dict[str, tuple[int, int, int, int, int]] = {
    "transformer": (8000, 128, 2, 4, 512),  # small (BERT-tiny-like): a trial must finish on 2 shared cores
    "transformer_tiny": (1000, 32, 1, 2, 64),
}


def is_text(model: str) -> bool:
    """Whether ``--model`` names the built-in text workload."""
    return model in TEXT_MODELS


def check(workload: Any) -> None:
    """Refuse what a text workload cannot take, in one line (the parent runs it before any child starts)."""
    if workload.data_dir is not None:
        raise WorkloadError(f"--data {workload.data_dir} is a folder of images; the text workload "
                            f"{workload.model} makes its own token sequences: drop --data")
    if workload.image_size < MIN_LEN:
        raise WorkloadError(f"--seq-len {workload.image_size} is shorter than the shortest sequence ({MIN_LEN})")


def check_config(workload: Any, config: Any) -> None:
    """Refuse a config knob that means nothing for a text workload (``autotune trial --channels-last``)."""
    if is_text(workload.model) and config.channels_last:
        raise WorkloadError(f"--channels-last applies to 4-D image tensors; the text workload {workload.model} "
                            "has none: drop it")


def sequence_lengths(n: int, max_len: int, *, seed: int = 0):
    """``n`` lengths from a lognormal with median ``max_len / 4`` (sigma 0.7), clipped to ``[8, max_len]``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=np.log(max(MIN_LEN, max_len / 4)), sigma=0.7, size=n)
    return np.clip(np.rint(raw), MIN_LEN, max_len).astype(np.int64)


class TokenSequences:
    """``n`` sequences of token ids (1..vocab-1; 0 is ``PAD``) with lengths from ``sequence_lengths``; item ``i``
    is ``(LongTensor[length_i], label)``, a slice of one random pool of tokens."""

    def __init__(self, n: int, max_len: int, *, vocab: int, num_classes: int, seed: int = 0) -> None:
        import torch

        self.lengths = sequence_lengths(n, max_len, seed=seed)
        g = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(1, vocab, (max(4 * max_len, 1 << 16),), generator=g)
        self.num_classes = num_classes
        self._span = len(self.pool) - max_len

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        start = (i * 7919) % self._span  # a prime stride: neighbouring items do not share tokens
        return self.pool[start:start + int(self.lengths[i])], i % self.num_classes


def pad_collate(items: list) -> tuple[Any, Any]:
    """``(tokens[B, longest], labels[B])``: each sequence padded with ``PAD`` to the batch's longest."""
    import torch

    seqs = [s for s, _ in items]
    tokens = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=PAD)
    return tokens, torch.tensor([y for _, y in items], dtype=torch.long)


def attention_mask(tokens: Any) -> Any:
    """True where a token is real, False on padding."""
    return tokens != PAD


def count_tokens(batch: Any) -> tuple[int, int]:
    """``(samples, real tokens)`` of a padded batch: the non-pad tokens, counted on the host."""
    tokens = batch[0]
    return int(tokens.shape[0]), int(attention_mask(tokens).sum())


@functools.cache
def _classifier_class():
    import torch
    from torch import nn

    class TextClassifier(nn.Module):
        """Embeddings, a post-LN ``nn.TransformerEncoder``, mean pooling over the real tokens, a linear head."""

        def __init__(self, vocab: int, d_model: int, layers: int, heads: int, ff: int, max_len: int,
                     num_classes: int) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
            self.position = nn.Embedding(max_len, d_model)
            layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, activation="gelu", batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, num_classes)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            mask = attention_mask(tokens)
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            h = self.norm(self.embed(tokens) + self.position(positions))
            h = self.encoder(h, src_key_padding_mask=~mask)
            keep = mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1)
            return self.head(pooled)

    return TextClassifier


def _adamw(params: Any) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)


def build(workload: Any, *, seed: int = 0) -> dict[str, Any]:
    """The text workload's parts (``workloads.Built`` fields): model, token sequences, cross-entropy, AdamW, the
    padding collate and the token count."""
    import torch

    check(workload)
    vocab, d_model, layers, heads, ff = TEXT_MODELS[workload.model]
    max_len = workload.image_size
    model = _classifier_class()(vocab, d_model, layers, heads, ff, max_len, workload.num_classes)
    data = TokenSequences(workload.dataset_size, max_len, vocab=vocab, num_classes=workload.num_classes, seed=seed)
    return {"model": model, "dataset": data, "loss_fn": torch.nn.CrossEntropyLoss(), "optimizer": _adamw,
            "collate_fn": pad_collate, "count": count_tokens}


def fit_space(space: Any, workload: Any) -> Any:
    """``space`` for this workload: for text, channels_last is not searched (fixed false, with a note); an
    image workload's space is returned as it is."""
    if not is_text(workload.model):
        return space
    searched = any(p.name == "channels_last" for p in space.params)
    if not searched and not space.fixed.get("channels_last"):
        return space
    return dataclasses.replace(
        space, params=[p for p in space.params if p.name != "channels_last"],
        fixed={**space.fixed, "channels_last": False}, baseline={**space.baseline, "channels_last": False},
        notes=[*space.notes, f"channels_last dropped: the text workload {workload.model} has no 4-D image tensors"])
