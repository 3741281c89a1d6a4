"""The search space for N DDP ranks on one machine (issue 27): threads and workers per rank within the cores, and
DDP's own arguments searched. A step of ``search.space.search_space.space_for``, the one chain every caller uses.

>>> for_ranks(space, 2).describe().splitlines()[0]                          # doctest: +SKIP
'search space cpu (.../cpu.yaml), 8 usable cores, 2 ranks x 4 each'
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.config import DDP_KNOBS, TrialConfig
from autotune.search.space.param import Param

__all__ = ["DDP_PARAMS", "for_ranks"]

# DDP's own arguments as searched for several ranks, where a space does not list them: the bucket size around
# DDP's 25 MiB (smaller buckets start all-reducing earlier in the backward, larger ones make fewer calls).
DDP_PARAMS = (Param("bucket_cap_mb", "int", (5, 25, 100)), Param("gradient_as_bucket_view", "bool", (False, True)),
              Param("static_graph", "bool", (False, True)))
_PER_RANK = ("intra_op_threads", "inter_op_threads", "num_workers")


def for_ranks(space: Any, world_size: int) -> Any:
    """``space`` for trials of ``world_size`` DDP ranks sharing this machine's cores. Threads and workers are per
    rank: unless the space says ``oversubscribe``, their choices above a rank's share (usable cores // ranks) are
    dropped, the baseline's clamped, and ``effective`` keeps each rank's threads within what its workers leave
    (at least one). DDP's arguments (``DDP_PARAMS``) are added, at DDP's defaults in
    the baseline, unless the space lists or fixes them. For one process they are never searched: a space that
    lists them has them dropped, with a note, so one process runs at DDP's defaults as before."""
    params, fixed, baseline, notes = list(space.params), dict(space.fixed), dict(space.baseline), list(space.notes)
    listed = [p.name for p in params if p.name in DDP_KNOBS] + [k for k in fixed if k in DDP_KNOBS]
    if world_size <= 1:
        if not listed:
            return space
        notes.append(f"{', '.join(listed)} dropped: DDP's arguments mean something only with --nproc-per-node > 1")
        return dataclasses.replace(space, params=[p for p in params if p.name not in DDP_KNOBS], notes=notes,
                                   fixed={k: v for k, v in fixed.items() if k not in DDP_KNOBS},
                                   baseline={k: v for k, v in baseline.items() if k not in DDP_KNOBS})
    ranked = dataclasses.replace(space, ranks=world_size)
    if not space.oversubscribe:
        params = [_rank_param(p, ranked.rank_cores, world_size, space.usable_cores, notes) for p in params]
        for p in params:
            b = baseline.get(p.name)
            if p.name in _PER_RANK and isinstance(b, int) and b not in p.choices:
                baseline[p.name] = max([c for c in p.choices if c <= b] or [min(p.choices)])
    for p in DDP_PARAMS:
        if p.name not in listed:
            params.append(p)
            baseline.setdefault(p.name, TrialConfig.__dataclass_fields__[p.name].default)
    return dataclasses.replace(ranked, params=params, fixed=fixed, baseline=baseline, notes=notes)


def _rank_param(p: Param, rank_cores: int, world_size: int, cores: int, notes: list[str]) -> Param:
    """A thread or worker parameter cut to one rank's share of the cores (others as they are)."""
    if p.name not in _PER_RANK:
        return p
    # a rank's workers may take its whole share (the ceilings measure whether that feeds it: search.record.ceilings)
    limit = rank_cores
    kept = [c for c in p.choices if c <= limit]
    if len(kept) == len(p.choices):
        return p
    notes.append(f"{p.name} {[c for c in p.choices if c > limit]} dropped: {world_size} ranks share {cores} usable "
                 f"cores, {rank_cores} each")
    return dataclasses.replace(p, choices=tuple(kept or [max(0, min(limit, min(p.choices)))]))
