"""The workload contract: what a user's workload callable returns, and how a trial runs it.

A workload is a function at module top level, named ``package.module:function`` on the command line or passed
to ``autotune.tune()`` / ``autotune.recommend()`` as the function itself. It is called in each trial's child
process with the keyword arguments it accepts among ``image_size``, ``task`` and ``num_classes``, and returns
``(model, dataset, loss_fn)`` or a dict with these keys (only ``model`` and ``dataset`` are required):

==============  ===============================================================  ===================================
key             what                                                             when absent (autotune's own)
==============  ===============================================================  ===================================
``model``       a ``torch.nn.Module``                                            required
``dataset``     a map-style dataset (``__len__``/``__getitem__``) or an          required
                ``IterableDataset``
``loss_fn``     ``loss_fn(output, target) -> loss``                              required for training without step
``optimizer``   a factory over the parameters: ``params -> Optimizer``           ``SGD(lr=0.01, momentum=0.9)``
``collate_fn``  the DataLoader's ``collate_fn``: list of items -> batch          PyTorch's default collate
``sampler``     the DataLoader's ``sampler`` (no shuffling then)                 shuffled (map-style), in order
                                                                                 (IterableDataset)
``step``        ``step(model, batch, optimizer, ctx) -> loss`` (scalar tensor)   ``x, y = batch``; zero_grad;
                                                                                 ``loss_fn(model(x), y)``; backward;
                                                                                 optimizer step
``count``       ``count(batch) -> samples`` or ``-> (samples, tokens)``          ``len(x)`` samples
``length``      ``length(item) -> int >= 0``: one dataset item's length (tokens) no length: no bucketing searched
==============  ===============================================================  ===================================

and ``worst_case_batch``: ``worst_case_batch(batch_size) -> batch``, the largest batch its data can produce (e.g.
detection's largest images); when absent, the ``batch_size`` longest items by ``length``, else a normal batch.

What it does not return, autotune supplies exactly as before: the figures then stand for autotune's own step.
The recommendation and each trial's result record which parts were the user's (``user_parts``), so a reader
knows what the figures stand for.

**What the data decides.** Before a study is written, ``autotune.workloads.build.check`` calls the workload in a
child process and collates its first few items into a batch (``autotune.workloads.probe``). The search space
follows from what that batch holds, not from the model's name: ``channels_last`` is searched only when a batch
holds a 4-D floating-point tensor (anywhere in a dict, tuple or nested structure); ``bucket_by_length`` only
when the workload returns ``length`` (and no ``sampler`` of its own): the trial then batches items of similar
length together (``LengthBuckets``, as Hugging Face's ``group_by_length``), with the lengths ``length`` gives.
``length`` must return a non-negative int (a 0-d integer tensor or numpy integer is taken); anything else, or a
``length`` with an ``IterableDataset``, is a one-line error before a study is written. The recommendation's YAML
``workload`` section records what was seen (``data``: the first batch's tensors' shapes and dtypes, the
lengths, the keyword arguments the function took) and leaves out the defaults it did not take.

**The worst case.** Before a config is recommended it runs, in a child under the trials' memory caps, on the
largest batch the data can produce, and its peak must leave the memory margin free (``autotune.workloads.worst_case``):
``worst_case_batch(batch_size)`` when the workload returns it, else with ``length`` its ``batch_size`` longest
items, else (fixed shapes) a normal batch, which the finalists' rounds have run already. A worst-case batch the
model rejects is a one-line ``WorkloadError``.

**Batches.** Any structure: a tensor, tuple, list, dict, or nested mixes of them. Before the step, autotune moves
every tensor in it to the trial's device (``ctx.prepare``) and makes 4-D floating-point tensors channels_last
when the config says so; anything that is not a tensor is passed through. ``count`` sees the batch as the
DataLoader gave it (on the host: counting a padding mask there costs no device synchronisation). ``samples``
must be a positive int no larger than the largest leading dimension of the batch's tensors; ``tokens``
a non-negative int (a 0-d integer tensor is accepted for either). Throughput is ``samples`` per second, and
``tokens`` per second as well when counted.

**The step** gets the (possibly compiled) model, the prepared batch, the optimizer (``None`` for ``task=infer``,
where the step runs under ``torch.inference_mode()`` and may return ``None``) and a ``StepContext``:

* ``ctx.autocast()``: the trial's mixed precision (bf16/fp16/off), as a context manager around the forward;
* ``ctx.backward(loss)``: ``loss.backward()``, through the grad scaler under fp16;
* ``ctx.unscale_(optimizer)``: unscale the gradients before clipping them (nothing without a scaler);
* ``ctx.optimizer_step(optimizer)``: ``optimizer.step()`` (``scaler.step`` + ``update`` under fp16), then
  ``optimizer.zero_grad(set_to_none=True)``. Let it zero the gradients rather than calling ``zero_grad``
  yourself: with gradient accumulation (``ctx.accumulation_steps`` > 1: a global batch, ``--global-batch N``,
  see ``autotune.workloads.global_batch``) the step is called once per micro-batch (``ctx.micro_batch`` says which),
  ``backward`` divides the loss and ``optimizer_step`` steps on the last micro-batch only;
* ``ctx.scaler`` (a ``GradScaler`` or ``None``), ``ctx.prepare(obj)`` (the recursive move, for tensors a step
  makes itself), ``ctx.loss_fn`` (the workload's ``loss_fn`` or None), ``ctx.device``, ``ctx.train``.

The step must return the loss as a scalar tensor; autotune never calls ``.item()`` on it inside a measured
window, so return it detached or not, as you like.

**Bad input** is a ``WorkloadError`` naming the part (one line, exit code 2 in the CLI, the study stops with
nothing lost): a step that returns no tensor or a non-scalar one, a count that is not an int or exceeds the
batch, an optimizer factory that raises or returns no optimizer, a part that is not callable.

A complete workload, to copy (``examples/adamw_dict_batches.py`` is this, runnable)::

    import torch
    from torch import nn

    class Pixels(torch.utils.data.Dataset):
        def __init__(self, image_size, n=512):
            self.x = torch.randn(n, 3, image_size, image_size)
            self.y = torch.randint(0, 10, (n,))
        def __len__(self):
            return len(self.x)
        def __getitem__(self, i):
            return {"pixels": self.x[i], "label": self.y[i]}

    def collate(items):
        return {"pixels": torch.stack([it["pixels"] for it in items]),
                "label": torch.stack([it["label"] for it in items])}

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)

    def train_step(model, batch, optimizer, ctx):
        with ctx.autocast():
            loss = nn.functional.cross_entropy(model(batch["pixels"]), batch["label"])
        ctx.backward(loss)
        ctx.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ctx.optimizer_step(optimizer)
        return loss

    def build(image_size=32):
        model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(16, 10))
        return {"model": model, "dataset": Pixels(image_size), "optimizer": adamw, "collate_fn": collate,
                "step": train_step, "count": lambda batch: len(batch["label"])}
        # a sequence workload would also return "length": lambda item: len(item["input_ids"])

    # autotune run --model mymodule:build --image-size 32     or, in Python:
    # rec = autotune.tune(build, image_size=32, budget="10m"); rec.user_parts -> ('optimizer', 'collate_fn', ...)

The parts themselves (``train_step``, ``collate``, a lambda for ``count``) need not be importable: they are made
by ``build`` inside the child. Only the workload function is named by reference: ``reference(fn)`` turns it into
``module:qualname`` and refuses, in one line, lambdas, nested functions and what a child cannot import.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from autotune.errors import WorkloadError

__all__ = ["PARTS", "reference", "StepOut", "StepContext", "split_batch", "move", "count_batch", "check_loss",
           "make_optimizer", "user_step", "default_count", "loader_kwargs", "steps_per_epoch", "user_parts"]

# what a workload may return besides model, dataset and loss_fn, in the order a recommendation lists them
PARTS = ("optimizer", "collate_fn", "sampler", "step", "count")


def _main_module_name(fn: Any) -> str | None:
    """The importable name of ``__main__`` (``python -m pkg.mod``, or a script file under the current folder)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return spec.name
    path = getattr(main, "__file__", None)
    if not path:
        return None
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve()).with_suffix("")
    except ValueError:
        return None
    parts = rel.parts
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def _reachable(module: Any, qualname: str, fn: Any) -> bool:
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is not None and obj == fn


