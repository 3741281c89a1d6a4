"""What a workload's data is, read from its first batch: the knobs the search offers follow from it.

``probe(built)`` collates the first few items of a built workload (through its ``collate_fn`` and ``sampler``
when it has them, as the trial's DataLoader will) and returns a plain mapping, kept as ``Workload.data`` and in
the recommendation's YAML::

    {"items": 4,                                   # items in the probed batch
     "batch": [{"path": "input_ids", "shape": [4, 57], "dtype": "int64"}, ...],   # its tensors, depth first
     "image": False,                               # a 4-D floating tensor in it: channels_last can matter
     "lengths": {"min": 12, "max": 57},            # what the workload's ``length`` gave those items, or None
     "takes": ["image_size"],                      # the keyword arguments a module:callable took
     "sampler": False,                             # the workload brings its own sampler
     "worst_case_batch": False,                    # it returns worst_case_batch (workloads.worst_case)
     "footprint": {"items": [2, 4], "bytes": [1234, 2468], "tensors": [2, 2], "source": "longest"}}

``footprint`` is what a DataLoader worker would put in shared memory for batches of 2 and of 4 items (their tensors'
storages, ``batch_footprint``) of the largest batches the workload says it makes (``source``): its
``worst_case_batch``; else, where it gives ``length``, its 4 longest items (a padding collate pads a batch to its
longest item: the first 4 items of ``[10] * 4 + [512] * 1000`` would size a batch of 64 at 1/50 of what it is);
else its first items, exact with PyTorch's default collate (``stacked``: one shape or an error), and with a collate
of its own (``first``) a floor only: each trial then collates a full batch before its workers start
(``trial.loader_watch``). ``footprint_at`` extrapolates it to any batch size, which the search's loader memory rule
reads before a trial runs (``search.space.loader_fit``); each trial then measures its first batch.

The search space reads it (``search.space.search_space.fit_workload``): ``channels_last`` only where a batch holds a 4-D
floating-point tensor, ``bucket_by_length`` only where the workload gives ``length`` and no sampler of its own.
The built-in workloads are probed the same way, in this process (their data is autotune's own and cheap to
make); a ``module:callable`` in the check child (``workloads.check_child``), so the parent never runs user code.

``length`` (a part of the workload contract) is a function of one dataset item returning its length, a
non-negative int, as Hugging Face's ``group_by_length`` uses; anything else is a one-line ``WorkloadError``.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import WorkloadError

__all__ = ["PROBE_ITEMS", "probe", "describe_batch", "batch_footprint", "footprint_at", "item_length", "lengths_of",
           "length_sampler", "check_knobs", "sized_before",
           "searches_channels_last", "searches_bucketing"]

PROBE_ITEMS = 4  # enough for a padding collate to show its variable lengths; cheap for any dataset
_MAX_LEAVES = 32  # a batch with more tensors is summarised by its first ones: the YAML stays readable


def _leaves(obj: Any, path: str, out: list[tuple[str, Any]]) -> None:
    import torch

    if len(out) >= _MAX_LEAVES:
        return
    if isinstance(obj, torch.Tensor):
        out.append((path or "batch", obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _leaves(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            _leaves(v, f"{path}[{i}]", out)


def describe_batch(batch: Any) -> list[dict[str, Any]]:
    """The tensors of a batch of any structure, depth first: ``path`` (``[0]``, ``input_ids``, ``x.mask``),
    ``shape`` and ``dtype``."""
    found: list[tuple[str, Any]] = []
    _leaves(batch, "", found)
    return [{"path": p, "shape": [int(n) for n in t.shape], "dtype": str(t.dtype).removeprefix("torch.")}
            for p, t in found]


def batch_footprint(batch: Any) -> tuple[int, int]:
    """``(bytes, tensors)`` of a batch of any structure (tuples, lists, dicts, their nesting): what a DataLoader
    worker hands over in shared memory, its tensors' storages counted once each (a view of a large tensor shares
    all of its storage). Strings and numbers travel pickled, not shared: they count for nothing.

    >>> import torch
    >>> x = torch.zeros(4, 3, 8, 8)
    >>> batch_footprint({"x": x, "y": torch.zeros(4, dtype=torch.long), "view": x[0], "name": "a"})
    (3104, 2)
    """
    import torch

    seen: dict[tuple[int, int], int] = {}
    stack = [batch]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (tuple, list)):
            stack.extend(obj)
    return sum(seen.values()), len(seen)


def footprint_at(data: dict[str, Any] | None, batch_size: int) -> tuple[float, int] | None:
    """``(bytes, tensors)`` of a batch of ``batch_size`` by the probe's ``footprint`` (``Workload.data``): linear
    through its batches of 2 and 4 items (a stacked tensor grows with the items, a padded one with the longest of
    them, a list of per-item tensors in count); None without it.

    >>> footprint_at({"footprint": {"items": [2, 4], "bytes": [1000, 2000], "tensors": [2, 2]}}, 64)
    (32000.0, 2)
    """
    fp = (data or {}).get("footprint")
    if not fp or not fp.get("items"):
        return None
    items, sizes, counts = fp["items"], fp["bytes"], fp["tensors"]
    if len(items) < 2 or items[-1] == items[0]:
        per = sizes[-1] / max(1, items[-1])
        return per * batch_size, int(counts[-1])
    slope = (sizes[-1] - sizes[0]) / (items[-1] - items[0])
    tslope = (counts[-1] - counts[0]) / (items[-1] - items[0])
    at = lambda first, k: first + k * (batch_size - items[0])  # noqa: E731
    return max(0.0, at(sizes[0], slope)), max(1, round(at(counts[0], tslope)))


_SOURCES = {"worst_case_batch": "the workload's worst_case_batch", "longest": "its longest items by length",
            "stacked": "its first items (PyTorch's default collate: every item the same shape)",
            "first": "its first items (its own collate_fn: a full batch is measured in each trial before its workers "
                     "start)"}


def sized_before(built: Any) -> bool:
    """Whether the probe's footprint bounds every batch of ``built``: it returns ``worst_case_batch``, or ``length``
    over a map-style dataset (its longest items), or it keeps PyTorch's default collate (which stacks items of one
    shape or raises). Else, with a ``collate_fn`` of its own, a batch of its first items says nothing of a padded
    batch of long ones, and each trial measures a full batch first (``trial.loader_watch.check_full_batch``)."""
    import torch

    if built.collate_fn is None or getattr(built, "worst_case_batch", None) is not None:
        return True
    return built.length is not None and not isinstance(built.dataset, torch.utils.data.IterableDataset)


def _footprint(built: Any, collate: Any, items: list[Any]) -> dict[str, Any]:
    """The ``footprint`` of the probe: batches of 2 (when there are more than 2) and ``len(items)`` items of the
    largest batches the workload says it makes (``source``): its ``worst_case_batch``, else its longest items by
    ``length`` (every item's length read, as the worst case and bucketing read them), else its first items."""
    import numpy as np

    sizes = [n for n in (2, len(items)) if n <= len(items)] if len(items) > 2 else [len(items)]
    if getattr(built, "worst_case_batch", None) is not None:
        source, make = "worst_case_batch", built.worst_case_batch
    elif sized_before(built) and built.collate_fn is not None:
        lengths = lengths_of(built)
        longest = [built.dataset[int(i)] for i in np.argsort(-lengths, kind="stable")[:len(items)]]
        source, make = "longest", lambda n: collate(longest[:n])
    else:
        source, make = ("first" if built.collate_fn is not None else "stacked"), lambda n: collate(items[:n])
    try:
        prints = [batch_footprint(make(n)) for n in sizes]
    except Exception as exc:
        raise WorkloadError(f"the workload could not make a batch of {_SOURCES[source]}: "
                            f"{type(exc).__name__}: {exc}") from None
    return {"items": sizes, "bytes": [b for b, _ in prints], "tensors": [t for _, t in prints], "source": source}


def _is_image(leaf: dict[str, Any]) -> bool:
    return len(leaf["shape"]) == 4 and leaf["dtype"] in ("float32", "float16", "bfloat16", "float64")


def item_length(length: Any, item: Any, where: str = "an item") -> int:
    """``length(item)`` checked: a non-negative int (a 0-d integer tensor or numpy integer is taken as one)."""
    try:
        v = length(item)
    except Exception as exc:
        raise WorkloadError(f"the workload's length raised {type(exc).__name__} on {where}: {exc}") from None
    if hasattr(v, "dtype") and getattr(v, "ndim", None) == 0 and "int" in str(v.dtype):
        v = int(v.item())
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise WorkloadError(f"the workload's length returned {v!r} ({type(v).__name__}) for {where}; it must "
                            "return the item's length as a non-negative int")
    return v


def _first_items(built: Any) -> list[Any]:
    import itertools

    import torch

    if isinstance(built.dataset, torch.utils.data.IterableDataset):
        return list(itertools.islice(iter(built.dataset), PROBE_ITEMS))
    indices = (list(itertools.islice(iter(built.sampler), PROBE_ITEMS)) if built.sampler is not None
               else range(min(PROBE_ITEMS, len(built.dataset))))
    return [built.dataset[i] for i in indices]


def probe(built: Any, *, takes: tuple[str, ...] = ()) -> dict[str, Any]:
    """What the first batch of ``built`` (a ``workloads.build.Built``) holds; a one-line ``WorkloadError`` when
    it cannot be made or its ``length`` is not an int >= 0."""
    import torch

    items = _first_items(built)
    if not items:
        raise WorkloadError("the workload's dataset gave no item to make a batch of")
    collate = built.collate_fn or torch.utils.data.default_collate
    try:
        batch = collate(items)
    except Exception as exc:
        what = "collate_fn" if built.collate_fn else "items (PyTorch's default collate)"
        raise WorkloadError(f"the workload's {what} could not make a batch of its first {len(items)} items: "
                            f"{type(exc).__name__}: {exc}") from None
    leaves = describe_batch(batch)
    if getattr(built, "worst_case_batch", None) is not None:
        _check_worst_case(built, len(items), leaves)
    lengths = None
    if built.length is not None:
        if isinstance(built.dataset, torch.utils.data.IterableDataset):
            raise WorkloadError("the workload returned length with an IterableDataset; grouping by length needs a "
                                "map-style dataset (__len__/__getitem__): drop length")
        seen = [item_length(built.length, it, f"item {i}") for i, it in enumerate(items)]
        lengths = {"min": min(seen), "max": max(seen)}
    return {"items": len(items), "batch": leaves, "image": any(_is_image(leaf) for leaf in leaves),
            "lengths": lengths, "takes": list(takes), "sampler": built.sampler is not None,
            "worst_case_batch": getattr(built, "worst_case_batch", None) is not None,
            "footprint": _footprint(built, collate, items)}


def lengths_of(built: Any) -> Any:
    """Every item's length (a numpy array), by the workload's ``length``, checked."""
    import numpy as np

    ds = built.dataset
    return np.array([item_length(built.length, ds[i], f"item {i}") for i in range(len(ds))], dtype=np.int64)


def length_sampler(built: Any, batch_size: int, *, seed: int = 0) -> Any:
    """The ``LengthBuckets`` sampler (``workloads.text``) over ``built``'s lengths: what ``bucket_by_length``
    gives any workload that returns ``length``."""
    from autotune.workloads.text import LengthBuckets

    if built.length is None:
        raise WorkloadError("--bucket-by-length groups a workload's items by length, and this one returns no "
                            "length; return length (item -> int) from the workload, or drop it")
    if built.sampler is not None:
        raise WorkloadError("--bucket-by-length orders the items by length, and the workload brings its own "
                            "sampler; drop one of them")
    return LengthBuckets(lengths_of(built), batch_size, seed=seed)


def searches_channels_last(data: dict[str, Any]) -> bool:
    """Whether channels_last can matter for this data: a 4-D floating tensor in its batches."""
    return bool(data.get("image"))


def searches_bucketing(data: dict[str, Any]) -> bool:
    """Whether batches can be grouped by length: the workload gives ``length`` and no sampler of its own."""
    return data.get("lengths") is not None and not data.get("sampler")


def check_knobs(workload: Any, config: Any) -> None:
    """Refuse a knob that means nothing for this workload's data (``workload.data``, set by ``build.check``):
    ``--channels-last`` without a 4-D image tensor, ``--bucket-by-length`` without ``length``."""
    data = workload.data
    if data is None:
        return
    if config.channels_last and not searches_channels_last(data):
        raise WorkloadError(f"--channels-last applies to 4-D image tensors; the batches of {workload.model} hold "
                            f"none ({_shapes(data)}): drop it")
    if config.bucket_by_length and not searches_bucketing(data):
        why = "brings its own sampler" if data.get("sampler") else "returns no length (item -> int)"
        raise WorkloadError(f"--bucket-by-length groups a workload's items by length; {workload.model} {why}: "
                            "drop it")


def _shapes(data: dict[str, Any]) -> str:
    return ", ".join(f"{leaf['path']} {leaf['dtype']}{leaf['shape']}" for leaf in data.get("batch", ())[:4])


def _structure(leaves: list[dict[str, Any]]) -> list[tuple]:
    return [(leaf["path"], len(leaf["shape"]), leaf["dtype"]) for leaf in leaves]


def _check_worst_case(built: Any, n: int, leaves: list[dict[str, Any]]) -> None:
    """Refuse, in one line and before any trial, a ``worst_case_batch`` whose batch the model would reject: one
    that raises, holds other tensors (paths, ranks, dtypes) than the data's batches, or (for autotune's own step,
    where the model is built) that the model's forward refuses. A wrong worst case would otherwise surface only
    when the winner is checked, after the whole search."""
    what = f"worst_case_batch({n})"
    try:
        batch = built.worst_case_batch(n)
    except Exception as exc:
        raise WorkloadError(f"the workload's {what} raised {type(exc).__name__}: {exc}") from None
    seen = describe_batch(batch)
    if not seen or _structure(seen) != _structure(leaves):
        raise WorkloadError(f"the workload's {what} gives a batch unlike its data's: "
                            f"{_shapes({'batch': seen}) or type(batch).__name__} against {_shapes({'batch': leaves})}; "
                            "it must return a batch as the DataLoader gives one (the same tensors, larger)")
    if built.model is None or built.step is not None:
        return
    import torch

    from autotune.workloads.contract import split_batch

    try:
        with torch.inference_mode():
            built.model.eval()(split_batch(batch)[0])
    except Exception as exc:
        raise WorkloadError(f"the model rejects the workload's {what}: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from None
    finally:
        built.model.train()
