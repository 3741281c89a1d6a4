"""The built-in text workload: a small BERT-like encoder on synthetic token sequences, nothing downloaded.

``--model transformer`` (``transformer_tiny`` for a quick look) is a pure-PyTorch ``nn.TransformerEncoder``
classifier: token + learned position embeddings, post-LN encoder layers (GELU, as BERT), mean pooling over the
real (non-pad) tokens, a linear head, cross-entropy. For text, ``Workload.image_size`` is the **maximum sequence
length** (``--seq-len`` is the same flag as ``--image-size``, spelled for text); ``num_classes`` is the head's.

The data is a workload of the contract (``autotune.workloads.contract``): sequences of varying length drawn once from a
lognormal (median ``max_len / 4``, sigma 0.7, clipped to ``[8, max_len]``: most short, a long tail, as real
sentences and documents are), tokens taken from one random pool, so loading costs what reading an already
tokenised corpus costs. The workload brings its own parts:

* ``collate_fn``: pads each batch to its longest sequence with ``PAD`` (0); the model's attention mask is
  ``tokens != PAD`` (as a BERT's ``pad_token_id``), so the batch stays ``(tokens, labels)`` and autotune's own step
  runs it;
* ``count``: ``(samples, real tokens)``, the non-pad tokens, so tokens/s counts text, not padding;
* ``optimizer``: AdamW, as transformers are trained (its two moment buffers are part of the peak memory);
* ``length``: an item's length in tokens, which any workload may return (``autotune.workloads.probe``).

Its batches hold no 4-D image tensor, so ``search_space.fit_workload`` leaves channels_last out of the search space,
as for any workload whose first batch has none. Because it returns ``length``, ``bucket_by_length``
(``--bucket-by-length``) is searched for it, as for any workload that does: a ``LengthBuckets`` sampler makes
batches of similar lengths, so 2-4% of a batch is padding instead of ~69% (``--seq-len 128``). On 2 EPYC cores,
over 5 interleaved rounds at batch 64, it gave 3.15-4.01x (median 3.74x) the real tokens/s with the machine
quiet (load ~1), 0.93-2.44x (median 1.53x) with it loaded (load 8-10); padding to a multiple of 64 gave
0.82-1.08x and 0.67-1.26x (medians 0.99x): the one knob is searched, the other is not
(``benchmarks/text_padding.py``; figures in ``benchmarks/results/text-padding-2026-11-23*.txt``). Bucketing
changes which sequences share a batch (not the data), as Hugging Face's ``group_by_length`` does: the tuner
measures it, the recommendation says it (``bucket`` in its config), and applying it is the user's call.

>>> import autotune.workloads.build
>>> from autotune.config import Workload
>>> built = autotune.workloads.build.build(Workload(model="transformer_tiny", image_size=32,
...                                                   dataset_size=64))  # doctest: +SKIP
>>> tokens, labels = built.collate_fn([built.dataset[i] for i in range(4)])            # doctest: +SKIP
"""

from __future__ import annotations

import functools
from typing import Any

from autotune.errors import WorkloadError

__all__ = ["TEXT_MODELS", "PAD", "is_text", "check", "build", "data_parts", "pad_collate", "count_tokens",
           "attention_mask", "TokenSequences", "LengthBuckets", "sequence_lengths", "item_length"]

PAD = 0
MIN_LEN = 8
# name -> (vocabulary, d_model, layers, heads, feed-forward width)
TEXT_MODELS: dict[str, tuple[int, int, int, int, int]] = {  # keys: config.TEXT_MODELS
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


def item_length(item: Any) -> int:
    """An item's length in tokens (the workload's ``length``)."""
    return len(item[0])


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


class LengthBuckets:
    """A sampler whose consecutive runs of ``batch_size`` indices are sequences of similar length (as Hugging
    Face's ``group_by_length``): each epoch the indices are shuffled, cut into chunks of 50 batches, each chunk
    sorted by length and cut into batches, and the batches shuffled. The DataLoader's own batching (batch_size,
    drop_last) then yields exactly these batches; the few indices that fill no whole batch are left out."""

    def __init__(self, lengths: Any, batch_size: int, *, seed: int = 0) -> None:
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size * self.batch_size

    def __iter__(self):
        import numpy as np

        rng = np.random.default_rng((self.seed, self.epoch))
        self.epoch += 1
        bs = self.batch_size
        order = rng.permutation(len(self.lengths))[:len(self)]
        chunk = 50 * bs
        batches = []
        for c in range(0, len(order), chunk):
            part = order[c:c + chunk]
            part = part[np.argsort(self.lengths[part], kind="stable")]
            batches += [part[i:i + bs] for i in range(0, len(part), bs)]
        for b in rng.permutation(len(batches)):
            yield from (int(i) for i in batches[b])


def data_parts(workload: Any, *, seed: int = 0) -> dict[str, Any]:
    """The text workload's data: the token sequences, the padding collate, the token count and the length."""
    check(workload)
    vocab = TEXT_MODELS[workload.model][0]
    data = TokenSequences(workload.dataset_size, workload.image_size, vocab=vocab, num_classes=workload.num_classes,
                          seed=seed)
    return {"dataset": data, "collate_fn": pad_collate, "count": count_tokens, "length": item_length}


def build(workload: Any, *, seed: int = 0, config: Any = None) -> dict[str, Any]:
    """The text workload's parts (``workloads.Built`` fields): model, cross-entropy, AdamW and ``data_parts``.
    ``config`` is not read: with ``bucket_by_length``, ``workloads.build`` adds the ``LengthBuckets`` sampler from
    ``length``, as for any workload that returns one."""
    import torch

    vocab, d_model, layers, heads, ff = TEXT_MODELS[workload.model]
    parts = data_parts(workload, seed=seed)
    model = _classifier_class()(vocab, d_model, layers, heads, ff, workload.image_size, workload.num_classes)
    return {"model": model, "loss_fn": torch.nn.CrossEntropyLoss(), "optimizer": _adamw, **parts}
