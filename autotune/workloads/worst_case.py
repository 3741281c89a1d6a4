"""The largest batch a workload's data can produce: what a config's memory is judged on before it is recommended.

A trial's windows see the batches they happen to draw. With variable lengths (or length bucketing, which makes
whole batches of long sequences) the longest batch can come hours into the real run and run out of memory, so
before a config is recommended it runs, in a child under the trials' caps, on this batch over and over
(``MeasureSpec.worst_case``; the tuner's side is ``autotune.search.choose.final_checks``):

* the workload returns ``worst_case_batch(batch_size) -> batch``: that batch (its own idea of the worst case,
  e.g. detection with the largest images);
* else it returns ``length``: its ``batch_size`` longest items, through its ``collate_fn`` (padding to the longest
  is the collate's business, as in a real batch); the built-in text workload takes this path;
* else (fixed shapes): a normal batch, its first ``batch_size`` items; the finalists' own rounds ran such
  batches under the same caps, so the tuner needs no extra child for it (``needs_child``).

``make_batch`` returns the batch and what it is (``{"source", "what", "batch": tensors, "lengths"}``), which the
recommendation's YAML keeps as ``worst_case``. A batch the model then rejects (anything but running out of
memory) is a ``WorkloadError`` naming where the batch came from (``guarded``).
"""

from __future__ import annotations

from typing import Any, Callable

from autotune.errors import WorkloadError

__all__ = ["make_batch", "Repeat", "guarded", "needs_child", "SOURCES"]

SOURCES = ("worst_case_batch", "longest", "normal")


def needs_child(data: dict[str, Any] | None) -> bool:
    """Whether a workload with this probed data (``Workload.data``) can make a batch larger than the ones its
    trials drew: it returns ``worst_case_batch`` or ``length``."""
    return bool(data) and (bool(data.get("worst_case_batch")) or data.get("lengths") is not None)


def _collate(built: Any, items: list, what: str) -> Any:
    import torch

    collate = built.collate_fn or torch.utils.data.default_collate
    try:
        return collate(items)
    except Exception as exc:
        raise WorkloadError(f"the workload's collate could not make {what}: {type(exc).__name__}: {exc}") from None


def make_batch(built: Any, batch_size: int) -> tuple[Any, dict[str, Any]]:
    """``(batch, description)``: the largest batch ``built`` (a ``workloads.build.Built``) can produce at
    ``batch_size`` (see the module docstring)."""
    import itertools

    import torch

    from autotune.workloads.probe import describe_batch, lengths_of

    if built.worst_case_batch is not None:
        what = f"worst_case_batch({batch_size})"
        try:
            batch = built.worst_case_batch(batch_size)
        except Exception as exc:
            raise WorkloadError(f"the workload's {what} raised {type(exc).__name__}: {exc}") from None
        leaves = describe_batch(batch)
        if not leaves:
            raise WorkloadError(f"the workload's {what} returned {type(batch).__name__} with no tensor in it; it "
                                "must return one batch as the DataLoader would give it")
        return batch, {"source": "worst_case_batch", "what": what, "batch": leaves, "lengths": None}
    iterable = isinstance(built.dataset, torch.utils.data.IterableDataset)
    if built.length is not None and not iterable:
        import numpy as np

        lengths = lengths_of(built)
        longest = np.argsort(-lengths, kind="stable")[:batch_size]
        chosen = lengths[longest]
        what = f"the {len(longest)} longest items (lengths {int(chosen.min())} to {int(chosen.max())})"
        batch = _collate(built, [built.dataset[int(i)] for i in longest], what)
        return batch, {"source": "longest", "what": what, "batch": describe_batch(batch),
                       "lengths": {"min": int(chosen.min()), "max": int(chosen.max())}}
    items = (list(itertools.islice(iter(built.dataset), batch_size)) if iterable
             else [built.dataset[i] for i in range(min(batch_size, len(built.dataset)))])
    what = f"a normal batch of {len(items)} items (fixed shapes)"
    batch = _collate(built, items, what)
    return batch, {"source": "normal", "what": what, "batch": describe_batch(batch), "lengths": None}


class Repeat:
    """A loader that gives the same batch for ever (``DataLoader``'s place in the trial's loop)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self):
        while True:
            yield self.batch


def guarded(step: Callable[[Any], Any], what: str) -> Callable[[Any], Any]:
    """``step`` with anything but running out of memory (or the workload's own ``WorkloadError``) turned into a
    one-line ``WorkloadError``: the model rejects ``what``, which every config would meet in the real run."""
    from autotune.machine.oom import is_oom

    def run(batch: Any) -> Any:
        try:
            return step(batch)
        except WorkloadError:
            raise
        except Exception as exc:
            if is_oom(exc):
                raise
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise WorkloadError(f"the model rejects {what}, the largest batch the workload's data can produce: "
                                f"{type(exc).__name__}: {first}") from exc

    run.scaler = getattr(step, "scaler", None)  # type: ignore[attr-defined]
    return run
