"""What a study queues for itself: the first trials of a new study, the retries of interrupted ones, the
trials of the planned search (``coordinate``: the bundle taken apart, the batch walk, one knob at a time), and
one re-run of a trial pruned far below its neighbours. Each is queued exactly once even when several workers of
one PostgreSQL/MySQL study do this at the same moment (under the study's server-side lock). Studies made before
the planned search (no ``search_plan`` attribute) walk the batch size from the likely winner as they did."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record import trials as keys
from autotune.search.space.likely import measured_on
from autotune.search.plan.batch_walk import evidence, next_steps
from autotune.search.record import ceilings
from autotune.search.plan.coordinate import Plan, plan
from autotune.search.record.optuna_compat import storage_of, trial_id
from autotune.search.record.storage import server_lock
from autotune.config import TrialConfig
from autotune.search.record.trials import ROLES, MemoryLimit, baseline_trial_any, neighbours

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["enqueue", "queue_first_trials", "recover", "advance_batch_walk", "advance_plan", "requeue_far_pruned",
           "one_knob_explains", "REQUEUE_BELOW", "REQUEUE_NEIGHBOURS"]

# A pruned trial is re-queued once when the median of the windows it ran is below this share of the median of
# its measured neighbours (the same config with one knob changed, status ok), unless one knob explains it
# (``one_knob_explains``): a hiccup of the machine (a stall, another program) sinks the windows, not the config (the
# case seen: 0.59x the baseline between neighbours at 1.6-1.7x, 0.36), but one knob can cost that much too
# (channels_last off on mobilenet_v3_small ran 0.45x its neighbours with it on, three times in one 4-minute run).
REQUEUE_BELOW = 0.6
# ... and only with at least this many measured neighbours: one knob alone may well cost that much (batch 2
# next to batch 64); two neighbours on either side of it (a batch size down and up), both far faster, say the
# config is in the middle of fast ones. Not when one knob explains the loss (``one_knob_explains``).
REQUEUE_NEIGHBOURS = 2


def enqueue(study: Study, space, params: dict[str, Any], **roles: Any) -> None:
    """Queue a trial with these params and its role in the study; the config it will run is recorded too,
    so `show` can say what is queued before it runs."""
    study.enqueue_trial(params, user_attrs={**roles, keys.QUEUED_CONFIG: space.effective(params).to_dict()},
                        skip_if_exists=False)


def queue_first_trials(study: Study, space, *, storage, single_run: bool, log: Callable[[str], None], where: str,
                       warm_start: Callable[[], Any] | None = None) -> None:
    """Re-queue interrupted trials; in a new study, queue the baseline, the likely winner and ``warm_start()``'s
    trials (earlier studies' winners, ``warm_start.queue_warm_start``); the planned search (``advance_plan``)
    queues the rest as their results come in. ``single_run``: the storage is SQLite, so this run holds the
    study alone.

    Each of the first trials is queued unless the study has it already, and the marker that they all are
    (``batch_walk_anchor``, with ``search_plan``) is stored last: a run killed half-way through this leaves a
    study that the next run completes, not one that lacks its likely winner for good."""
    with server_lock(storage, study.study_name):
        queued = recover(study, space, single_run=single_run)
        if study.user_attrs.get(keys.WALK_ANCHOR) is not None:
            log(f"resuming study {study.study_name}: {len(study.trials)} trials so far"
                + (f", {queued} interrupted trial(s) re-queued" if queued else ""))
            return
        trials = study.get_trials(deepcopy=False)
        if baseline_trial_any(study) is None:
            enqueue(study, space, space.baseline_params(), **{keys.BASELINE: True})
            log(f"new study {study.study_name} in {where}; trial 0 is the PyTorch-defaults "
                f"baseline ({space.baseline_config().short()})")
        else:
            log(f"study {study.study_name}: a run was stopped while queuing its first trials; queuing the rest")
        likely = space.likely_params()
        if likely is not None and not any(t.user_attrs.get(keys.LIKELY_WINNER) for t in trials):
            enqueue(study, space, likely, **{keys.LIKELY_WINNER: True})
            where = measured_on(getattr(space, "cpu_kind", None)) or "the default's: no runs on this CPU kind yet"
            log(f"trial 1 tries the usual winners on this hardware first ({space.effective(likely).short()}; "
                f"{getattr(space, 'cpu_kind', None) or 'this device'}'s, {where}); then the batch walk from the "
                "better of the two, each of them apart at the batch it found, and the other knobs one at a time "
                "before the sampler takes over (compile last)")
        if warm_start is not None:  # itself skips what is queued already
            warm_start()
        study.set_user_attr(keys.PLAN, 1)
        study.set_user_attr(keys.WALK_ANCHOR, likely if likely is not None else space.baseline_params())


def recover(study: Study, space, *, single_run: bool) -> int:
    """Fail trials a killed run left RUNNING (with ``single_run`` nobody else runs them) and re-queue every
    interrupted trial once. Returns how many were re-queued.

    On a shared database other workers may be alive: a RUNNING trial there is left to the heartbeat (failed
    and retried by Optuna's callback once it goes stale), and only trials a stopped run marked
    ``interrupted`` are re-queued."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(keys.RETRY_OF) for t in trials if t.user_attrs.get(keys.RETRY_OF) is not None}
    for t in trials:  # retried by the heartbeat callback
        retried.update(t.system_attrs.get(keys.RETRY_HISTORY) or ())
    queued = 0
    for t in trials:
        stale = t.state == TrialState.RUNNING and single_run
        interrupted = t.state == TrialState.FAIL and t.user_attrs.get(keys.STATUS) in (
            keys.NOT_MEASURED if single_run else ("interrupted",))
        if stale:
            storage, tid = storage_of(study), trial_id(t)
            storage.set_trial_user_attr(tid, keys.STATUS, "interrupted")
            storage.set_trial_user_attr(tid, keys.REASON, "the tuner was killed during this trial")
            storage.set_trial_state_values(tid, TrialState.FAIL)
        if (stale or interrupted) and t.number not in retried and t.params:
            attrs = {keys.RETRY_OF: t.number}
            for role in ROLES + (keys.REQUEUE_OF,):  # a retried walk step walks on; a retried re-run re-runs
                if t.user_attrs.get(role) is not None:
                    attrs[role] = t.user_attrs[role]
            enqueue(study, space, t.params, **attrs)
            retried.add(t.number)
            queued += 1
    return queued


def advance_plan(study: Study, space, *, storage, limit: MemoryLimit | None, fingerprint: str,
                 log: Callable[[str], None], said: set[str]) -> Plan:
    """Queue what the planned search (``coordinate.plan``) needs now and log its decisions not in ``said`` yet
    (the caller's set, updated). Called after every finished trial, however it was answered."""
    with server_lock(storage, study.study_name):
        p = plan(space, study.get_trials(deepcopy=False), limit=limit, fingerprint=fingerprint,
                 feed=ceilings.feed(study, space))
        for need in p.needs:
            enqueue(study, space, need.params, **need.roles)
    for line in p.notes + [need.why for need in p.needs]:
        if line not in said:
            said.add(line)
            log(line)
    return p


def advance_batch_walk(study: Study, space, *, storage, limit: MemoryLimit | None = None,
                       log: Callable[[str], None]) -> None:
    """Queue the next steps of the batch-size walk (``batch_walk.next_steps``) wherever the study's results
    now call for one, in a study from before the planned search (``advance_plan`` walks in the others). Called
    after every finished trial, however it was answered."""
    anchor = study.user_attrs.get(keys.WALK_ANCHOR)
    if not anchor or study.user_attrs.get(keys.PLAN):
        return
    # two workers must not queue a step twice: what is already queued is read under the lock
    with server_lock(storage, study.study_name):
        measured, present = evidence(study.get_trials(deepcopy=False), space, limit)
        for step in next_steps(anchor, space, measured, present):
            enqueue(study, space, step.params, **{keys.BATCH_LINE: step.direction})
            log(step.why())


def requeue_far_pruned(study: Study, space, *, storage, log: Callable[[str], None]) -> list[int]:
    """Queue once, to run next, each pruned trial whose windows were far below its measured neighbours
    (``REQUEUE_BELOW``, ``REQUEUE_NEIGHBOURS``); the new trial carries ``requeue_of`` and is never re-queued
    itself (its verdict is final). Returns the numbers of the pruned trials re-queued. Called after every
    finished trial: a prune is looked at again once its neighbours have been measured."""
    from optuna.trial import TrialState

    queued = []
    with server_lock(storage, study.study_name):
        trials = study.get_trials(deepcopy=False)
        done = {t.user_attrs.get(keys.REQUEUE_OF) for t in trials} - {None}
        for t in trials:
            ua = t.user_attrs
            if (t.state != TrialState.PRUNED or ua.get(keys.STATUS) != "pruned" or not ua.get(keys.CONFIG)
                    or not t.params or t.number in done or ua.get(keys.REQUEUE_OF) is not None
                    or ua.get(keys.DUPLICATE_OF) is not None):
                continue
            ran = ua.get(keys.MEDIAN) or statistics.median(t.intermediate_values.values() or [0.0])
            config = TrialConfig.from_dict(ua[keys.CONFIG])
            measured = [(k, n) for k, n in neighbours(trials, config) if n.user_attrs.get(keys.MEDIAN)
                        and n.user_attrs.get(keys.STATUS) == "ok" and n.user_attrs.get(keys.DUPLICATE_OF) is None]
            near = [n.user_attrs[keys.MEDIAN] for _, n in measured]
            if len(near) < REQUEUE_NEIGHBOURS or ran >= REQUEUE_BELOW * statistics.median(near) \
                    or one_knob_explains(config, [(k, n) for k, n in measured
                                                  if ran < REQUEUE_BELOW * n.user_attrs[keys.MEDIAN]]):
                continue
            enqueue(study, space, dict(t.params), **{keys.REQUEUE_OF: t.number})
            queued.append(t.number)
            log(f"trial {t.number} was pruned at {ran:.1f} samples/s, under {100 * REQUEUE_BELOW:.0f}% of the "
                f"{statistics.median(near):.1f} its {len(near)} measured neighbours (one knob apart) ran, and no one "
                "knob explains it: re-queued once, in case the machine hiccupped")
    return queued


def one_knob_explains(config: TrialConfig, far_faster: list[tuple[str, Any]]) -> bool:
    """Whether the neighbours that ran far faster than ``config`` (``(knob, trial)``, ``neighbours``) all differ
    from it in one knob, and for a numeric knob all on one side of its value: then that knob's step is what cost
    the speed (channels_last off on mobilenet_v3_small runs at 0.45x, batch 32 below 64, 128 and 256), not a
    hiccup of the machine, and a re-run would measure the same loss again (issue 50: three of a 4-minute
    search's eleven trials were such re-runs). Neighbours far faster across two knobs, or on both sides of a
    batch size, leave a hiccup the likelier story."""
    knobs = {k for k, _ in far_faster}
    if len(knobs) != 1:
        return False
    (knob,) = knobs
    mine = getattr(config, knob)
    if not _number(mine):
        return True  # a switch or a choice (None: the library's own): every far faster one has another value
    theirs = [v for _, n in far_faster if _number(v := getattr(TrialConfig.from_dict(n.user_attrs[keys.CONFIG]), knob))]
    return len({v > mine for v in theirs}) <= 1  # the numbers all on one side (a default beside them is a choice)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