def reference(fn: Any) -> str:
    """``"module:qualname"`` of a workload function, for the trial's child to import; a string is returned as is.

    Refuses with a one-line ``WorkloadError``: lambdas, functions defined inside another function, objects that
    are not functions or classes at a module's top level, and ``__main__`` of an interactive session (a script
    run as ``python path/script.py`` from a folder above it, or as ``python -m``, is named by its module path).
    """
    if isinstance(fn, str):
        return fn
    name = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if not callable(fn) or not isinstance(name, str) or not module:
        raise WorkloadError(f"workload {fn!r} is a {type(fn).__name__}, not a function at a module's top level; "
                            "pass a function (or its 'package.module:function' name)")
    if "<lambda>" in name:
        raise WorkloadError("workload is a lambda, which a trial's child process cannot import; define it with "
                            "def at a module's top level and pass that function")
    if "<locals>" in name:
        raise WorkloadError(f"workload {name.replace('.<locals>', '')} is defined inside a function (a closure), "
                            "which a trial's child process cannot import; move it to a module's top level")
    if module == "__main__":
        importable = _main_module_name(fn) if _reachable(sys.modules.get("__main__"), name, fn) else None
        if importable is None:
            raise WorkloadError(f"workload {name} is defined in __main__ (an interactive session or a script outside "
                                "the current folder), which a trial's child process cannot import; move it to a "
                                "module and pass it, or its 'package.module:function' name")
        return f"{importable}:{name}"
    if not _reachable(sys.modules.get(module), name, fn):
        raise WorkloadError(f"workload {module}:{name} is not reachable by that name (a bound method, a decorated "
                            "or replaced function?); pass a plain function at a module's top level")
    return f"{module}:{name}"


