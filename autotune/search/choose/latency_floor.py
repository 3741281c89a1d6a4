"""Before a search under a latency bound: refuse, in one line, a bound no config can meet.

The floor is one step's measured latency at the smallest batch the space offers, with the baseline's other
knobs (PyTorch's defaults): the fastest step (``TrialResult.latency_min_ms``) of one short trial in a child. A
p99 bound under it cannot be met by any config of the space that runs eager (compile or reduced precision could
shave some off, which is why the fastest step is taken, not the median), so a search would only end with no
feasible config after its whole budget. A bound over it is searched as usual: the floor trial is not stored.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError, WorkloadError

__all__ = ["check_floor", "floor_config"]


def floor_config(space: Any):
    """The baseline config at the smallest batch size ``space`` offers."""
    base = space.baseline_config()
    sizes = [p.choices for p in space.params if p.name == "batch_size"]
    smallest = min(sizes[0]) if sizes and sizes[0] else base.batch_size
    return base.replace(batch_size=int(smallest))


def check_floor(tuner: Any, *, runner: Any = None) -> float | None:
    """Measure the floor (see the module docstring) when ``tuner.measure`` has a latency bound; a
    ``ConfigError`` when the bound is under it. Returns the floor in ms (None: no bound, or not measured)."""
    bound = tuner.measure.latency_p99_ms
    if bound is None:
        return None
    from autotune.search.record.storage import machine_lock

    config = floor_config(tuner.space)
    measure = tuner.measure.replace(windows=1, window_s=min(0.5, tuner.measure.window_s), settle_windows=0,
                                    min_window_steps=5, warmup_min_steps=1)
    tuner.log(f"measuring one step's latency floor ({config.short()}) against the {bound:g} ms p99 bound")
    with machine_lock(f"latency floor of {tuner.study_name}"):  # trials never share the cores
        res = (runner or tuner.runner)(tuner.workload, config, measure)
    if res.user_error:
        raise WorkloadError(res.reason.removeprefix("WorkloadError: "))
    floor = res.latency_min_ms
    if not res.ok or floor is None:  # the search will say what is wrong with it
        tuner.log(f"the latency floor was not measured ({res.status}: {res.reason}); searching anyway")
        return None
    if floor > bound:
        raise ConfigError(f"--latency-p99 {bound:g}ms is under one step's measured floor: the fastest step at "
                          f"batch size {config.batch_size} took {floor:.2f} ms here ({config.short()}), so no "
                          f"config can meet it; raise the bound above {floor:.2f} ms")
    tuner.log(f"latency floor {floor:.2f} ms at batch size {config.batch_size}: under the {bound:g} ms bound")
    return floor
