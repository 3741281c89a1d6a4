"""When the search stops, phase by phase, for every backend.

1. The planned search (``coordinate``): the baseline, the likely winners, each of them apart, the batch walk
   from the best config so far, the other knobs one at a time. Nothing stops it but the budget.
2. The sampler (TPE, never proposing compile: ``compile_gate.holding_back``) until the eager search settles:
   it converged (``convergence``: a patience from the cost of a trial), it keeps proposing configs the study
   already answered (the space is exhausted), or the budget has room for the compile trial and no more (once
   the planned search is done: a budget too small for it never reaches compile).
3. Compile last (``compile_last``): the best eager config with the space's compile modes, when the compile
   gate says one fits the time left. Then the search stops, saying why (``stop_reason``), and the finalists
   are re-measured.

A study from before the planned search (no ``search_plan`` attribute) goes through 2 and 3 as well.
The backends ask through their ``context.SearchContext`` (``ctx``); the tuner asks ``run_seconds`` and ``advance``
with what they need.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from autotune.search.plan import compile_last
from autotune.search.choose import finalists as fin
from autotune.search.plan import queue as study_queue
from autotune.search.record import trials as keys
from autotune.search.plan.convergence import noise_of
from autotune.search.record.trials import MemoryLimit, feasible_by_config

if TYPE_CHECKING:
    from optuna import Study

    from autotune.search.plan.context import SearchContext
    from autotune.search.choose.payback import RunLength
    from autotune.search.space.search_space import SearchSpace

__all__ = ["run_seconds", "advance", "stop_reason", "status_line"]


def run_seconds(study: Study, *, run_length: RunLength, fingerprint: str, limit: MemoryLimit) -> float:
    """The planned run in seconds: ``--run-length``, or ``--planned-steps`` at the best config's batch size and
    rate so far (an hour while nothing ran)."""
    run = run_length
    if run.seconds is not None:
        return float(run.seconds)
    feasible = feasible_by_config(study, fingerprint, limit)
    best = max(feasible.values(), key=lambda t: t.value or 0.0, default=None)
    if best is None or not best.value:
        return 3600.0
    return run.steps * keys.config_of(best).batch_size / best.value


def advance(study: Study, space: SearchSpace, *, fingerprint: str, limit: MemoryLimit,
            log: Callable[[str], None]) -> None:
    """After a trial: compile's next mode on the best eager config where the one before paid (``compile_last``)."""
    compile_last.advance(study, space, noise=noise_of(study.get_trials(deepcopy=False)), fingerprint=fingerprint,
                         limit=limit, enqueue=study_queue.enqueue, log=log)


def _eager_over(ctx: SearchContext, study: Study, *, walls: list[float], deadline: float | None, budget_s: float | None,
                trials_left: int | None, exhausted: int) -> str | None:
    """Why the eager search is over now, or None."""
    conv = ctx.convergence(study)
    if conv.converged:
        return conv.why()
    if exhausted:
        return (f"the space looks exhausted: the sampler proposed {exhausted} configs in a row that the study had "
                "already answered")
    plan = ctx.plan(study)
    if (not compile_last.modes(ctx.space) or ctx.compile_gate.reason(study) is not None
            or (plan is not None and not plan.done)
            or compile_last.best_eager(study, fingerprint=ctx.fingerprint, limit=ctx.limit) is None):
        # no compile to leave room for, or no eager search settled to try it on: the budget ends the search
        return None
    if trials_left is not None and trials_left <= 1:
        return "the budget's last trial is compile's"
    if deadline is not None and walls:
        left = fin.search_left_s(walls, deadline, budget_s, finalists=ctx.finalists, rounds=ctx.finalist_rounds,
                                 check_s=ctx.numerics_check_s(study), measure=ctx.measure)  # as out_of_time's
        expected, _ = ctx.compile_gate.expected_s(study.get_trials(deepcopy=False))
        if expected <= left < expected + fin.long_trial_s(walls):
            return f"the time left for the search ({left:.0f} s) is the compile trial's (~{expected:.0f} s)"
    return None


def stop_reason(ctx: SearchContext, study: Study, *, walls: list[float], deadline: float | None = None,
                budget_s: float | None = None, trials_left: int | None = None, exhausted: int = 0) -> str | None:
    """Why the search stops before its next trial, or None to go on. ``exhausted``: how many proposals in a row
    the study answered, once the backend takes that for an exhausted space (else 0). Settling the eager
    search queues compile on its best config (``compile_last.settle``), so the search goes on until that ran."""
    # --patience 0 reopens a study whose eager search converged earlier: search on until the budget ends it
    if study.user_attrs.get(keys.EAGER_SETTLED) is None or ctx.patience == 0:
        why = _eager_over(ctx, study, walls=walls, deadline=deadline, budget_s=budget_s, trials_left=trials_left,
                          exhausted=exhausted)
        if why is None:
            return None
        compile_last.settle(study, ctx.space, why=why, blocked=ctx.compile_gate.reason(study),
                            fingerprint=ctx.fingerprint, limit=ctx.limit, enqueue=study_queue.enqueue, log=ctx.log)
    advance(study, ctx.space, fingerprint=ctx.fingerprint, limit=ctx.limit, log=ctx.log)
    if compile_last.pending(study):
        return None
    return compile_last.summary(study)


def status_line(ctx: SearchContext, study: Study, deadline: float | None = None) -> str:
    """The progress bar's account of the phase: the planned search's step, the sampler's count towards
    converging, or compile last; and the time left."""
    if study.user_attrs.get(keys.EAGER_SETTLED) is not None:
        part = "compile last" if compile_last.pending(study) else "settled"
    else:
        plan = ctx.plan(study)
        conv = ctx.convergence(study)
        part = (f"planned: {plan.label()}" if plan is not None and not plan.done
                else conv.progress() if conv.patience else "sampler")
    if deadline is not None:
        part += f", {max(0, deadline - time.monotonic()) / 60:.0f} min left"
    return part
