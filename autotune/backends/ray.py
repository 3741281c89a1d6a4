"""The Ray backend: the same study, run by Ray Tune (``Tuner`` + ``OptunaSearch``) over a cluster.

Design (why it looks like this):

* **One study, one storage.** ``OptunaSearch`` accepts an Optuna storage and a study name and loads the study
  with ``load_if_exists``, so it asks and tells *in the tuner's own study*: ``show``, ``export``,
  ``recommend()`` and optuna-dashboard see Ray's trials exactly like local ones. The subclass ``_Search``
  records each trial the way the local objective does, through the same code: ``Tuner.space.suggest`` (as
  the define-by-run space), ``Tuner._shortcut`` (configs known to run out of memory or measured before are
  recorded without running), ``Tuner._record`` (figures as user attrs, memory constraint, and
  ``autotune.study.outcome``). The sampler is the tuner's TPE with the constant liar, which spreads
  concurrent trials apart. The searcher runs in the driver, so only the driver needs to reach the storage.
* **Honest timings.** Each trial runs the unchanged runner (``autotune.runner.run_trial``: a fresh child
  process, memory watched, killed at the cap or the time limit) inside a Tune actor that asks for a whole
  node's CPUs on CPU workloads (so one trial per node: two would share cores and spoil both timings), or for
  one GPU plus one core per DataLoader worker and one for the main process on CUDA workloads. Ray's
  ``OMP_NUM_THREADS`` default is undone in the actor, so "PyTorch defaults" mean the same as locally.
* **One pruning mechanism: Tune's scheduler.** ``OptunaSearch`` uses Optuna's ``NopPruner``; ``_PruneScheduler``
  (a FIFO scheduler) applies the tuner's ``NoHopePruner`` rule to each window a trial reports and returns
  ``STOP``. The actor is a class ``Trainable`` so that Tune's stop reaches ``cleanup``, which kills the
  trial's child process group at once (a function trainable's thread would be abandoned with the child
  still running and stealing cores from the next trial).
* **Hardware.** A probe task with a trial's resources reports what the trial nodes are. When they differ
  from this machine (a laptop driving a cluster), the study is the nodes' (named after their fingerprint,
  space trimmed to their cores) and the finalists are re-measured on one such node; otherwise the
  finalists are re-measured here with ``Tuner.finalize``. Each trial records its node's fingerprint and
  recommendations only use trials of the study's fingerprint.
* **Faults.** A trial whose actor or node dies is retried by Tune (``FailureConfig(max_failures=2)``) under
  the same Optuna trial; on a heartbeat-enabled storage (PostgreSQL/MySQL) the driver keeps each running
  trial's heartbeat, so if the *driver* dies another worker fails and re-queues its trials.
  A config another trial is measuring right now is not measured again at the same time: the later trial
  waits (deferred in the driver, no node held) and copies the result.

>>> Tuner(Workload(model="resnet18")).run(trials=40, backend="ray", address="auto")   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from ..config import MeasureSpec, TrialConfig, TrialResult, Workload
from ..errors import AutotuneError

__all__ = ["run_study"]

_INSTALL = 'pip install "ray[tune]"'
_METRIC = "samples_per_s"
_KEY = "autotune"  # the one key of a Tune trial's config: {"config": {...}, "number": n, "shortcut": bool}


def _ray():
    try:
        import ray
        from ray import tune
        from ray.tune.search.optuna import OptunaSearch  # noqa: F401 - checked here, used below
    except ImportError as exc:
        raise AutotuneError(f"--backend ray needs Ray Tune ({exc}): {_INSTALL}") from None
    return ray, tune


# --- where trials run ------------------------------------------------------------------------------

def _connect(ray, address: str | None, tuner) -> bool:
    """Join the cluster at ``address``, or start a local Ray with this machine's usable cores.
    Returns True when this call started Ray (and so shuts it down)."""
    import logging

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=tuner.hardware.usable_cores, include_dashboard=False, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise AutotuneError(f"cannot start or join {where}: {first}") from None
    return True


def _nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _trial_shape(ray, workload: Workload) -> tuple[dict[str, float], int]:
    """(resources of a measured trial without its DataLoader share, how many run at once on the cluster)."""
    nodes = _nodes(ray)
    if workload.device == "cpu":
        cpus = max((n["Resources"].get("CPU", 0) for n in nodes), default=0)
        if cpus < 1:
            raise AutotuneError("the Ray cluster has no node with a CPU to run trials on")
        # a whole node per trial: the largest nodes' core count, so one trial per node and only that kind
        return {"CPU": float(cpus)}, max(1, sum(int(n["Resources"].get("CPU", 0) // cpus) for n in nodes))
    gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
    if gpus < 1:
        raise AutotuneError(f"--device {workload.device} but the Ray cluster has no GPU")
    return {"CPU": 1.0, "GPU": 1.0}, gpus


def _resources_for(base: dict[str, float], device: str):
    """The per-trial resource request (a callable of the trial's config, for ``tune.with_resources``)."""
    from ray.tune import PlacementGroupFactory

    def resources(config: dict) -> PlacementGroupFactory:
        plan = config.get(_KEY) or {}
        if plan.get("shortcut"):  # recorded by the driver without running: hold no node
            return PlacementGroupFactory([{"CPU": 0.01}])
        if device == "cpu":
            return PlacementGroupFactory([dict(base)])
        workers = int((plan.get("config") or {}).get("num_workers") or 0)
        return PlacementGroupFactory([{"CPU": float(1 + workers), "GPU": 1.0}])

    return resources


def _hardware_from_dict(d: dict):
    from ..hardware import Hardware

    names = {f.name for f in dataclasses.fields(Hardware)}
    d = {k: v for k, v in d.items() if k in names}
    d["cpu_flags"] = tuple(d.get("cpu_flags") or ())
    d["gpus"] = tuple(d.get("gpus") or ())
    return Hardware(**d)


def _probe(ray, base: dict[str, float]):
    """(Hardware, node id) of a node of the kind trials run on, asked with a trial's resources."""

    @ray.remote(max_retries=0)
    def probe():
        from autotune.hardware import detect

        return detect().to_dict(), ray.get_runtime_context().get_node_id()

    opts = {"num_cpus": base.get("CPU", 1.0), "num_gpus": base.get("GPU", 0.0)}
    try:
        hw, node = ray.get(probe.options(**opts).remote(), timeout=600)
    except ray.exceptions.GetTimeoutError:
        raise AutotuneError(f"no Ray node could take a trial ({opts}) within 10 minutes: is the cluster busy, "
                            "or are its nodes smaller than that?") from None
    return _hardware_from_dict(hw), node


def _adopt(tuner, hw) -> None:
    """Make the study the trial nodes' one: their fingerprint names it, their cores trim the space."""
    from ..space import load_space
    from ..study import study_name_for

    old = tuner.hardware
    derived = tuner.study_name == study_name_for(tuner.workload, old.fingerprint)
    tuner.hardware = hw
    tuner._study = None
    if derived:
        tuner.study_name = study_name_for(tuner.workload, hw.fingerprint)
    source = tuner.space.source
    if source and Path(source).is_file():
        tuner.space = load_space(source, hardware=hw, device="cpu" if tuner.workload.device == "cpu" else "cuda")
    tuner._log(f"trials run on Ray nodes unlike this machine ({hw.summary_line()}, fingerprint {hw.fingerprint}); "
               f"study {tuner.study_name} is theirs and the finalists are re-measured there")


# --- the trial actor -------------------------------------------------------------------------------

def _make_trainable(tune):
    class _TrialActor(tune.Trainable):
        """One trial in a Tune actor: the runner in a thread, one Tune result per measured window, the whole
        TrialResult (JSON) in the last one. ``cleanup`` (Tune's stop: pruned, or the run ended) kills the
        trial's child process group so nothing outlives the actor."""

        def setup(self, config: dict, *, workload: dict, measure: dict, omp: str | None = None) -> None:
            self._events: queue.Queue = queue.Queue()
            self._stop = threading.Event()
            self._thread = None
            plan = config[_KEY]
            if plan.get("shortcut"):
                self._events.put(("shortcut", None))
                return
            # Ray sets OMP_NUM_THREADS to the actor's CPUs; the child must see what a local run sees.
            if omp is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = omp
            args = (Workload.from_dict(workload), TrialConfig.from_dict(plan["config"]), MeasureSpec.from_dict(measure))
            log = Path(self.logdir or ".") / f"trial-{plan.get('number')}.log"
            self._thread = threading.Thread(target=self._run, args=(*args, log), daemon=True)
            self._thread.start()

        def _run(self, workload, config, measure, log) -> None:
            try:
                from autotune.hardware import detect
                from autotune.runner import run_trial

                def on_event(ev: dict) -> None:  # windows go to Tune with their step-time split
                    if ev.get("event") == "window":
                        self._events.put(("window", {k: ev.get(k) for k in
                                                     ("index", "samples_per_s", "steps", "data_wait_s", "compute_s")}))

                result = run_trial(workload, config, measure, on_window=lambda i, v: self._stop.is_set(),
                                   on_event=on_event, log_path=log)
                self._events.put(("done", (result, detect(with_torch=False).fingerprint)))
            except BaseException as exc:  # noqa: BLE001 - reported to Tune as this trial's error
                import traceback

                self._events.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))

        def step(self) -> dict:
            kind, payload = self._events.get()
            if kind == "window":
                return {_METRIC: payload["samples_per_s"], "window": payload["index"], "steps": payload["steps"],
                        "data_wait_s": payload["data_wait_s"], "compute_s": payload["compute_s"]}
            if kind == "shortcut":
                return {_METRIC: 0.0, "shortcut": True, "done": True}
            if kind == "done":
                result, fingerprint = payload
                return {_METRIC: result.median_samples_per_s or 0.0, "trial_result": json.dumps(result.to_dict()),
                        "fingerprint": fingerprint, "node": os.uname().nodename, "done": True}
            raise RuntimeError(payload)

        # A trial is not resumable mid-measurement: Tune's restart after a failure measures it afresh.
        def save_checkpoint(self, checkpoint_dir: str) -> None:
            return None

        def load_checkpoint(self, checkpoint) -> None:
            return None

        def cleanup(self) -> None:
            self._stop.set()
            if self._thread is not None and self._thread.is_alive():
                _kill_trial_children()
                self._thread.join(timeout=30)

    return _TrialActor


