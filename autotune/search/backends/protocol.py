"""The trial protocol: the steps every backend takes for one trial, written once.

A backend asks Optuna for a trial (``study.optimize`` locally, ``OptunaSearch`` on Ray), then:

1. ``begin``: record the config the trial runs and the machine it is measured on (a retry takes over its
   history);
2. ``claim``: take the config unless another trial is measuring it right now (several workers on one
   PostgreSQL/MySQL study, or concurrent Ray trials); if so, wait for that trial (``wait_for`` blocks; the
   Ray searcher defers the trial instead) and reuse its answer. One run per SQLite study needs no claim;
3. ``answer_from_study``: a config the study already answered is recorded without running;
4. run it (the backend's business), then ``record`` the ``TrialResult``;
5. ``settle`` turns a recording call into the Optuna state to tell, where the backend tells Optuna itself.

``record`` and ``answer_from_study`` return the trial's value, raise ``optuna.TrialPruned``, or raise
``TrialError`` (FAIL), exactly as an Optuna objective does, so the local backend hands them to
``study.optimize`` unchanged; ``answer_from_study`` returns None when the trial must run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import time
import warnings

from autotune.search.record import trials as keys
from autotune.config import TrialConfig, TrialResult
from autotune.search.record.optuna_compat import storage_of, trial_id
from autotune.search.record.storage import server_lock
from autotune.search.record.trials import OWN_ATTRS, MemoryLimit, known, outcome

if TYPE_CHECKING:
    from optuna import Study, Trial

__all__ = ["TrialError", "make_sampler", "begin", "claim", "wait_for", "answer_from_study", "record", "settle",
           "workload_error"]


class TrialError(Exception):
    """A trial that crashed or raised: Optuna records it as FAIL and the study goes on. Not an
    ``AutotuneError``: it is the trial's failure, not the user's mistake."""


def make_sampler(*, seed: int | None, startup_trials: int, hold_back=None):
    """The study's sampler: multivariate TPE over the grouped (conditional) space, with the constant liar so
    concurrent trials (several workers, Ray) spread apart instead of all drawing the same point. With
    ``hold_back`` (a ``compile_gate.CompileGate``) it proposes no compile mode while the gate holds it back."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials, multivariate=True,
                                         group=True, constant_liar=True)
    if hold_back is None:
        return tpe
    from autotune.search.plan.compile_gate import holding_back

    return holding_back(tpe, hold_back)


def begin(trial: Trial, config: TrialConfig, *, fingerprint: str) -> None:
    """Record what ``trial`` runs and where. A trial the heartbeat callback queued to repeat one whose worker
    died takes over its history; the claim it copied with the dead trial's attributes is not its own."""
    trial.set_user_attr(keys.CONFIG, config.to_dict())
    trial.set_user_attr(keys.FINGERPRINT, fingerprint)
    history = trial.storage.get_trial_system_attrs(trial_id(trial)).get(keys.RETRY_HISTORY)
    if history:
        trial.set_user_attr(keys.RETRY_OF, history[-1])
        trial.storage.set_trial_system_attr(trial_id(trial), keys.MEASURING, False)


def claim(trial: Trial, config: TrialConfig, *, storage, study_name: str):
    """Claim ``config`` for ``trial``, or return the running trial (FrozenTrial) that measures it already.

    Taken under the study's server-side lock, so of two workers that draw the same config at the same moment
    exactly one measures it."""
    from optuna.trial import TrialState

    key = config.key()
    with server_lock(storage, study_name):
        for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            other = t.user_attrs.get(keys.CONFIG)
            if (t.number != trial.number and t.system_attrs.get(keys.MEASURING) and other
                    and TrialConfig.from_dict(other).key() == key):
                return t
        trial.storage.set_trial_system_attr(trial_id(trial), keys.MEASURING, True)
    return None


