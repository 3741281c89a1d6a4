"""The child side of the two ceilings: a training step is a pipeline, the data path feeding the model, and each
part is measured alone in a trial child of its own (``MeasureSpec.part``), under the same caps and windows as a
trial (the parent's side is ``autotune.search.record.ceilings``).

* ``model``: the workload's own step on one batch that is already on the device, over and over (no loader:
  ``workloads.worst_case.Repeat``): how fast the model could go if the data were free. The batch is the loader's
  first, so its shapes are the ones the trial's steps see.
* ``data``: the workload's own DataLoader (its dataset, collate_fn, sampler) with the config's num_workers,
  prefetch_factor, pin_memory and persistent_workers, each batch copied to the device (non_blocking from pinned
  memory, as the trial's step copies it) and nothing else: how fast the data could come if the model were free.
  The windows synchronise the device at their edges, so a copy still in flight is counted.

A failure of the data path alone that the workload's code raised (in a worker or in the process: a dataset that
fails in a worker, a collate that raises) is the workload's: it becomes a ``WorkloadError`` naming the data path
and carrying the workload's own message, never retried. A worker that died (a signal, the OOM killer) may be the
config's doing: that point fails, and the run goes on.

Plumber (``mkuchnik/PlumberApp``) times the model on a fake dataset in the same way; the NVIDIA examples and
``romerojosh/benchy`` call the two SYNTHETIC and IO.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from autotune.errors import WorkloadError
from autotune.workloads.contract import StepOut

__all__ = ["PARTS", "alone", "DataPathOnly", "tree_cpu_s"]

PARTS = ("full", "model", "data")


def alone(part: str, built: Any, loader: Any, train_step: Callable[[Any], StepOut], config: Any,
          dev: Any) -> tuple[Any, Callable[[Any], StepOut]]:
    """``(loader, step)`` for measuring ``part`` alone (module docstring); ``full`` gives them back as they are."""
    if part == "full":
        return loader, train_step
    if part == "model":
        return _model_alone(loader, train_step, config, dev)
    if part == "data":
        return DataPathOnly(loader, config.num_workers), _copy_step(getattr(built, "count", None), config, dev)
    raise ValueError(f"part {part!r} is not one of {', '.join(PARTS)}")


def _model_alone(loader: Any, train_step: Callable[[Any], StepOut], config: Any,
                 dev: Any) -> tuple[Any, Callable[[Any], StepOut]]:
    from autotune.workloads.contract import move
    from autotune.workloads.worst_case import Repeat

    try:
        batch = next(iter(loader))
    except StopIteration:
        raise WorkloadError("the workload's dataset yielded no batch (an empty IterableDataset?)") from None
    # on the device once, in the layout the step wants: the step's own move is then a no-op
    on_device = move(batch, dev, non_blocking=False, channels_last=config.channels_last)
    dev.synchronize()
    return Repeat(on_device), train_step


def _copy_step(count: Any, config: Any, dev: Any) -> Callable[[Any], StepOut]:
    """A step that only copies the batch to the device as the trial's step would (``contract.move``), counting its
    samples as the trial does (the workload's own ``count`` where it has one)."""
    from autotune.workloads.contract import count_batch, default_count, move

    def step(batch: Any) -> StepOut:
        n = (count_batch(count, batch) if count is not None else None) or (default_count(batch), None)
        move(batch, dev, non_blocking=config.pin_memory, channels_last=config.channels_last)
        return StepOut(None, None, *n)

    step.scaler = None  # type: ignore[attr-defined]
    return step


def _worker_died(exc: BaseException) -> bool:
    """A DataLoader worker that died (a signal, the OOM killer) rather than raised: torch says it "exited
    unexpectedly"; that may be the config's doing (more workers, more memory), so the point fails, the run goes on."""
    from autotune.machine.loader_memory import failure_kind

    text = str(exc)  # out of shared memory or descriptors: the config's loader, named by trial.loader_watch
    return "exited unexpectedly" in text or "killed by signal" in text or failure_kind(exc) is not None


def _own_message(exc: BaseException) -> str:
    """``Type: message`` of the workload's own error: a DataLoader worker's comes wrapped ("Caught X in DataLoader
    worker process 0." and the worker's traceback), whose last line is the original."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and "DataLoader worker process" in lines[0]:
        return lines[-1].strip()[:400]
    return f"{type(exc).__name__}: {lines[0][:400] if lines else ''}"


class DataPathOnly:
    """The workload's loader, iterated alone: an error from it (a worker's, the collate's) is the data path's
    failure and says so with the workload's own message; running out of memory stays what it is."""

    def __init__(self, loader: Any, workers: int) -> None:
        self.loader, self.workers = loader, workers

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        from autotune.machine.oom import is_oom

        it = iter(self.loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except WorkloadError:
                raise
            except Exception as exc:
                if is_oom(exc) or _worker_died(exc):  # not the workload's code: a failed point, not its error
                    raise
                raise WorkloadError(f"the data path alone (the workload's DataLoader, {self.workers} worker(s), no "
                                    f"model) failed: {_own_message(exc)}") from exc
            yield batch


def tree_cpu_s(*, whole_trial: bool = False) -> tuple[float, float] | None:
    """``(CPU seconds, wall clock)`` of this process and its descendants (the DataLoader workers) now, or None
    where psutil cannot read them. A worker that exits between two readings (an epoch's end without persistent
    workers) keeps its seconds: once its parent reaps it they are in the parent's ``children_*`` times.
    ``whole_trial``: this process is a DDP rank, and the tree is its parent's (the trial child: every rank and
    their workers)."""
    try:
        import psutil

        me = psutil.Process().parent() if whole_trial else psutil.Process()
        total = 0.0
        for p in (me, *me.children(recursive=True)):
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
        return total, time.perf_counter()
    except Exception:  # noqa: BLE001 - a figure we can do without
        return None
