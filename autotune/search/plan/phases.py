"""When the search stops, phase by phase, for every backend.

1. The planned search (``coordinate``): the baseline, the likely winners, each of them apart, the batch walk
   from the best config so far, the other knobs one at a time. Nothing stops it but the budget.
2. The sampler (TPE, never proposing compile: ``compile_gate.holding_back``) until the eager search settles:
   it converged (``convergence``: a patience from the cost of a trial), it keeps proposing configs the study
   already answered (the space is exhausted), or the budget has room for the compile trial and no more (once
   the planned search is done: a budget too small for it never reaches compile). Where this CPU kind's record
   says compile never paid (``likely.compile_rarely_pays``: none of 3 or more runs over 5% ahead of eager, each
   costing a quarter of a 10-minute budget), a budget keeps no room for it: the eager search goes on, compile is
   tried only if it converges (or runs out of configs) first, and the search's closing line and the YAML's
   ``try`` say it was not.
3. Compile last (``compile_last``): the best eager config with the space's compile modes, when the compile
   gate says one fits the time left. Then the search stops, saying why (``stop_reason``), and the finalists
   are re-measured.

A study from before the planned search (no ``search_plan`` attribute) goes through 2 and 3 as well.
The backends ask through their ``context.SearchContext`` (``ctx``); the tuner asks ``run_seconds`` and ``advance``
with what they need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from autotune.search.plan import ceiling_runs, compile_last
from autotune.search.budget import long_trial_s
from autotune.search.plan import queue as study_queue
from autotune.search.record import trials as keys
from autotune.search.plan.convergence import Convergence, convergence, noise_of
from autotune.search.record.trials import MemoryLimit, feasible_by_config
from autotune.search.space.likely import compile_rarely_pays

if TYPE_CHECKING:
    from optuna import Study

    from autotune.search.plan.context import SearchContext, SearchOutcome
    from autotune.search.plan.coordinate import Plan
    from autotune.search.choose.payback import RunLength
    from autotune.search.space.search_space import SearchSpace

__all__ = ["run_seconds", "advance", "after_trial", "keep_incumbent", "PlanMemo", "stop_reason", "status_line",
           "search_done"]


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


def after_trial(ctx: SearchContext, study: Study, *, said: set[str], ceilings_here: bool) -> Plan | None:
    """Queue what the search needs now, after any trial (and before the first, for a resumed study): in a study
    with a planned search, the two ceilings once the baseline and the likely winners ran, when the data path may
    bind and the trials run here (``ceilings_here``: a Ray cluster's nodes are not this machine, not measured
    there yet), then the plan's next steps (``queue.advance_plan``: the bundle apart, the batch walk, one knob at
    a time); in a study from before it, the batch walk's next step. Then compile's next mode (``advance``) and a
    re-run of a trial pruned far below its neighbours (``queue.requeue_far_pruned``). Returns the plan worked out
    (None in a study without one). ``said``: the run's decisions logged so far, each said once."""
    planned = None
    if study.user_attrs.get(keys.PLAN):
        if ceilings_here:  # inside the search's share of the budget, the numerics check of the best kept back
            ceiling_runs.measure_if_wanted(study, ctx.space, runner=ctx.runner, workload=ctx.workload,
                                           measure=ctx.measure, log_dir=ctx.artifacts_dir, log=ctx.log,
                                           budget=ctx.budget, check_s=lambda: ctx.numerics_check_s(study), said=said)
        planned = study_queue.advance_plan(study, ctx.space, storage=ctx.storage, limit=ctx.limit,
                                           fingerprint=ctx.fingerprint, log=ctx.log, said=said)
    else:
        study_queue.advance_batch_walk(study, ctx.space, storage=ctx.storage, limit=ctx.limit, log=ctx.log)
    advance(study, ctx.space, fingerprint=ctx.fingerprint, limit=ctx.limit, log=ctx.log)
    study_queue.requeue_far_pruned(study, ctx.space, storage=ctx.storage, log=ctx.log)
    return planned


def keep_incumbent(study: Study, space: SearchSpace, planned: Plan) -> None:
    """The config the plan keeps as its best so far, on the study (``keys.PLAN_KEPT``): a provisional recommendation
    prefers it over a faster single trial within the noise of it (``finalists.provisional``), whoever builds one
    (the run, ``autotune export``, the report) and whether or not the plan is worked out there."""
    from autotune.search.space.complete import complete

    if planned.incumbent is None:
        return
    kept = space.effective(complete(space, planned.incumbent)).to_dict()
    if study.user_attrs.get(keys.PLAN_KEPT) != kept:
        study.set_user_attr(keys.PLAN_KEPT, kept)