def _kill_trial_children() -> None:
    """SIGKILL the process group of each trial child of this actor (the child leads its own group)."""
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for c in children:
        try:
            if "autotune._worker" in " ".join(c.cmdline()):
                os.killpg(c.pid, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass


# --- the driver side -------------------------------------------------------------------------------

def _make_search(OptunaSearch):
    class _Search(OptunaSearch):
        """OptunaSearch over the tuner's own study, recording trials exactly like ``Tuner.objective``."""

        def __init__(self, tuner, *, deadline: float | None) -> None:
            import optuna

            self.tuner = tuner
            self.deadline = deadline
            self.budget_s = None if deadline is None else deadline - time.monotonic()
            self.walls: list[float] = []
            self.abort: str | None = None
            self.told = 0
            self._windows: dict[str, list[float]] = {}
            self._pruned: dict[str, str] = {}
            self._handled: set[str] = set()
            self._started: dict[str, float] = {}
            self._heartbeats: dict[str, Any] = {}
            self._configs: dict[str, TrialConfig] = {}
            self._deferred: list[tuple[str, Any, int]] = []  # (Tune trial id, Optuna trial, twin's trial id)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = optuna.samplers.TPESampler(
                    seed=tuner.seed, n_startup_trials=tuner.startup_trials, multivariate=True, group=True,
                    constant_liar=True)
            super().__init__(space=self._define, metric=_METRIC, mode="max", sampler=sampler,
                             study_name=tuner.study_name, storage=tuner._storage)

        def _define(self, trial) -> dict:
            return {"config": self.tuner.space.suggest(trial).to_dict()}

        # Tune checkpoints searchers; the study in the storage is the state, and resuming is by study.
        def save_to_dir(self, *args, **kwargs) -> None:
            return None

        def restore_from_dir(self, *args, **kwargs) -> None:
            return None

        def __getstate__(self) -> dict:
            # Tune pickles its config (tuner.pkl) for its own resume, which this backend never uses (the
            # study is the state): leave out the tuner, the study and the threads, which need not pickle.
            live = {"tuner", "_heartbeats", "_ot_study", "_ot_trials", "_space", "_storage", "_sampler"}
            return {k: v for k, v in self.__dict__.items() if k not in live}

        # --- asking ---------------------------------------------------------------------------------
        def suggest(self, trial_id: str):
            import optuna
            from optuna.storages._heartbeat import is_heartbeat_enabled

            self._resolve_deferred()
            if self.abort is not None or self._out_of_time():
                return self.FINISHED
            storage = self._ot_study._storage
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # heartbeats outside Study.optimize, experimental APIs
                if is_heartbeat_enabled(storage):
                    optuna.storages.fail_stale_trials(self._ot_study)
                params = super().suggest(trial_id)
                trial = self._ot_trials[trial_id]
                self._heartbeats[trial_id] = _heartbeat(trial._trial_id, storage)
            config = self._configs[trial_id] = TrialConfig.from_dict(params["config"])
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("fingerprint", self.tuner.hardware.fingerprint)  # the node's, once it ran
            history = storage.get_trial_system_attrs(trial._trial_id).get("retry_history")
            if history:  # queued by the heartbeat callback: its flags were copied from the dead trial
                trial.set_user_attr("retry_of", history[-1])
                storage.set_trial_system_attr(trial._trial_id, "autotune_measuring", False)
            plan = {"config": config.to_dict(), "number": trial.number, "shortcut": False}
            twin = self._claim(trial, config)
            if twin is not None:
                self._deferred.append((trial_id, trial, twin))
                self._handled.add(trial_id)
                return {_KEY: {**plan, "shortcut": True}}
            if self._finish_known(trial_id, trial, config):
                return {_KEY: {**plan, "shortcut": True}}
            self._started[trial_id] = time.monotonic()
            return {_KEY: plan}

        def _out_of_time(self) -> bool:
            return self.tuner._out_of_time(self.walls, self.deadline, self.budget_s)

        def _claim(self, trial, config: TrialConfig) -> int | None:
            """Claim ``config`` for ``trial`` unless another trial (here or another worker) is measuring it:
            then return that trial's id (this one waits for its result)."""
            from optuna.trial import TrialState

            from ..study import _rdb_lock

            key = config.key()
            with _rdb_lock(self.tuner._storage, f"autotune:{self.tuner.study_name}"):
                for t in self._ot_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    cfg = t.user_attrs.get("config")
                    if (t.number != trial.number and t.system_attrs.get("autotune_measuring") and cfg
                            and TrialConfig.from_dict(cfg).key() == key):
                        return t._trial_id
                trial.storage.set_trial_system_attr(trial._trial_id, "autotune_measuring", True)
            return None

        def _finish_known(self, trial_id: str, trial, config: TrialConfig) -> bool:
            """Record ``trial`` from what the study knows (``Tuner._shortcut``); False when it must run."""
            import optuna

            state, value = _settle(lambda: self.tuner._shortcut(trial, config))
            if state == optuna.trial.TrialState.COMPLETE and value is None:
                return False
            self._tell(trial_id, trial, value, state)
            attrs = self._ot_study._storage.get_trial(trial._trial_id).user_attrs
            self.tuner._log(f"trial {trial.number} {attrs.get('status', state.name.lower()):<8} {config.short():<40} "
                            + (f"same as trial {attrs['duplicate_of']}" if "duplicate_of" in attrs
                               else attrs.get("reason", "")))
            return True

        def _resolve_deferred(self, *, block: bool = False) -> None:
            from optuna.trial import TrialState

            storage = self._ot_study._storage
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
                import optuna

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    optuna.storages.fail_stale_trials(self._ot_study)

        # --- results --------------------------------------------------------------------------------
        def window(self, trial_id: str, result: dict) -> bool:
            """Report one measured window; True when the tuner's pruning rule says stop now."""
            trial = self._ot_trials.get(trial_id)
            if trial is None or "window" not in result:
                return False
            trial.report(float(result[_METRIC]), int(result["window"]))
            self._windows.setdefault(trial_id, []).append(result)
            frozen = self._ot_study._storage.get_trial(trial._trial_id)
            if self.tuner.pruner.prune(self._ot_study, frozen):
                self._pruned[trial_id] = (f"stopped after {len(self._windows[trial_id])} window(s): "
                                          "cannot beat the best so far")
                return True
            return False

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            return None  # windows are reported by ``window`` (from the scheduler), with their own index

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            import optuna

            if trial_id in self._handled or trial_id not in self._configs:
                self._resolve_deferred()
                return
            trial, config = self._ot_trials[trial_id], self._configs[trial_id]
            if result and result.get("trial_result"):
                tr = TrialResult.from_dict(json.loads(result["trial_result"]))
                trial.set_user_attr("fingerprint", result.get("fingerprint") or self.tuner.hardware.fingerprint)
                if result.get("node"):
                    trial.set_user_attr("node", result["node"])
            elif trial_id in self._pruned:
                windows = self._windows.get(trial_id, [])
                tr = TrialResult(status="pruned", reason=self._pruned[trial_id], batch_size=config.batch_size,
                                 samples_per_s=tuple(float(w[_METRIC]) for w in windows),
                                 window_steps=tuple(int(w["steps"]) for w in windows),
                                 data_wait_s_per_step=_median([w.get("data_wait_s") for w in windows]),
                                 compute_s_per_step=_median([w.get("compute_s") for w in windows]))
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
            state, value = _settle(lambda: self.tuner._record(trial, tr))
            if trial_id in self._started:
                self.walls.append(time.monotonic() - self._started.pop(trial_id))
            self._tell(trial_id, trial, value, state)
            self.tuner._log(f"trial {trial.number} {tr.status:<8} {config.short():<40} "
                            + (f"{tr.median_samples_per_s:.1f} samples/s" if tr.ok else tr.reason)
                            + (f"  [{result.get('node')}]" if result and result.get("node") else ""))
            self._resolve_deferred()

        def _fail(self, trial_id: str, trial, status: str, reason: str) -> None:
            import optuna

            trial.set_user_attr("status", status)
            trial.set_user_attr("reason", reason)
            self._tell(trial_id, trial, None, optuna.trial.TrialState.FAIL)
            self.tuner._log(f"trial {trial.number} {status}: {reason}")

        def _tell(self, trial_id: str, trial, value, state) -> None:
            hb = self._heartbeats.pop(trial_id, None)
            if hb is not None:
                hb.__exit__(None, None, None)
            self._handled.add(trial_id)
            self._ot_study.tell(trial, value, state=state, skip_if_finished=True)
            self.told += 1
            self.tuner._advance_batch_walk(self._ot_study)  # every finished trial, however it was answered

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

    return _Search


