"""The batch-size walk: which batch sizes to queue next, as a pure function of what the study measured.

Batch size is the knob no rule of thumb settles, and a sampler given few trials spends its first ones at
random. So the walk starts at an anchor (the likely winner, else the baseline) and goes one batch choice at a
time in each direction for as long as each step beat the best on its line, and one step further where a step
came within the noise of that best (the planned search's walk, ``coordinate``; a study from before it walks with
no look. Issue 50: one noisy trial at batch 128 ended a 4-minute walk that a 10-minute run took to 256, x1.8).
``next_steps`` is worked out afresh from the study's finished trials after every trial, so it does not matter in
which order the steps finish (several workers, Ray), whether a step was measured by the sampler rather than
queued, or whether a run was killed half-way: the first step of a direction that is not measured yet is queued
unless it already exists in any state. A step that failed, ran out of memory, was pruned or was slower beyond the
noise ends its direction, as does a second step in a row that did not beat the best. Decided on single trials'
medians: on a noisy machine a lucky step may cost one more trial, and the look past a step within the noise keeps an
unlucky one from ending the walk.

>>> next_steps({"batch_size": 8}, space, measured={k8: 10.0}, present={k8})   # doctest: +SKIP
[Step(params={'batch_size': 16}, direction=1, ...)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping

from autotune.search.record.trials import MemoryLimit, config_of, is_feasible

__all__ = ["Step", "next_steps", "walked", "evidence"]


@dataclass(frozen=True)
class Step:
    """A walk step to queue: its params, the direction (-1 down, +1 up), and the step it follows. ``best_batch``
    and ``best_value``: where the step it follows did not beat the best on the line but came within the noise of it
    (``best_batch``'s figure), and this step looks one further before the direction ends."""

    params: dict[str, Any]
    direction: int
    after_batch: int
    after_value: float
    best_batch: int | None = None
    best_value: float = 0.0

    def why(self) -> str:
        if self.best_batch is not None:
            return (f"batch {self.after_batch} ({self.after_value:.1f} samples/s) came within the noise of batch "
                    f"{self.best_batch} ({self.best_value:.1f}): batch {self.params['batch_size']} is measured "
                    "before the walk ends this way")
        return (f"batch {self.after_batch} ({self.after_value:.1f} samples/s) beat the step before: "
                f"batch {self.params['batch_size']} is queued next")


def _line(anchor: dict[str, Any], space, measured: Mapping[tuple, float], d: int, noise: float):
    """The walk from ``anchor`` in direction ``d`` over what is measured: ``(the measured steps in order, the
    first step not measured yet or None, the Step to queue for it or None)``. A step goes on from one that beat
    the best on the line; one that did not but came within ``noise`` of it earns one look further, once a best."""
    steps: list[dict[str, Any]] = []
    here, value = anchor, measured.get(space.effective(anchor).key())
    best, best_batch, looked = value or 0.0, anchor.get("batch_size"), False
    while value:  # the config we stand on was measured and feasible
        step = space.batch_step(here, d)
        if step is None:
            return steps, None, None
        step_value = measured.get(space.effective(step).key())
        if step_value is None:  # not measured yet: queued, running, or to be queued now
            within = here["batch_size"] != best_batch  # ``here`` is a look within the noise, not the best
            return steps, step, Step(step, d, here["batch_size"], value, *((best_batch, best) if within else ()))
        steps.append(step)
        if step_value > best:
            best, best_batch, looked = step_value, step["batch_size"], False
        elif looked or noise <= 0 or step_value * (1 + noise) < best:
            return steps, None, None
        else:
            looked = True
        here, value = step, step_value
    return steps, None, None


def next_steps(anchor: dict[str, Any], space, measured: Mapping[tuple, float],
               present: Collection[tuple], noise: float = 0.0) -> list[Step]:
    """The steps to queue now.

    ``measured``: config key -> best finished figure (0.0 when it failed, was pruned or was infeasible);
    a config absent from it has not finished yet. ``present``: keys of every trial in any state (queued,
    running, finished), so a step is never queued twice. ``noise``: a step that did not beat the best on its
    line but came within this fraction of it looks one step further (0: the direction ends there).
    """
    out = []
    for d in (-1, 1):
        _, pending, step = _line(anchor, space, measured, d, noise)
        if pending is not None and space.effective(pending).key() not in present:
            out.append(step)
    return out


def walked(anchor: dict[str, Any], space, measured: Mapping[tuple, float],
           noise: float = 0.0) -> tuple[bool, list[dict[str, Any]]]:
    """``(over, line)``: whether the walk from ``anchor`` has ended in both directions (each at a step that did
    not beat the best on the line, beyond one look within ``noise`` of it, or at the end of the choices), and the
    params of every config on the walked line that was measured, the anchor first. ``measured`` as for
    ``next_steps``; an anchor not measured is not over.

    >>> walked({"batch_size": 16}, space, {k16: 10.0, k8: 5.0, k32: 20.0})   # doctest: +SKIP
    (False, [{'batch_size': 16}, {'batch_size': 8}, {'batch_size': 32}])      # 64 is still to measure
    """
    if measured.get(space.effective(anchor).key()) is None:
        return False, [anchor]
    over, line = True, [anchor]
    for d in (-1, 1):
        steps, pending, _ = _line(anchor, space, measured, d, noise)
        line += steps
        over = over and pending is None
    return over, line


def evidence(trials: Iterable, space, limit: MemoryLimit | None = None) -> tuple[dict[tuple, float], set[tuple]]:
    """``(measured, present)`` for ``next_steps`` from a study's trials (``study.get_trials()``); a trial
    counts as feasible under ``limit`` (None: as recorded)."""
    from optuna.trial import TrialState

    measured: dict[tuple, float] = {}
    present: set[tuple] = set()
    for t in trials:
        config = config_of(t, space)
        if config is None or (limit is not None and t.state.is_finished() and not limit.binds(t)):
            continue  # killed or skipped under a lower cap than now: as if never tried
        key = config.key()
        present.add(key)
        if t.state.is_finished():
            value = (t.value or 0.0) if t.state == TrialState.COMPLETE and is_feasible(t, limit) else 0.0
            measured[key] = max(measured.get(key, 0.0), value)
    return measured, present
