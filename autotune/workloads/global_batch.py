"""A fixed global batch: the user keeps N samples per optimizer step; autotune tunes the micro-batch.

``--global-batch N`` (``Workload.global_batch``, ``recommend(..., global_batch=N)``) is a property of the user's
training, like the model: it is part of the study's name, so a study with a global batch of 256 is never mixed
with one without. The tuner then searches only the batch sizes (micro-batches) of the space that divide N, with
gradient accumulation steps = N / micro-batch (``restrict_space``; the batch walk steps through the same
choices). The space decides the candidates: if none of its batch sizes divides N, that is a one-line
``ConfigError`` naming N and the candidates, rather than sizes the user did not ask to search.

In a trial's child one *step* is a whole optimizer step: ``accumulation_steps`` micro-batches (forward and
backward each, the loss divided by the accumulation steps), then one optimizer step and ``zero_grad``. The
warm-up and every measured window are made of whole optimizer steps, so samples/s is per sample of the global
batch with the optimizer's cost spread over N samples, as the real run pays it; ``samples_per_step`` is N (for
a map-style dataset with ``drop_last``, as the trial's loader has).

With N DDP ranks (``Workload.nproc_per_node``) the global batch is micro-batch x accumulation steps x N: every
rank accumulates its micro-batches, and DDP all-reduces only on the last one (the others run under
``no_sync``: ``autotune.workloads.contract.StepContext.syncing``), as a real DDP run with accumulation does.

>>> accumulation_steps(256, 32)
8
>>> accumulation_steps(None, 32)
1
>>> accumulation_steps(256, 32, world_size=2)
4
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.workloads.contract import split_batch
from autotune.errors import ConfigError

__all__ = ["accumulation_steps", "divisors_among", "restrict_space", "default_step", "describe", "CUDAGRAPH_MODES",
           "check_cudagraphs"]

# torch.compile modes that capture CUDA graphs on a GPU. A graph replays into its own memory pool, so under
# gradient accumulation the gradients one replay accumulates into are overwritten by the next micro-batch's
# (pytorch #169545, #96693): the training silently learns from the last micro-batch only. Not searched, and
# refused in a trial, when a CUDA step accumulates.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_cudagraphs(device: str, global_batch: int | None, config: Any, *, world_size: int = 1) -> None:
    """Refuse a CUDA-graph compile mode with gradient accumulation on a GPU (see ``CUDAGRAPH_MODES``)."""
    if (device != "cpu" and config.compile_mode in CUDAGRAPH_MODES
            and accumulation_steps(global_batch, config.batch_size, world_size=world_size) > 1):
        raise ConfigError(f"--compile {config.compile_mode} captures CUDA graphs, which overwrite accumulated "
                          f"gradients between micro-batches (pytorch #169545): with --global-batch {global_batch} "
                          f"and batch size {config.batch_size} use --compile default, or a batch size of "
                          f"{global_batch}")


def accumulation_steps(global_batch: int | None, batch_size: int, *, world_size: int = 1) -> int:
    """Micro-batches per optimizer step on each rank: ``global_batch / (batch_size x world_size)`` (1 without a
    global batch); a batch size (per rank) whose ranks' batches do not divide the global batch is a one-line
    ConfigError."""
    if not global_batch:
        return 1
    per_step = batch_size * world_size
    if per_step > global_batch or global_batch % per_step:
        ranks = f" x {world_size} ranks" if world_size > 1 else ""
        choices = divisors_among(global_batch, range(1, global_batch + 1), world_size=world_size)[-8:]
        raise ConfigError(f"batch_size={batch_size}{ranks} does not divide the global batch {global_batch}: with a "
                          f"global batch the batch size is the micro-batch"
                          f"{' of each rank' if world_size > 1 else ''}; pick one of {choices or 'none'}"
                          + ("" if choices else f" (the global batch must be a multiple of the {world_size} ranks)"))
    return global_batch // per_step


def divisors_among(global_batch: int, candidates: Any, *, world_size: int = 1) -> list[int]:
    """The candidates that, times ``world_size``, divide ``global_batch``, ascending."""
    return sorted(c for c in candidates if 1 <= c * world_size <= global_batch and global_batch % (c * world_size) == 0)


def restrict_space(space: Any, global_batch: int | None, *, device: str = "cpu", world_size: int = 1) -> Any:
    """``space`` (a ``SearchSpace``) with its batch sizes restricted to the divisors of ``global_batch``: the
    searched choices (a ``low``/``high`` range keeps the divisors inside it), the fixed one and the baseline's
    (moved to the largest divisor below it, else the smallest); with ``world_size`` ranks, the per-rank batch
    sizes whose ranks' batches divide it. Without a global batch, ``space`` itself.
    Idempotent. None left is a one-line ``ConfigError`` naming N and the candidates. On a GPU, the compile
    modes that capture CUDA graphs are dropped as well (``CUDAGRAPH_MODES``)."""
    if not global_batch:
        return space
    if device != "cpu":
        space = _without_cudagraphs(space)
    from autotune.config import TrialConfig

    fixed, baseline = dict(space.fixed), dict(space.baseline)
    notes = list(space.notes)
    params = list(space.params)
    idx = next((i for i, p in enumerate(params) if p.name == "batch_size"), None)
    if idx is None:  # not searched: the fixed one, else TrialConfig's default
        size = fixed.get("batch_size", TrialConfig().batch_size)
        accumulation_steps(global_batch, size, world_size=world_size)  # refuses a fixed size that does not divide N
        return space
    p = params[idx]
    kept = divisors_among(global_batch, p.choices, world_size=world_size)
    ranks = f" x {world_size} ranks" if world_size > 1 else ""
    if not kept:
        shown = (f"{p.choices[0]}..{p.choices[-1]}" if len(p.choices) > 8 else ", ".join(map(str, p.choices)))
        raise ConfigError(f"global batch {global_batch}: none of the space's batch sizes ({shown}){ranks} divides it; "
                          f"give a global batch that one of them divides, or a --space whose batch_size choices "
                          f"include divisors of {global_batch}")
    if len(kept) != len(p.choices):
        dropped = [c for c in p.choices if c not in kept]
        shown = f"{dropped[:6]}{'...' if len(dropped) > 6 else ''}"
        notes.append(f"batch_size {shown} dropped: with the global batch {global_batch} the batch size is a "
                     f"micro-batch that{ranks} must divide it")
        params[idx] = dataclasses.replace(p, choices=tuple(kept))
    base = baseline.get("batch_size")
    if base is not None and base not in kept:
        below = [c for c in kept if c <= base]
        baseline["batch_size"] = below[-1] if below else kept[0]
        notes.append(f"baseline batch_size {base} -> {baseline['batch_size']}: a divisor of the global batch "
                     f"{global_batch}")
    return dataclasses.replace(space, params=params, fixed=fixed, baseline=baseline, notes=notes)


def _without_cudagraphs(space: Any) -> Any:
    params = list(space.params)
    idx = next((i for i, p in enumerate(params) if p.name == "compile_mode"), None)
    fixed = dict(space.fixed)
    if fixed.get("compile_mode") in CUDAGRAPH_MODES:
        raise ConfigError(f"the space fixes compile_mode {fixed['compile_mode']}, which captures CUDA graphs: they "
                          "overwrite accumulated gradients under a global batch (pytorch #169545); use default")
    if idx is None or not set(params[idx].choices) & set(CUDAGRAPH_MODES):
        return space
    kept = tuple(c for c in params[idx].choices if c not in CUDAGRAPH_MODES)
    params[idx] = dataclasses.replace(params[idx], choices=kept)
    notes = list(space.notes) + [f"compile_mode {', '.join(CUDAGRAPH_MODES)} dropped: their CUDA graphs overwrite "
                                 "accumulated gradients under a global batch (pytorch #169545)"]
    baseline = dict(space.baseline)
    if baseline.get("compile_mode") in CUDAGRAPH_MODES:
        baseline["compile_mode"] = "none"
    return dataclasses.replace(space, params=params, baseline=baseline, notes=notes)


def default_step(model: Any, batch: Any, optimizer: Any, ctx: Any) -> Any:
    """autotune's own step written to the contract (``x, y = batch``, ``loss_fn(model(x), y)``), so that it
    accumulates: ``ctx.backward`` divides the loss, ``ctx.optimizer_step`` steps and zeroes the gradients on
    the last micro-batch only (the plain step zeroes them every step). Used for a workload without its own step
    when the accumulation steps are above 1 (training only:
    a global batch is refused for ``task=infer``)."""
    x, y = split_batch(batch)
    with ctx.autocast():
        loss = ctx.loss_fn(model(x), y)
    ctx.backward(loss)
    ctx.optimizer_step(optimizer)
    return loss


def describe(batch_size: int, global_batch: int | None, *, world_size: int = 1) -> str:
    """``micro-batch 32 x 8 accumulation steps = global batch 256`` (``x 2 ranks`` before the ``=`` with
    ranks), or "" without a global batch."""
    if not global_batch:
        return ""
    ranks = f" \u00d7 {world_size} ranks" if world_size > 1 else ""
    steps = accumulation_steps(global_batch, batch_size, world_size=world_size)
    return f"micro-batch {batch_size} \u00d7 {steps} accumulation steps{ranks} = global batch {global_batch}"
