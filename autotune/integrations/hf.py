"""Hugging Face: the ``TrainingArguments`` fields a recommendation maps to, and ``AutotuneTrainerCallback`` for
what has no field there, so the two carry the whole recommendation (as Lightning's ``AutotuneCallback`` does).

Needs ``transformers``: ``pip install "autotune[hf]"``. Reached through ``Recommendation.training_arguments()``
and ``Recommendation.hf_callback()``, which import this module only when called.

>>> args = TrainingArguments(output_dir="out", **rec.training_arguments())      # doctest: +SKIP
>>> trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[rec.hf_callback()])  # doctest: +SKIP

Mapped: the batch size (``per_device_train_batch_size``; ``gradient_accumulation_steps``: the recommendation's
``accumulation_steps``, global batch / batch size when tuned with a global batch, else 1), the DataLoader
knobs (``dataloader_*``), autocast (``bf16``/``fp16``), torch.compile (``torch_compile``, ``torch_compile_mode``)
and the CPU device (``use_cpu``); measured as N DDP ranks, run under ``torchrun`` (``rec.launch_command()``), the
batch and accumulation are per rank and DDP's backend, bucket size and static graph map to ``ddp_*`` fields
(``gradient_as_bucket_view`` has none: refused under ``strict``). Not mapped, because ``TrainingArguments`` has
no field for them: thread counts, channels_last, cudnn.benchmark and the malloc mode.

The callback applies those (``Recommendation.apply()``, the machinery Lightning's callback uses, and channels_last
on the model's weights) in ``on_train_begin`` and restores them in ``on_train_end``: intra-/inter-op threads,
cudnn.benchmark on a GPU, channels_last, and the malloc mode as far as a running process can take it (``retain``,
through glibc's ``mallopt``). So ``training_arguments()`` (``callback=True``, the default: you pass
``callbacks=[rec.hf_callback()]``) refuses only what neither can give: an allocator read at start-up (a preloaded
jemalloc/tcmalloc, the huge-page half of ``hugepages``), unless the process already runs with it. With
``callback=False`` every knob without a field is refused unless this process already runs with it (e.g.
``OMP_NUM_THREADS`` exported to the recommended count). ``strict=True`` (the default) refuses with one line naming
each and its fix; ``strict=False`` returns the fields and warns with the same fixes (``notes(rec)`` lists them).

``Trainer`` calls no callback when training raises: call ``callback.restore()`` then (it is idempotent), e.g. in
a ``finally``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import Any

from autotune.machine.malloc import env_for
from autotune.errors import ConfigError
from autotune.integrations import require

__all__ = ["training_arguments", "notes", "FIELDS", "trainer_callback"]

# every TrainingArguments field this module may set
FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
          "dataloader_prefetch_factor", "dataloader_pin_memory", "dataloader_persistent_workers", "bf16", "fp16",
          "torch_compile", "torch_compile_mode", "use_cpu", "ddp_backend", "ddp_bucket_cap_mb", "ddp_static_graph")


def _fields(rec) -> dict[str, Any]:
    c = rec.config
    rec.dataloader_kwargs()  # a loader whose batches in flight do not fit this machine is refused here too
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
    if rec.world_size > 1:  # under torchrun (rec.launch_command()): the batch and accumulation above are per rank
        out.update(ddp_backend=rec.ddp_backend, ddp_bucket_cap_mb=c.bucket_cap_mb,
                   ddp_static_graph=c.static_graph)
    return out


def notes(rec, *, callback: bool = False) -> list[str]:
    """What the recommendation sets that ``TrainingArguments`` cannot (nor, with ``callback``, the callback), and
    this process does not have yet, each with how to set it. Empty when everything maps."""
    import torch

    c, out = rec.config, []
    if rec.world_size > 1 and os.environ.get("WORLD_SIZE") != str(rec.world_size):
        # TrainingArguments with a ddp_backend sets up the process group as it is made: only inside the ranks
        out.append(f"{rec.world_size} DDP ranks: build TrainingArguments in the script rec.launch_command() "
                   f"starts (torchrun --nproc-per-node {rec.world_size}), not in this process")
    if c.gradient_as_bucket_view:  # Trainer builds DDP's arguments itself, with no field for this one
        out.append("gradient_as_bucket_view=True: TrainingArguments has no field for it and Trainer wraps the model "
                   "itself; train without it (it saved a copy of the gradients as measured) or with rec.apply()")
    malloc_env = env_for(c.malloc)
    if callback:  # glibc's MALLOC_*_ settings the callback gives through mallopt; the rest is read at start-up
        malloc_env = {k: v for k, v in malloc_env.items() if not (k.startswith("MALLOC_") and k.endswith("_"))}
    malloc = []
    if any(os.environ.get(k) != v for k, v in malloc_env.items()):
        env = " ".join(f"{k}={v}" for k, v in malloc_env.items())
        malloc.append(f"malloc={c.malloc}: export {env} before launching the training process")
    if callback:
        return out + malloc
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
    return out + malloc


def training_arguments(rec, *, strict: bool = True, callback: bool = True) -> dict[str, Any]:
    """``TrainingArguments(output_dir=..., **training_arguments(rec))``: the fields the recommendation maps to.

    ``callback``: you pass ``callbacks=[rec.hf_callback()]`` to ``Trainer``, which applies threads, channels_last,
    cudnn.benchmark and the in-process allocator settings; ``False``: those are yours to set too. ``strict``:
    refuse (``ConfigError``, one line) when a knob is set by neither and this process does not run with it
    already; with ``strict=False`` the fields are returned and each such knob is warned about with its fix.
    """
    transformers = require("transformers", "hf", what="transformers")
    fields = _fields(rec)
    known = getattr(transformers.TrainingArguments, "__dataclass_fields__", {})
    absent = [k for k in fields if known and k not in known]
    if absent:  # a renamed field (e.g. no_cuda became use_cpu in 4.34): say so rather than fail in the call
        raise ConfigError(f"transformers {transformers.__version__} has no TrainingArguments field "
                          f"{', '.join(absent)}; upgrade it: pip install -U \"autotune[hf]\"")
    todo = notes(rec, callback=callback)
    if todo and strict:
        raise ConfigError("TrainingArguments has no field for " + "; ".join(todo)
                          + (" (the callback cannot set it in a running process)" if callback else
                             " (or pass callbacks=[rec.hf_callback()] to Trainer and drop callback=False)")
                          + " (or pass strict=False to get the other fields)")
    for note in todo:
        warnings.warn(f"not in TrainingArguments: {note}", UserWarning, stacklevel=3)
    return fields


@functools.cache
def _callback_class():
    transformers = require("transformers", "hf", what="transformers")

    class AutotuneTrainerCallback(transformers.TrainerCallback):
        """Applies a recommendation's process-wide settings when ``Trainer.train()`` begins and restores them when
        it ends: ``Recommendation.apply()`` (intra-/inter-op threads, cudnn.benchmark on a GPU, the malloc mode as
        far as a running process takes it) and channels_last on the model's weights (inputs follow the weights'
        layout in convolutions). ``restore()`` undoes it by hand: ``Trainer`` calls no callback when training raises.
        """

        def __init__(self, rec, *, field=True) -> None:
            self.rec = rec
            self._undo: contextlib.ExitStack | None = None
            self._field_spec = field  # True, a FieldSpec, or False: measure the training (autotune.field)
            self.field_run = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            import torch

            from autotune.machine.device import channels_last_model

            self.restore()  # a second train() on the same Trainer: apply afresh
            undo = contextlib.ExitStack()
            undo.enter_context(self.rec.apply(field=False))  # measured here, through the Trainer's step hooks
            if self._field_spec:
                # a step per optimizer step (on_step_begin comes once the step's batches are fetched); its samples
                # the recommendation's batch x accumulation: the Trainer shows no batch to a callback
                self.field_run = self.rec.field_run(spec=None if self._field_spec is True else self._field_spec,
                                                    source="hf", steps="callback").start()
                undo.callback(self.field_run.stop)
            if self.rec.config.channels_last and model is not None:
                channels_last_model(model)  # a lazy module (LazyLinear) converts at its first forward
                undo.callback(channels_last_model, model, torch.contiguous_format)
            self._undo = undo

        def on_step_begin(self, args, state, control, **kwargs):
            if self.field_run is not None:
                self.field_run.batch_start()

        def on_step_end(self, args, state, control, **kwargs):
            if self.field_run is not None:
                self.field_run.step_end()

        def on_prediction_step(self, args, state, control, **kwargs):
            if self.field_run is not None:  # evaluation inside train(): the loop's own work, not the data wait
                self.field_run.evaluating()

        def field(self) -> str:
            """How the training stands against what the trials measured, in one line (``autotune.field``)."""
            return self.field_run.line() if self.field_run is not None else "autotune field: off"

        def on_train_end(self, args, state, control, **kwargs):
            self.restore()

        def restore(self) -> None:
            if self._undo is not None:
                undo, self._undo = self._undo, None
                undo.close()

    return AutotuneTrainerCallback


def trainer_callback(rec, *, field=True):
    """``Trainer(..., callbacks=[trainer_callback(rec)])``: an ``AutotuneTrainerCallback``
    (``Recommendation.hf_callback()``); ``field``: measure the training (``autotune.field``)."""
    return _callback_class()(rec, field=field)
