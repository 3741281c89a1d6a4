"""A partial set of knobs (a plan's step: ``{**best, "num_workers": 1}``) as the full set of a space's Optuna params,
so that a queued trial runs exactly the config the plan reads back (``search.plan.coordinate``)."""

from __future__ import annotations

from typing import Any

__all__ = ["complete", "COMES_ON"]

# A knob that comes on with another takes this value where a queued config does not say: once there are workers,
# persistent ones (the likely winners' loader on a GPU has them, ``likely._gpu_loader``). Without them PyTorch's
# DataLoader forks its workers anew at every epoch's start, which a small dataset meets every few seconds: on the
# quality benchmark's 4096 samples (mobilenet_v3_small at 32 px, an epoch per ~3 s, 2026-11-30) the 4-minute search's
# workers step ran without them and its pick measured x0.92 of the 10-minute one's, which had them and one inter-op
# thread. The coordinate step still tries them off, one knob, as any other.
COMES_ON = {"persistent_workers": True}


def complete(space, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as a full set of the space's Optuna params: a conditional knob whose condition now holds (prefetch
    once there are workers) gets its baseline value, else, where ``params`` does not name it, its value in
    ``COMES_ON`` where the space offers it, else its first choice (a knob named with a value the space lacks, as a
    separation's revert to a baseline that has none, takes the first: persistent workers off); one whose condition
    does not hold is dropped. So the queued trial runs exactly the config the plan reads back.

    >>> from autotune.search.space.search_space import Param, SearchSpace
    >>> space = SearchSpace("s", "cpu", [Param("num_workers", "int", (0, 1)), Param("persistent_workers", "bool",
    ...     (False, True), when=("num_workers", ">", 0))], fixed={}, baseline={"num_workers": 0})
    >>> complete(space, {"num_workers": 1}), complete(space, {"num_workers": 0, "persistent_workers": True})
    ({'num_workers': 1, 'persistent_workers': True}, {'num_workers': 0})
    >>> complete(space, {"num_workers": 1, "persistent_workers": None})
    {'num_workers': 1, 'persistent_workers': False}
    """
    out: dict[str, Any] = {}
    for p in space.params:
        if not p.holds(out):
            continue
        v = params.get(p.name)
        if p.name not in params or v not in p.choices:
            base = space.baseline.get(p.name)
            on = COMES_ON.get(p.name) if p.name not in params else None  # a revert to None means the plainest
            v = base if base in p.choices else on if on is not None and on in p.choices else p.choices[0]
        out[p.name] = v
    return out
