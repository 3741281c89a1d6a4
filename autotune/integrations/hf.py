"""Hugging Face: the ``TrainingArguments`` fields a recommendation maps to, and what has no field there.

Needs ``transformers``: ``pip install "autotune[hf]"``. Reached through ``Recommendation.training_arguments()``,
which imports this module only when called.

>>> args = TrainingArguments(output_dir="out", **rec.training_arguments())      # doctest: +SKIP

Mapped: the batch size (``per_device_train_batch_size``; ``gradient_accumulation_steps``: the recommendation's
``accumulation_steps``, global batch / batch size when tuned with a global batch, else 1), the DataLoader
knobs (``dataloader_*``), autocast (``bf16``/``fp16``), torch.compile (``torch_compile``, ``torch_compile_mode``)
and the CPU device (``use_cpu``). Not mapped, because ``TrainingArguments`` has no field for them: thread
counts, channels_last, cudnn.benchmark and the malloc mode. Each is left out only when this process already
runs with it (e.g. ``OMP_NUM_THREADS`` exported to the recommended count); otherwise ``strict=True`` (the
default) refuses with one line naming each and its fix, and ``strict=False`` returns the fields and warns
with the same fixes (``notes(rec)`` returns them as a list).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from autotune.machine.malloc import env_for
from autotune.errors import ConfigError
from autotune.integrations import require

__all__ = ["training_arguments", "notes", "FIELDS"]

# every TrainingArguments field this module may set
FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
          "dataloader_prefetch_factor", "dataloader_pin_memory", "dataloader_persistent_workers", "bf16", "fp16",
          "torch_compile", "torch_compile_mode", "use_cpu")


def _fields(rec) -> dict[str, Any]:
    c = rec.config
    out: dict[str, Any] = {"per_device_train_batch_size": c.batch_size,
                           "gradient_accumulation_steps": rec.accumulation_steps,
                           "dataloader_num_workers": c.num_workers, "dataloader_pin_memory": c.pin_memory}
    if c.num_workers > 0:  # TrainingArguments refuses a prefetch factor without workers
        out["dataloader_persistent_workers"] = c.persistent_workers
        if c.prefetch_factor is not None:
            out["dataloader_prefetch_factor"] = c.prefetch_factor
    out["bf16"], out["fp16"] = c.amp == "bf16", c.amp == "fp16"
    out["torch_compile"] = c.compile_mode != "none"
    if c.compile_mode not in ("none", "default"):
        out["torch_compile_mode"] = c.compile_mode
    if rec.workload.device == "cpu":
        out["use_cpu"] = True
    return out


def notes(rec) -> list[str]:
    """What the recommendation sets that ``TrainingArguments`` cannot, and this process does not have yet,
    each with how to set it. Empty when everything maps."""
    import torch

    c, out = rec.config, []
    if c.intra_op_threads and torch.get_num_threads() != c.intra_op_threads:
        out.append(f"threads={c.intra_op_threads}: export OMP_NUM_THREADS={c.intra_op_threads} "
                   f"MKL_NUM_THREADS={c.intra_op_threads} before launching, or call "
                   f"torch.set_num_threads({c.intra_op_threads}) before Trainer.train()")
    if c.inter_op_threads and torch.get_num_interop_threads() != c.inter_op_threads:
        out.append(f"interop_threads={c.inter_op_threads}: call torch.set_num_interop_threads"
                   f"({c.inter_op_threads}) at the start of the script, before any torch work")
    if c.channels_last:
        out.append("channels_last: call model.to(memory_format=torch.channels_last) before Trainer(model=...)")
    if c.cudnn_benchmark and rec.workload.device != "cpu" and not torch.backends.cudnn.benchmark:
        out.append("cudnn_benchmark: set torch.backends.cudnn.benchmark = True before Trainer.train()")
    malloc_env = env_for(c.malloc)
    if any(os.environ.get(k) != v for k, v in malloc_env.items()):
        env = " ".join(f"{k}={v}" for k, v in malloc_env.items())
        out.append(f"malloc={c.malloc}: export {env} before launching the training process")
    return out


def training_arguments(rec, *, strict: bool = True) -> dict[str, Any]:
    """``TrainingArguments(output_dir=..., **training_arguments(rec))``: the fields the recommendation maps to.

    ``strict``: refuse (``ConfigError``, one line) when a knob has no field and this process does not run with
    it already; with ``strict=False`` the fields are returned and each such knob is warned about with its fix.
    """
    transformers = require("transformers", "hf", what="transformers")
    fields = _fields(rec)
    known = getattr(transformers.TrainingArguments, "__dataclass_fields__", {})
    absent = [k for k in fields if known and k not in known]
    if absent:  # a renamed field (e.g. no_cuda became use_cpu in 4.34): say so rather than fail in the call
        raise ConfigError(f"transformers {transformers.__version__} has no TrainingArguments field "
                          f"{', '.join(absent)}; upgrade it: pip install -U \"autotune[hf]\"")
    todo = notes(rec)
    if todo and strict:
        raise ConfigError("TrainingArguments has no field for " + "; ".join(todo)
                          + " (or pass strict=False to get the other fields)")
    for note in todo:
        warnings.warn(f"not in TrainingArguments: {note}", UserWarning, stacklevel=3)
    return fields