class StepOut(NamedTuple):
    loss: Any  # the detached loss tensor, or None (inference without a loss or a target)
    output: Any  # the model's detached output (None for a user's step)
    samples: int
    tokens: int | None = None  # when the workload's count gives them


def split_batch(batch: Any) -> tuple[Any, Any]:
    """(input, target) of a batch: a tuple/list's first two items, a dict's ``input``/``target``, else (batch, None)."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, dict) and "input" in batch:
        return batch["input"], batch.get("target")
    return batch, None


def move(obj: Any, dev: Any, *, non_blocking: bool = False, channels_last: bool = False) -> Any:
    """``obj`` with every tensor in it moved to ``dev`` (tuples, lists, dicts, named tuples, nested), 4-D
    floating-point ones channels_last when asked; anything else as it is."""
    import torch

    if isinstance(obj, torch.Tensor):
        return dev.to_device(obj, non_blocking=non_blocking,
                             channels_last=channels_last and obj.is_floating_point())
    again = lambda o: move(o, dev, non_blocking=non_blocking, channels_last=channels_last)  # noqa: E731
    if isinstance(obj, dict):
        out = {k: again(v) for k, v in obj.items()}
        if type(obj) is not dict:  # a dict subclass (OrderedDict, a tokenizer's BatchEncoding) keeps its type
            with contextlib.suppress(Exception):
                return type(obj)(out)
        return out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(again(v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(again(v) for v in obj)
    return obj


def _leading_dims(batch: Any) -> list[int]:
    """The leading dimensions of the tensors in ``batch``, depth first."""
    import torch

    if isinstance(batch, torch.Tensor):
        return [int(batch.shape[0])] if batch.dim() else []
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    return [n for item in items for n in _leading_dims(item)]


def _as_int(v: Any, what: str) -> int:
    import torch

    if isinstance(v, torch.Tensor) and v.dim() == 0 and not v.is_floating_point() and not v.is_complex():
        v = int(v.item())
    if isinstance(v, bool) or not isinstance(v, int):
        raise WorkloadError(f"the workload's count returned {what} {v!r} ({type(v).__name__}); it must be an int")
    return v


def count_batch(count: Callable[[Any], Any], batch: Any) -> tuple[int, int | None]:
    """``(samples, tokens or None)`` of a batch by the workload's ``count``, checked against the batch."""
    try:
        got = count(batch)
    except Exception as exc:
        raise WorkloadError(f"the workload's count raised {type(exc).__name__}: {exc}") from None
    if isinstance(got, tuple):
        if len(got) != 2:
            raise WorkloadError(f"the workload's count returned a tuple of {len(got)}; it must return samples or "
                                "(samples, tokens)")
        samples, tokens = _as_int(got[0], "samples"), _as_int(got[1], "tokens")
    else:
        samples, tokens = _as_int(got, "samples"), None
    # at most the largest leading dimension of any tensor in it: a [T, B] layout or packed sequences (one row
    # of tokens, with offsets) still pass, a count of twice the batch does not
    lead = max(_leading_dims(batch), default=None)
    if samples < 1 or (lead is not None and samples > lead):
        raise WorkloadError(f"the workload's count says {samples} samples for a batch whose tensors have at most "
                            f"{lead} rows; it must count 1 to {lead} samples")
    if tokens is not None and tokens < 0:
        raise WorkloadError(f"the workload's count returned {tokens} tokens; it must be >= 0")
    return samples, tokens


