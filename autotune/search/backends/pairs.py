"""The planned search's repeats run as a pair, by turns: where a candidate came within the noise of the best so far,
the plan queues both again (``coordinate``: two trials with ``repeat_of``), and the local backend runs the two
alive at once, taking turns (``trial.lockstep``), so the second round's ratio is paired moment by moment.

Why: one after the other, the second round's ratio carries the machine's spells as the first did (two fresh
processes of one config 7-15% apart on the 2-core VMs here), and a real gain the size of the noise is as often
lost as kept. By turns a round's log ratio strays 3-4% (``benchmarks/confirm_windows.py``). Issue 50: on resnet18
with a 4-minute budget, tcmalloc (worth ~8%) was measured alone within the noise, once at a time, and the pick kept
PyTorch's allocator; the finalists' one round by turns then measured the bundle with it +6.6%.

The rule that reads the pair is unchanged (``noise.repeat_keeps``, in units of an unpaired comparison's spread:
conservative for a paired round). Only on this machine's CPU, with the tuner's own runner, both search trials'
memory at once within the cap and ``/dev/shm`` (``SearchContext.pair_by_turns``), with SQLite (one run holds the
study: no other worker waits on a heartbeat these trials do not send), and where the search's time holds the pair
(``pair_fits``). Otherwise each runs alone, as before. The plan queues both of a comparison's repeats together even
where the incumbent was measured twice already (``round_of``: 2026-11-30, tiny_vit at 10 minutes read a candidate's
repeat run alone against the incumbent's repeat from another comparison a minute before:
"+11.0%, side by side", and channels_last was reverted; re-measured by turns the pick ran x0.84 of the 4-minute one).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from autotune.search.backends import protocol
from autotune.search.record import trials as keys
from autotune.search.record.storage import sqlite_path

if TYPE_CHECKING:
    from optuna import Study

    from autotune.search.plan.context import SearchContext

__all__ = ["waiting_pair", "run_pair"]


def waiting_pair(ctx: SearchContext, study: Study, walls: list[float]) -> list[Any] | None:
    """The search trials the next two queued repeats measure again (``repeat_of``), when those two are next in the
    queue, are one comparison's (the same ``round_of``), may take turns (``ctx.pair_by_turns``) and both end before
    the reserves of the phases after the search (``pair_fits``); else None."""
    from optuna.trial import TrialState

    if ctx.pair_by_turns is None or sqlite_path(ctx.storage_url) is None:
        return None
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))[:2]
    if len(waiting) < 2 or any(t.user_attrs.get(keys.REPEAT_OF) is None for t in waiting):
        return None
    if len({t.user_attrs.get(keys.ROUND_OF) for t in waiting}) > 1:  # two comparisons' repeats (a study from before
        return None  # ``round_of`` resumed): each runs alone, as its decision was planned

    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    firsts = [by_number.get(t.user_attrs[keys.REPEAT_OF]) for t in waiting]
    if any(t is None for t in firsts) or not ctx.pair_by_turns(firsts) or not pair_fits(ctx, study, walls, firsts):
        return None
    return firsts


def pair_fits(ctx: SearchContext, study: Study, walls: list[float], firsts: list[Any]) -> bool:
    """Whether a pair of repeats of ``firsts`` ends before the search's time is up (``Budget.search_left_s``, the
    numerics check's share too, as ``Tuner.out_of_time`` reads it): two long trials (``long_trial_s`` of ``walls``),
    at least the two first trials' own walls, and each one's windows again for the untimed first step of its turns
    (``Budget.turns``). Always without a time budget."""
    from autotune.search.budget import long_trial_s

    budget = ctx.budget
    if budget.deadline is None:
        return True
    check_s = ctx.numerics_check_s(study) if walls else 0.0
    own = sum(t.user_attrs.get(keys.WALL_S) or 0.0 for t in firsts)
    need = max(2 * long_trial_s(walls), own) + 2 * ctx.measure.windows * ctx.measure.window_s * budget.turns()
    return budget.search_left_s(walls, check_s=check_s) >= need


def run_pair(ctx: SearchContext, study: Study) -> tuple[list[int], list[float]]:
    """Ask Optuna for the two queued repeats, run them by turns (``lockstep.run_round``) and tell it each result,
    recorded as a search trial is (``protocol``). Returns their trial numbers and each child's own wall time (its
    stopped time left out: what a trial of it costs). A stop (Ctrl-C) or an error marks both failed ("interrupted"
    for a stop), to be re-queued by the next run, and is raised again; a workload wrong for every config ends the
    search as a trial of it does (``WorkloadError``)."""
    from optuna.trial import TrialState

    from autotune.machine.safefs import private_dir
    from autotune.trial.lockstep import run_round

    pair = [study.ask(), study.ask()]
    told: set[int] = set()
    stopped = [0.0, 0.0]  # the seconds each child stood stopped while the other had its turn
    try:
        configs = [ctx.space.suggest(t) for t in pair]
        for t, c in zip(pair, configs):
            protocol.begin(t, c, fingerprint=ctx.fingerprint)
        private_dir(ctx.artifacts_dir)
        logs = [ctx.artifacts_dir / f"trial-{t.number}.log" for t in pair]

        def run(i: int, gate) -> Any:
            try:
                return ctx.runner(ctx.workload, configs[i], ctx.measure, gate=gate, log_path=logs[i])
            finally:
                stopped[i] = gate.stopped_s()

        t0 = time.monotonic()
        results = run_round(configs, run)
        wall = time.monotonic() - t0
        for t, res, waited in zip(pair, results, stopped):
            t.set_user_attr(keys.BY_TURNS, round(waited, 2))
            state, value = protocol.settle(lambda: protocol.record(t, res, limit=ctx.limit))
            study.tell(t, value, state=state)
            told.add(t.number)
    except BaseException as exc:
        for t in pair:
            if t.number not in told:
                if isinstance(exc, KeyboardInterrupt):
                    t.set_user_attr(keys.STATUS, "interrupted")
                    t.set_user_attr(keys.REASON, "the tuner was stopped during this trial")
                study.tell(t, state=TrialState.FAIL)
        raise
    for t, res, log in zip(pair, results, logs):
        if res.user_error:  # wrong for every config: the search stops with the one-line reason
            raise protocol.workload_error(t.number, res.reason, log)
    return [t.number for t in pair], [res.wall_s or wall / 2 for res in results]