class PlanMemo:
    """The planned search's state over one run: the decisions logged so far (``said``: each said once) and the plan
    worked out for the study's trials as they stand (worked out again once a trial is added or changes state)."""

    def __init__(self) -> None:
        self.said: set[str] = set()
        self._plan: tuple | None = None  # (the study's trials' states, the plan worked out from them)

    @staticmethod
    def _states(study: Study) -> tuple:
        return tuple((t.number, t.state.name) for t in study.get_trials(deepcopy=False))

    def after_trial(self, ctx: SearchContext, study: Study, *, ceilings_here: bool) -> None:
        """``after_trial`` (the module function), remembering the plan it worked out."""
        planned = after_trial(ctx, study, said=self.said, ceilings_here=ceilings_here)
        if planned is not None:
            self._plan = (self._states(study), planned)  # its needs are queued now: present, not needed
            keep_incumbent(study, ctx.space, planned)

    def plan(self, study: Study, space: SearchSpace, *, limit: MemoryLimit, fingerprint: str) -> Plan | None:
        """Where the planned search stands (``coordinate.Plan``); a study from before it has none (None)."""
        from autotune.search.plan.coordinate import plan
        from autotune.search.record import ceilings

        if not study.user_attrs.get(keys.PLAN):
            return None
        states = self._states(study)
        if self._plan is None or self._plan[0] != states:
            self._plan = (states, plan(space, study.get_trials(deepcopy=False), limit=limit, fingerprint=fingerprint,
                                       feed=ceilings.feed(study, space)))
        return self._plan[1]

    def convergence(self, study: Study, space: SearchSpace, *, patience: int | None, run_length: RunLength,
                    fingerprint: str, limit: MemoryLimit) -> Convergence:
        """How far the sampler's search is from converging (``convergence``): its trials without a gain, against
        a patience from the cost of a trial and the planned run; never converged while the plan is not done."""
        plan = self.plan(study, space, limit=limit, fingerprint=fingerprint)
        run_s = run_seconds(study, run_length=run_length, fingerprint=fingerprint, limit=limit)
        return convergence(study, patience_k=patience, fingerprint=fingerprint, limit=limit, run_s=run_s,
                           ready=plan is None or plan.done, run_label=run_length.label().split(" (")[0])


def _eager_over(ctx: SearchContext, study: Study, *, walls: list[float], trials_left: int | None,
                exhausted: int) -> str | None:
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
    if trials_left is not None or ctx.budget.deadline is not None:
        rarely = compile_rarely_pays(getattr(ctx.space, "cpu_kind", None))
        if rarely is not None:  # a budget's time goes to the eager search (module docstring)
            if study.user_attrs.get(keys.COMPILE_NO_ROOM) is None:
                study.set_user_attr(keys.COMPILE_NO_ROOM, rarely)
                ctx.log(f"compile gets no room of its own in this budget: {rarely}; the eager search goes on, and "
                        "compile is tried only if it converges or runs out of configs first")
            return None
    if trials_left is not None and trials_left <= 1:
        return "the budget's last trial is compile's"
    if ctx.budget.deadline is not None and walls:
        left = ctx.budget.search_left_s(walls, check_s=ctx.numerics_check_s(study))  # as out_of_time's
        expected, _ = ctx.compile_gate.expected_s(study.get_trials(deepcopy=False))
        if expected <= left < expected + long_trial_s(walls):
            return f"the time left for the search ({left:.0f} s) is the compile trial's (~{expected:.0f} s)"
    return None


def stop_reason(ctx: SearchContext, study: Study, *, walls: list[float], trials_left: int | None = None,
                exhausted: int = 0) -> str | None:
    """Why the search stops before its next trial, or None to go on, within ``ctx.budget``. ``exhausted``: how many
    proposals in a row
    the study answered, once the backend takes that for an exhausted space (else 0). Settling the eager
    search queues compile on its best config (``compile_last.settle``), so the search goes on until that ran."""
    # --patience 0 reopens a study whose eager search converged earlier: search on until the budget ends it
    if study.user_attrs.get(keys.EAGER_SETTLED) is None or ctx.patience == 0:
        why = _eager_over(ctx, study, walls=walls, trials_left=trials_left, exhausted=exhausted)
        if why is None:
            return None
        compile_last.settle(study, ctx.space, why=why, blocked=ctx.compile_gate.reason(study),
                            fingerprint=ctx.fingerprint, limit=ctx.limit, enqueue=study_queue.enqueue, log=ctx.log)
    advance(study, ctx.space, fingerprint=ctx.fingerprint, limit=ctx.limit, log=ctx.log)
    if compile_last.pending(study):
        return None
    return compile_last.summary(study)


def status_line(ctx: SearchContext, study: Study) -> str:
    """The progress bar's account of the phase: the planned search's step, the sampler's count towards
    converging, or compile last; and the time left."""
    if study.user_attrs.get(keys.EAGER_SETTLED) is not None:
        part = "compile last" if compile_last.pending(study) else "settled"
    else:
        plan = ctx.plan(study)
        conv = ctx.convergence(study)
        part = (f"planned: {plan.label()}" if plan is not None and not plan.done
                else conv.progress() if conv.patience else "sampler")
    if ctx.budget.deadline is not None:
        part += f", {ctx.budget.left_s() / 60:.0f} min left"
    return part


def search_done(outcome: SearchOutcome, study: Study, *, trials: int | None, log: Callable[[str], None]) -> str:
    """Why the search stopped (the backend's reason, else the trials asked for or the budget), said in one line."""
    n = outcome.trials_run
    why = outcome.stop_reason or (f"ran the {trials} trial(s) asked for" if trials is not None and n >= trials
                                  else "out of time: what is left of the budget is the finalists'")
    no_room = study.user_attrs.get(keys.COMPILE_NO_ROOM)
    if not outcome.stop_reason and no_room and study.user_attrs.get(keys.EAGER_SETTLED) is None:
        why += f"; compile not tried: {no_room}"
    released = study.user_attrs.get(keys.CONFIRM_TO_SEARCH)
    if released:
        why += (f"; it went on into the confirmation's {released:.0f} s while its best was PyTorch's defaults "
                "(no claim to confirm)")
    log(f"search done: {n} trial(s) this run, {len(study.trials)} in the study; search stopped: {why}")
    return why