def check_loss(loss: Any, *, train: bool) -> Any:
    """The loss a user's step returned, if it is a scalar tensor (or None when inferring); else WorkloadError."""
    import torch

    if loss is None and not train:
        return None
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(f"the workload's step returned {type(loss).__name__}, not a tensor; it must return the "
                            "loss as a scalar tensor")
    if loss.numel() != 1:
        raise WorkloadError(f"the workload's step returned a tensor of shape {tuple(loss.shape)}, not a scalar; "
                            "it must return the loss as a scalar tensor (reduce it, e.g. .mean())")
    return loss


def make_optimizer(factory: Callable[[Any], Any] | None, model: Any) -> Any:
    """The trial's optimizer over ``model``'s parameters: the workload's factory's, or autotune's SGD."""
    import torch

    if factory is None:
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    try:
        opt = factory(model.parameters())
    except Exception as exc:
        raise WorkloadError(f"the workload's optimizer factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(opt, torch.optim.Optimizer):
        raise WorkloadError(f"the workload's optimizer factory returned {type(opt).__name__}, not a "
                            "torch.optim.Optimizer; it must take the parameters and return the optimizer")
    return opt


class StepContext:
    """What a user's step gets besides model, batch and optimizer (see the module docstring)."""

    def __init__(self, config: Any, dev: Any, scaler: Any, *, loss_fn: Any = None, train: bool = True,
                 accumulation_steps: int = 1, ddp: Any = None) -> None:
        self.config, self.dev, self.scaler, self.loss_fn, self.train = config, dev, scaler, loss_fn, train
        self.device = dev.torch_device()
        self.accumulation_steps = accumulation_steps
        self.micro_batch = 0  # which micro-batch of the optimizer step this call is (0 .. accumulation_steps - 1)
        self.ddp = ddp  # the DistributedDataParallel module of a rank (autotune.trial.ranks), else None
        self.optimizer_steps = 0  # optimizer steps before this micro-batch's

    def syncing(self) -> contextlib.AbstractContextManager:
        """Around one micro-batch's step: a DDP rank's all-reduce is skipped (``no_sync``) on every micro-batch
        but the last of an optimizer step, whose backward all-reduces the gradients accumulated so far, as
        torch's docs for ``no_sync`` ask. Otherwise nothing. With ``static_graph`` the first optimizer step
        all-reduces every micro-batch: DDP records the graph in its first backward, and one under ``no_sync``
        trips its reducer (an internal assert, torch 2.x); the sum of the means is the mean of the sums."""
        if self.ddp is None or self.micro_batch == self.accumulation_steps - 1:
            return contextlib.nullcontext()
        if self.optimizer_steps == 0 and getattr(self.ddp, "static_graph", False):
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.dev.autocast(self.config.amp)

    def prepare(self, obj: Any, *, channels_last: bool | None = None) -> Any:
        cl = self.config.channels_last if channels_last is None else channels_last
        return move(obj, self.dev, non_blocking=self.config.pin_memory, channels_last=cl)

    def backward(self, loss: Any) -> None:
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: Any) -> None:
        if self.scaler is not None and self.micro_batch == self.accumulation_steps - 1:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: Any) -> None:
        if self.micro_batch != self.accumulation_steps - 1:
            return
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def user_step(step_fn: Callable[..., Any], count: Callable[[Any], Any] | None, model: Any, optimizer: Any,
              ctx: StepContext) -> Callable[[Any], StepOut]:
    """``step(batch) -> StepOut`` around the workload's own step: count on the host, prepare, call, check.
    Each call is one micro-batch: ``ctx.micro_batch`` counts 0 .. ``ctx.accumulation_steps`` - 1 and around."""
    import torch

    calls = [0]

    def step(batch: Any) -> StepOut:
        samples, tokens = count_batch(count, batch) if count is not None else (default_count(batch), None)
        prepared = ctx.prepare(batch)
        if ctx.train:
            ctx.micro_batch = calls[0] % ctx.accumulation_steps
            ctx.optimizer_steps = calls[0] // ctx.accumulation_steps
            calls[0] += 1
            with ctx.syncing():
                loss = step_fn(model, prepared, optimizer, ctx)
        else:
            with torch.inference_mode():
                loss = step_fn(model, prepared, None, ctx)
        loss = check_loss(loss, train=ctx.train)
        return StepOut(None if loss is None else loss.detach(), None, samples, tokens)

    return step