def _median(xs: list) -> float | None:
    import statistics

    xs = [float(x) for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _heartbeat(trial_id: int, storage):
    """Keep a trial's heartbeat from the driver while Ray runs it (a no-op without heartbeats)."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    hb = get_heartbeat_thread(trial_id, storage)
    hb.__enter__()
    return hb


def _make_scheduler(search):
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class _PruneScheduler(FIFOScheduler):
        """The one pruning mechanism: the tuner's rule (``NoHopePruner``) on each window, as Tune's STOP."""

        def on_trial_result(self, tune_controller, trial, result: dict) -> str:
            if search.window(trial.trial_id, result):
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE

    return _PruneScheduler()


def _remote_runner(ray, base: dict[str, float], node: str, device: str):
    """``run_trial_for_tuner`` that runs on ``node`` (every finalist on the same one) with a trial's resources."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(max_retries=0)
    def remote(workload: dict, config: dict, measure: dict) -> dict:
        from autotune.runner import run_trial

        os.environ.pop("OMP_NUM_THREADS", None)
        return run_trial(Workload.from_dict(workload), TrialConfig.from_dict(config),
                         MeasureSpec.from_dict(measure)).to_dict()

    def run(workload, config, measure, *, on_window=None, log_path=None) -> TrialResult:
        res = base if device == "cpu" else {"CPU": 1.0 + config.num_workers, "GPU": 1.0}
        ref = remote.options(num_cpus=res.get("CPU", 1.0), num_gpus=res.get("GPU", 0.0),
                             scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                             ).remote(workload.to_dict(), config.to_dict(), measure.to_dict())
        return TrialResult.from_dict(ray.get(ref))

    return run


def run_study(tuner, *, trials: int | None = None, timeout_s: float | None = None, address: str | None = None):
    """Search with Ray Tune into the tuner's study, then re-measure the finalists; the Recommendation or None.

    ``address``: a running cluster (``auto``, ``ray://head:10001``, ``head:6379``); None starts a local Ray.
    ``trials``/``timeout_s`` as in ``Tuner.run`` (new trials are not started once the time left is needed
    for the finalists).
    """
    ray, tune = _ray()
    from ray.tune.search.optuna import OptunaSearch

    from .. import study as study_mod
    from ..study import _study_lock

    started = _connect(ray, address, tuner)
    try:
        base, capacity = _trial_shape(ray, tuner.workload)
        hw, node = _probe(ray, base)
        remote_nodes = hw.fingerprint != tuner.hardware.fingerprint
        if remote_nodes:
            _adopt(tuner, hw)
        study = tuner.study()
        deadline = time.monotonic() + timeout_s if timeout_s else None  # the finalists fit in it too
        with _study_lock(tuner.storage_url, tuner.study_name):
            tuner._start(study)
            if trials != 0:
                _search_with_tune(tune, OptunaSearch, tuner, study, base, capacity, trials, timeout_s)
            if remote_nodes:
                original = study_mod.run_trial_for_tuner
                study_mod.run_trial_for_tuner = _remote_runner(ray, base, node, tuner.workload.device)
                try:
                    return tuner.finalize(deadline=deadline)
                finally:
                    study_mod.run_trial_for_tuner = original
            return tuner.finalize(deadline=deadline)
    finally:
        if started:
            ray.shutdown()


def _search_with_tune(tune, OptunaSearch, tuner, study, base, capacity, trials, timeout_s) -> None:
    from ..errors import WorkloadError

    deadline = time.monotonic() + timeout_s if timeout_s else None
    search = _make_search(OptunaSearch)(tuner, deadline=deadline)
    trainable = tune.with_resources(
        tune.with_parameters(_make_trainable(tune), workload=tuner.workload.to_dict(),
                             measure=tuner.measure.to_dict(), omp=os.environ.get("OMP_NUM_THREADS")),
        _resources_for(base, tuner.workload.device))
    root = (tuner.artifacts_dir / "ray").resolve()
    root.mkdir(parents=True, exist_ok=True)
    per_trial = ", ".join(f"{v:g} {k}" for k, v in base.items()) if tuner.workload.device == "cpu" else \
        "1 GPU + 1 CPU per DataLoader worker and one for the main process"
    tuner._log(f"Ray Tune: {per_trial} per trial, up to {capacity} at once; Tune's files in {root}")
    runner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=search, scheduler=_make_scheduler(search),
                                    num_samples=trials if trials is not None else -1,
                                    max_concurrent_trials=capacity, reuse_actors=False,
                                    trial_dirname_creator=lambda t: f"trial-{t.trial_id}"),
        run_config=tune.RunConfig(name=f"{tuner.study_name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                  storage_path=str(root), verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
                                  failure_config=tune.FailureConfig(max_failures=2)),
    )
    # Tune's new console output prints tables even at verbose=0; the tuner logs one line per trial instead.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ctrl-C/SIGTERM stop the run like the local backend's (KeyboardInterrupt: finished trials are kept, a
    # re-run resumes the study), not Tune's way (end gracefully, then go on to the finalists).
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    try:
        runner.fit()
    except BaseException:
        search.close(wait=False)
        raise
    search.close()
    tuner._log(f"search done: {search.told} trial(s) this run, {len(study.trials)} in the study")
    if search.abort is not None:
        raise WorkloadError(search.abort.removeprefix("WorkloadError: "))


def _settle(record):
    """Run a Tuner recording call and turn its outcome into (Optuna state, value), as study.optimize would."""
    import optuna

    from ..study import _TrialError

    try:
        return optuna.trial.TrialState.COMPLETE, record()
    except optuna.TrialPruned:
        return optuna.trial.TrialState.PRUNED, None
    except _TrialError:
        return optuna.trial.TrialState.FAIL, None