def wait_for(study: Study, twin_id: int, *, poll_s: float = 1.0):
    """Block until trial ``twin_id`` (a storage trial id) is no longer running; returns its final state.
    While waiting, stale trials are failed by heartbeat: if the twin's worker died, its trial fails (and is
    re-queued by the retry callback) instead of being waited for forever."""
    import optuna
    from optuna.trial import TrialState

    while (state := storage_of(study).get_trial(twin_id).state) == TrialState.RUNNING:
        time.sleep(poll_s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeats are experimental
            optuna.storages.fail_stale_trials(study)
    return state


def answer_from_study(trial: Trial, config: TrialConfig, *, fingerprint: str, limit: MemoryLimit):
    """Record ``trial`` without running it when the study already knows the answer: a larger batch of a
    config that ran out of memory (infeasible), or a config measured before (its figures are copied, its
    feasibility worked out afresh against ``limit``). A memory failure under a lower cap than ``limit``'s
    is no answer, a pruned twin is none to a re-run of it (``requeue_of``), and a measured twin none to a
    repeat (``repeat_of``: the planned search measures a config twice where one trial is within the noise). Returns the
    value (or raises TrialPruned like a run would); None means: run it."""
    import optuna

    done, memory_failures = known(trial.study, fingerprint, limit)
    for smaller, number in memory_failures:
        if smaller.batch_size <= config.batch_size and smaller.replace(batch_size=config.batch_size) == config:
            result = TrialResult(status="skipped", batch_size=config.batch_size,
                                 reason=f"not run: batch {config.batch_size} >= batch {smaller.batch_size}, "
                                        f"which ran out of memory with the same settings (trial {number})")
            return record(trial, result, limit=limit)

    twin = done.get(config.key())
    if twin is None or (trial.user_attrs.get(keys.REQUEUE_OF) is not None and twin.state.name == "PRUNED") \
            or trial.user_attrs.get(keys.REPEAT_OF) is not None:
        return None  # a re-run of a pruned trial, or a repeat for a decision within the noise, measures it again
    trial.set_user_attr(keys.DUPLICATE_OF, twin.number)
    for k, v in twin.user_attrs.items():  # its figures; not its role in the study nor its history
        if k not in OWN_ATTRS:
            trial.set_user_attr(k, v)
    trial.set_user_attr(keys.REASON, f"same config as trial {twin.number}: its figures, not re-measured")
    if twin.state.name == "PRUNED":
        raise optuna.TrialPruned(f"same config as trial {twin.number}, which was pruned")
    if twin.user_attrs.get(keys.STATUS) == "ok":
        trial.set_constraint("memory", limit.constraint(twin.user_attrs.get(keys.PEAK)))
        device = limit.device_constraint(twin.user_attrs.get(keys.PEAK_DEVICE),
                                        twin.user_attrs.get(keys.PEAK_DEVICE_ALLOCATED))
        if device is not None:
            trial.set_constraint("device_memory", device)
        latency = limit.latency_constraint(twin.user_attrs.get(keys.LATENCY_P99))
        if latency is not None:
            trial.set_constraint("latency_p99", latency)
    else:
        for k, v in twin.constraints.items():
            trial.set_constraint(k, v)
    return float(twin.value or 0.0)


def record(trial: Trial, result: TrialResult, *, limit: MemoryLimit) -> float:
    """Store ``result`` on ``trial`` (figures as user attributes, the cap it ran under, a one-line diagnosis,
    the traceback of an error) and return its value, or raise TrialPruned / TrialError, as ``outcome``
    decides."""
    import optuna

    from autotune.search.record.diagnose import diagnose, levers_allowed

    figures = result.figures()
    for k, v in figures.items():
        trial.set_user_attr(k, v)
    trial.set_user_attr(keys.TRIAL_CAP, limit.cap_mb)
    # one line on what limited this trial, stored so optuna-dashboard shows it too
    # (given the study's trials, it does not suggest a lever the study measured near this config already)
    # (and, given the study's space, not one the space cannot pull: more workers than it offers)
    config = trial.user_attrs.get(keys.CONFIG)
    allowed = levers_allowed(trial.study, config or {}, figures.get("median_samples_per_s"))
    trial.set_user_attr(keys.BOTTLENECK, diagnose({**figures, "config": config}, memory_cap_mb=limit.cap_mb,
                                                  allowed=allowed, trials=trial.study.get_trials(deepcopy=False)
                                                  ).line())
    if result.traceback and result.status in ("error", "crashed"):
        trial.set_user_attr(keys.TRACEBACK, result.traceback[-4000:])
    o = outcome(result, limit.cap_mb, limit.margin, limit.device_mb, limit.latency_p99_ms)
    if o.state == "complete":
        trial.set_constraint("memory", o.memory_constraint)
        if o.device_memory_constraint is not None:
            trial.set_constraint("device_memory", o.device_memory_constraint)
        if o.latency_constraint is not None:  # over the bound: infeasible, as over the memory is
            trial.set_constraint("latency_p99", o.latency_constraint)
        return o.value  # type: ignore[return-value]
    if o.state == "pruned":
        raise optuna.TrialPruned(result.reason)
    raise TrialError(f"{result.status}: {result.reason}")


def settle(call):
    """``(Optuna state, value)`` of a recording call (``record``, ``answer_from_study``), as
    ``study.optimize`` would tell it: a value is COMPLETE, TrialPruned is PRUNED, TrialError is FAIL."""
    import optuna

    try:
        return optuna.trial.TrialState.COMPLETE, call()
    except optuna.TrialPruned:
        return optuna.trial.TrialState.PRUNED, None
    except TrialError:
        return optuna.trial.TrialState.FAIL, None


def workload_error(trial_number: int, reason: str, log_path) -> Exception:
    """The one-line error that stops a search whose workload is wrong for every config (a trial's ``user_error``):
    its reason, the trial and where its traceback is."""
    from autotune.errors import WorkloadError

    return WorkloadError(f"{reason.removeprefix('WorkloadError: ')} (trial {trial_number}; its traceback is in "
                         f"{log_path})")