def default_count(batch: Any) -> int:
    """autotune's count: the leading dimension of the batch's input (``len(x)`` for ``x, y = batch``)."""
    dims = _leading_dims(split_batch(batch)[0])
    lead = dims[0] if dims else None
    if lead is None:
        raise WorkloadError("cannot tell how many samples a batch holds (no tensor in it); return a count from the "
                            "workload: count(batch) -> samples")
    return lead


def loader_kwargs(built: Any, config: Any, seed: int) -> dict[str, Any]:
    """``DataLoader(built.dataset, **loader_kwargs(...))``: the config's knobs, the workload's collate_fn and
    sampler; shuffled (seeded) only for a map-style dataset without a sampler, as before."""
    import torch

    kw = {"drop_last": True, **config.dataloader_kwargs()}
    if built.collate_fn is not None:
        kw["collate_fn"] = built.collate_fn
    if built.sampler is not None:
        kw["sampler"] = built.sampler
    elif not isinstance(built.dataset, torch.utils.data.IterableDataset):
        kw["shuffle"] = True
        kw["generator"] = torch.Generator().manual_seed(seed)
    return kw


def steps_per_epoch(loader: Any) -> int | None:
    """Batches per epoch, or None when the dataset (an IterableDataset) has no length."""
    try:
        return len(loader)
    except TypeError:
        return None


def user_parts(built: Any) -> tuple[str, ...]:
    """The parts of a built workload that are the user's own rather than autotune's (see ``PARTS``)."""
    return tuple(p for p in PARTS if getattr(built, p, None) is not None)
