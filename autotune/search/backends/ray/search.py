"""The driver side of the Ray backend: Tune's searcher over the tuner's own Optuna study, and its scheduler.

The searcher records every trial through the same trial protocol as the local backend (``search.backends.protocol``):
``begin``, ``claim`` (a config another trial is measuring right now is not measured again at the same time: the
later trial waits, deferred in the driver, holding no node, and copies the result), ``answer_from_study``,
``record``. The scheduler applies the tuner's pruning rule to each window a trial reports.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import TYPE_CHECKING, Any

from autotune.search.plan import phases
from autotune.search.backends import protocol
from autotune.search.record import trials as keys
from autotune.config import TrialConfig, TrialResult
from autotune.measure import median_or_none
from autotune.search.backends.ray.actor import METRIC
from autotune.search.backends.ray.cluster import PLAN_KEY
from autotune.search.record.optuna_compat import heartbeat, heartbeat_enabled, storage_of
from autotune.search.record.optuna_compat import trial_id as storage_trial_id

if TYPE_CHECKING:
    from ray.tune.experiment import Trial as TuneTrial
    from optuna import Trial

    from autotune.search.plan.context import SearchContext

__all__ = ["make_search", "make_scheduler"]


def make_search(OptunaSearch):
    """The searcher class (``_SearchMixin`` over Ray's ``OptunaSearch``, which is imported only with Ray)."""
    return type("Search", (_SearchMixin, OptunaSearch), {})


class _SearchMixin:
    """OptunaSearch over the tuner's own study, recording trials as the local backend does: mixed into Ray's
    ``OptunaSearch`` by ``make_search`` (Ray is imported only when used), so ``super()`` is OptunaSearch."""

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx
        self.walls: list[float] = []
        self.abort: str | None = None
        self.stop_reason = ""  # why a phase ended the search (``phases.stop_reason``)
        self.told = 0
        self._windows: dict[str, list[dict]] = {}
        self._where: dict[str, tuple[str, float | None]] = {}  # (Ray node id, memory cap) of the trial's attempt
        self._failures: dict[str, int] = {}  # times Tune restarted the trial (its actor or node died)
        self._pruned: dict[str, str] = {}
        self._handled: set[str] = set()
        self._started: dict[str, float] = {}
        self._heartbeats: dict[str, Any] = {}
        self._configs: dict[str, TrialConfig] = {}
        self._deferred: list[tuple[str, Any, int]] = []  # (Tune trial id, Optuna trial, twin's trial id)
        # the same sampler as the local loop's, holding compile back when the time left is short
        ctx.compile_gate.start(ctx.budget, self.walls)
        sampler = protocol.make_sampler(seed=ctx.seed, startup_trials=ctx.startup_trials, hold_back=ctx.compile_gate)
        super().__init__(space=self._define, metric=METRIC, mode="max", sampler=sampler,
                         study_name=ctx.study_name, storage=ctx.storage)

    def _define(self, trial: Trial) -> dict:
        return {"config": self.ctx.space.suggest(trial).to_dict()}

    # Tune checkpoints searchers; the study in the storage is the state, and resuming is by study.
    def save_to_dir(self, *args, **kwargs) -> None:
        return None

    def restore_from_dir(self, *args, **kwargs) -> None:
        return None

    def __getstate__(self) -> dict:
        # Tune pickles its config (tuner.pkl) for its own resume, which this backend never uses (the
        # study is the state): leave out the context, the study and the threads, which need not pickle.
        live = {"ctx", "_heartbeats", "_ot_study", "_ot_trials", "_space", "_storage", "_sampler"}
        return {k: v for k, v in self.__dict__.items() if k not in live}

    # --- asking ---------------------------------------------------------------------------------
    def suggest(self, trial_id: str):
        import optuna

        self._resolve_deferred()
        if self.abort is not None:
            return self.FINISHED
        why = phases.stop_reason(self.ctx, self._ot_study, walls=self.walls)
        if why is not None:  # the eager search settled and compile was tried last (``phases``)
            self.stop_reason = why
            return self.FINISHED
        if self.ctx.out_of_time(self.walls):  # after the stop reason, as the local loop: a trial starts if neither
            return self.FINISHED
        storage = storage_of(self._ot_study)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeats outside Study.optimize, experimental APIs
            if heartbeat_enabled(storage):
                optuna.storages.fail_stale_trials(self._ot_study)
            params = super().suggest(trial_id)
            trial = self._ot_trials[trial_id]
            self._heartbeats[trial_id] = heartbeat(trial, storage)
        config = self._configs[trial_id] = TrialConfig.from_dict(params["config"])
        # the node's fingerprint replaces this one once the trial ran there
        protocol.begin(trial, config, fingerprint=self.ctx.fingerprint)
        plan = {"config": config.to_dict(), "number": trial.number, "shortcut": False}
        twin = protocol.claim(trial, config, storage=self.ctx.storage, study_name=self.ctx.study_name)
        if twin is not None:
            self._deferred.append((trial_id, trial, storage_trial_id(twin)))
            self._handled.add(trial_id)
            return {PLAN_KEY: {**plan, "shortcut": True}}
        if self._finish_known(trial_id, trial, config):
            return {PLAN_KEY: {**plan, "shortcut": True}}
        self._started[trial_id] = time.monotonic()
        return {PLAN_KEY: plan}

    def _finish_known(self, trial_id: str, trial: Trial, config: TrialConfig) -> bool:
        """Record ``trial`` from what the study knows; False when it must run."""
        import optuna

        state, value = protocol.settle(lambda: protocol.answer_from_study(
            trial, config, fingerprint=self.ctx.fingerprint, limit=self.ctx.limit))
        if state == optuna.trial.TrialState.COMPLETE and value is None:
            return False
        self._tell(trial_id, trial, value, state)
        attrs = storage_of(self._ot_study).get_trial(storage_trial_id(trial)).user_attrs
        self.ctx.log(f"trial {trial.number} {attrs.get(keys.STATUS, state.name.lower()):<8} {config.short():<40} "
                       + (f"same as trial {attrs[keys.DUPLICATE_OF]}" if keys.DUPLICATE_OF in attrs
                          else attrs.get(keys.REASON, "")))
        return True

    def _resolve_deferred(self, *, block: bool = False) -> None:
        import optuna
        from optuna.trial import TrialState

        storage = storage_of(self._ot_study)
        while self._deferred:
            still = []
            for trial_id, trial, twin in self._deferred:
                state = storage.get_trial(twin).state
                if state == TrialState.RUNNING:
                    still.append((trial_id, trial, twin))
                elif not self._finish_known(trial_id, trial, self._configs[trial_id]):
                    self._fail(trial_id, trial, "error",
                               f"same config as trial {storage.get_trial(twin).number}, which did not finish")
            self._deferred = still
            if not block or not still:
                return
            time.sleep(1.0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                optuna.storages.fail_stale_trials(self._ot_study)

    # --- results --------------------------------------------------------------------------------
    def window(self, trial_id: str, result: dict, *, failures: int = 0) -> bool:
        """Note where the trial runs; report one measured window; True when the tuner's pruning rule says stop
        now. ``failures``: how many times Tune restarted the trial, which then measures afresh on another
        actor, maybe another node."""
        trial = self._ot_trials.get(trial_id)
        if trial is None:
            return False
        if failures > self._failures.get(trial_id, 0):
            self._failures[trial_id] = failures
            self._windows.pop(trial_id, None)  # the new attempt's windows are the trial's figures
            trial.set_user_attr(keys.RAY_RETRIES, failures)
            self.ctx.log(f"trial {trial.number}: its Ray actor or node died; Tune runs it again (retry {failures})")
        if result.get("node") and self._where.get(trial_id, ("",))[0] != result["node"]:
            trial.set_user_attr(keys.NODE, result["node"])  # at once: `show` can say where a running trial is
        if result.get("node"):
            self._where[trial_id] = (result["node"], result.get("memory_cap_mb"))
        if "window" not in result:
            return False
        frozen = storage_of(self._ot_study).get_trial(storage_trial_id(trial))
        if int(result["window"]) not in frozen.intermediate_values:  # a retry's first windows are reported already
            trial.report(float(result[METRIC]), int(result["window"]))
            frozen = storage_of(self._ot_study).get_trial(storage_trial_id(trial))
        self._windows.setdefault(trial_id, []).append(result)
        if self.ctx.pruner.prune(self._ot_study, frozen):
            self._pruned[trial_id] = (f"stopped after {len(self._windows[trial_id])} window(s): "
                                      "cannot beat the best so far")
            return True
        return False

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        return None  # windows are reported by ``window`` (from the scheduler), with their own index

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._handled or trial_id not in self._configs:
            self._resolve_deferred()
            return
        trial, config = self._ot_trials[trial_id], self._configs[trial_id]
        if result and result.get("trial_result"):
            tr = TrialResult.from_dict(json.loads(result["trial_result"]))
            trial.set_user_attr(keys.FINGERPRINT, result.get("fingerprint") or self.ctx.fingerprint)
        elif trial_id in self._pruned:
            windows = self._windows.get(trial_id, [])
            tr = TrialResult(status="pruned", reason=self._pruned[trial_id], batch_size=config.batch_size,
                             samples_per_s=tuple(float(w[METRIC]) for w in windows),
                             window_steps=tuple(int(w["steps"]) for w in windows),
                             data_wait_s_per_step=median_or_none([w.get("data_wait_s") for w in windows]),
                             compute_s_per_step=median_or_none([w.get("compute_s") for w in windows]))
        elif error:
            self._fail(trial_id, trial, "error", "the Ray trial failed (its actor or node died, or the trial "
                                                 "raised): see the Tune trial's error.txt")
            return
        else:
            self._fail(trial_id, trial, "interrupted", "the Ray run ended before this trial finished")
            return
        if tr.user_error:
            self.abort = tr.reason
            self._fail(trial_id, trial, "error", tr.reason)
            return
        state, value = protocol.settle(
            lambda: protocol.record(trial, tr, limit=self.ctx.limit))
        node, cap = self._where.get(trial_id, (None, None))
        if cap is not None:  # the cap it ran under was its node's, not the study's (``cluster.this_node_cap_mb``)
            trial.set_user_attr(keys.TRIAL_CAP, cap)
        if trial_id in self._started:
            self.walls.append(time.monotonic() - self._started.pop(trial_id))
        self._tell(trial_id, trial, value, state)
        self.ctx.log(f"trial {trial.number} {tr.status:<8} {config.short():<40} "
                       + (f"{tr.median_samples_per_s:.1f} samples/s" if tr.ok else tr.reason)
                       + (f"  [node {node[:8]}]" if node else ""))
        self._resolve_deferred()

    def _fail(self, trial_id: str, trial: Trial, status: str, reason: str) -> None:
        import optuna

        trial.set_user_attr(keys.STATUS, status)
        trial.set_user_attr(keys.REASON, reason)
        self._tell(trial_id, trial, None, optuna.trial.TrialState.FAIL)
        self.ctx.log(f"trial {trial.number} {status}: {reason}")

    def _tell(self, trial_id: str, trial: Trial, value, state) -> None:
        hb = self._heartbeats.pop(trial_id, None)
        if hb is not None:
            hb.__exit__(None, None, None)
        self._handled.add(trial_id)
        self._ot_study.tell(trial, value, state=state, skip_if_finished=True)
        self.told += 1
        self.ctx.after_trial(self._ot_study)  # every finished trial, however it was answered

    def close(self, *, wait: bool = True) -> None:
        """At the end: wait for deferred twins (``wait``), and fail whatever Tune never finished (so a
        re-run re-queues it) rather than leaving it RUNNING."""
        self._resolve_deferred(block=wait)
        for trial_id, trial, _ in self._deferred:
            self._fail(trial_id, trial, "interrupted", "the Ray run ended before the trial it waited for")
        self._deferred = []
        for trial_id in list(self._configs):
            if trial_id not in self._handled:
                self._fail(trial_id, self._ot_trials[trial_id], "interrupted",
                           "the Ray run ended before this trial finished")



def make_scheduler(search):
    """A FIFO scheduler whose one decision is the tuner's pruning rule, as Tune's STOP."""
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class PruneScheduler(FIFOScheduler):
        def on_trial_result(self, tune_controller, trial: TuneTrial, result: dict) -> str:
            if search.window(trial.trial_id, result, failures=trial.num_failures):
                # the child ends now: Tune keeps a stopped trial's actor for the next trial (reuse_actors) without
                # calling anything on it until that trial starts (``actor.end_trial``)
                actor = getattr(trial.temporary_state, "ray_actor", None)
                if actor is not None:
                    actor.end_trial.remote()
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE

    return PruneScheduler()
