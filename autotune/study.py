"""Optuna orchestration: one study per workload and hardware, trials through the isolated runner, finalists.

The one function that decides what a trial means to Optuna is ``outcome``. The memory boundary is a
constraint (``trial.set_constraint``), not a failure, so the sampler learns it; a config that repeats one with
a smaller batch that already ran out of memory is recorded infeasible without being run.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .config import MEMORY_STATUSES, MeasureSpec, TrialConfig, TrialResult, Workload
from .errors import AutotuneError, StorageError
from .measure import summarize

__all__ = ["Tuner", "outcome", "Outcome", "study_name_for", "open_storage", "DEFAULT_STORAGE", "NoHopePruner",
           "trial_rows"]

DEFAULT_STORAGE = "sqlite:///trials/autotune.db"
_ATTR_PREFIX = ""  # user attrs are flat so optuna-dashboard shows them as columns


@dataclass(frozen=True)
class Outcome:
    state: str  # "complete" | "pruned" | "fail"
    value: float | None = None
    memory_constraint: float | None = None  # <= 0 feasible


def outcome(result: TrialResult, memory_cap_mb: float | None) -> Outcome:
    """Map a TrialResult to what Optuna records: decided here, once.

    ok -> COMPLETE, value = median samples/s, memory constraint = peak/cap - 1 (<= 0, feasible).
    oom / over_memory / skipped -> COMPLETE but infeasible (constraint > 0): the sampler learns the boundary
    and does not propose it again (a FAIL would be ignored and re-proposed). pruned / timeout -> PRUNED.
    crashed / error -> FAIL, with the reason kept in the trial's attributes.
    """
    if result.status == "ok":
        c = (result.peak_host_mb / memory_cap_mb - 1.0) if (result.peak_host_mb and memory_cap_mb) else -1.0
        return Outcome("complete", float(result.median_samples_per_s or 0.0), min(c, 0.0))
    if result.status in MEMORY_STATUSES or result.status == "skipped":
        over = (result.peak_host_mb / memory_cap_mb - 1.0) if (result.peak_host_mb and memory_cap_mb) else 0.0
        return Outcome("complete", 0.0, max(over, 1.0 if over <= 0 else over))
    if result.status in ("pruned", "timeout"):
        return Outcome("pruned")
    return Outcome("fail")


def study_name_for(workload: Workload, fingerprint: str) -> str:
    """``resnet18-train-224px-synthetic-cpu-<fingerprint>``: one study per workload and hardware."""
    model = re.sub(r"[^A-Za-z0-9_.]+", ".", workload.model)
    if workload.data_dir is not None:
        data = "-data." + re.sub(r"[^A-Za-z0-9_]+", "_", Path(workload.data_dir).name)
    else:
        data = "" if workload.is_callable else "-synthetic"
    return f"{model}-{workload.task}-{workload.image_size}px{data}-{workload.device.replace(':', '')}-{fingerprint}"


def _sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


def open_storage(url: str | None = None, *, create_dirs: bool = True):
    """An Optuna RDBStorage for ``url`` (default ``sqlite:///trials/autotune.db``), or a one-line StorageError.

    SQLite waits up to 60 s for a lock held by another process instead of failing. Other databases get
    heartbeats, so a trial whose worker died is failed and retried by a live worker.
    """
    import optuna

    url = url or DEFAULT_STORAGE
    db = _sqlite_path(url)
    if db is not None:
        if create_dirs:
            try:
                db.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create {db.parent} for the study database: {exc.strerror}") from None
        if db.parent.exists() and not os.access(db.parent, os.W_OK):
            raise StorageError(f"cannot write to {db.parent}: pick a writable folder with --storage sqlite:///DIR/autotune.db")
        kwargs: dict[str, Any] = {"engine_kwargs": {"connect_args": {"timeout": 60}}}
    elif url.startswith(("sqlite:", "postgresql", "mysql")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeats and the retry callback are marked experimental
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            kwargs = {"heartbeat_interval": _env_seconds("AUTOTUNE_HEARTBEAT_S", 30),
                      "grace_period": _env_seconds("AUTOTUNE_GRACE_S", 120)}
            if retry is not None:  # Optuna >= 4.9 renamed the callback and its argument
                kwargs["heartbeat_stale_trial_callback"] = retry(max_retry=2)
            else:  # pragma: no cover - older Optuna
                kwargs["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=2)
    else:
        raise StorageError(f"storage URL {url!r} is not supported: use sqlite:///PATH.db or "
                           "postgresql://user@host/db (any SQLAlchemy URL Optuna accepts)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(_with_driver(url), **kwargs)
    except ImportError as exc:
        raise StorageError(f"storage {url!r} needs a database driver: {exc} "
                           '(for PostgreSQL: pip install "autotune[postgres]")') from None
    except Exception as exc:  # sqlalchemy ArgumentError / OperationalError: bad URL or unreachable server
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open storage {url!r}: {first}") from None


def _with_driver(url: str) -> str:
    """``postgresql://`` names no driver, and SQLAlchemy 2.1 then wants psycopg 3; ``autotune[postgres]``
    installs psycopg2, so a bare URL uses whichever of the two is installed (psycopg 3 first)."""
    if url.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def _env_seconds(name: str, default: int) -> int:
    """A whole number of seconds from the environment (Optuna wants ints), e.g. AUTOTUNE_HEARTBEAT_S=1 in tests."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise StorageError(f"{name}={raw!r} is not a number of seconds (e.g. {name}={default})") from None
    if value < 1:
        raise StorageError(f"{name}={raw!r} must be at least 1 second")
    return value


@contextlib.contextmanager
def _rdb_lock(storage, name: str) -> Iterator[None]:
    """A lock shared by every worker of a PostgreSQL/MySQL study (a server-side advisory lock), held around
    check-then-write steps that must not interleave across machines (queue the baseline once, re-queue an
    interrupted trial once, queue a batch-walk step once, claim a config). SQLite needs none: one run per
    SQLite study (``_study_lock``). The server releases the lock if the holder dies."""
    engine = getattr(storage, "engine", None)
    dialect = engine.dialect.name if engine is not None else ""
    if dialect not in ("postgresql", "mysql"):
        yield
        return
    import hashlib

    from sqlalchemy import text

    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    lock, unlock, params = (("SELECT pg_advisory_lock(:k)", "SELECT pg_advisory_unlock(:k)", {"k": key})
                            if dialect == "postgresql" else
                            ("SELECT GET_LOCK(:n, 600)", "SELECT RELEASE_LOCK(:n)", {"n": f"autotune{key}"[:64]}))
    with engine.connect() as conn:
        conn.execute(text(lock), params)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text(unlock), params)
            conn.commit()


class NoHopePruner:
    """Prune a trial whose best window so far, even ``margin`` faster, cannot beat the best feasible trial.

    Optimistic on purpose: on a noisy machine a config is dropped only when its best window is clearly
    below the best median. Needs ``min_windows`` windows first; the baseline trial is never pruned.
    """

    def __init__(self, *, margin: float = 0.15, min_windows: int = 2) -> None:
        self.margin = margin
        self.min_windows = min_windows

    def prune(self, study, trial) -> bool:
        from optuna.trial import TrialState

        values = trial.intermediate_values
        if len(values) < self.min_windows or trial.user_attrs.get("baseline"):
            return False
        best = None
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.value and _feasible(t):
                best = t.value if best is None else max(best, t.value)
        if best is None:
            return False
        return max(values.values()) * (1 + self.margin) < best


def _as_optuna_pruner(p: NoHopePruner):
    import optuna

    class _Pruner(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:  # noqa: D401 - Optuna's interface
            return p.prune(study, trial)

    return _Pruner()


@contextlib.contextmanager
def _study_lock(storage_url: str, study_name: str) -> Iterator[None]:
    """One `autotune run` per SQLite study: a second one is refused clearly instead of corrupting timings
    (two trials on one machine share its cores) or the trial bookkeeping."""
    db = _sqlite_path(storage_url)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    lock_path = db.parent / f".{db.name}.{study_name}.lock"
    fh = open(lock_path, "w")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(
                f"another autotune run is already working on study {study_name!r} in {db} on this machine; "
                "wait for it to finish (two runs would share the cores and spoil each other's timings)"
            ) from None
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


def trial_rows(study) -> list[dict[str, Any]]:
    """One flat dict per trial (for `show`, CSV, reports), from what the trials stored."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        cfg = ua.get("config") or ua.get("queued_config") or {}
        rows.append({
            "trial": t.number,
            "state": t.state.name,
            "status": (f"copy of #{ua['duplicate_of']}" if ua.get("duplicate_of") is not None
                       else ua.get("status", _UNFINISHED.get(t.state.name, "-"))),
            "samples_per_s": ua.get("median_samples_per_s"),
            "rel_iqr": ua.get("rel_iqr"),
            "peak_host_mb": ua.get("peak_host_mb"),
            "data_wait_share": ua.get("data_wait_share"),
            "feasible": _feasible(t) if t.constraints else None,
            "baseline": bool(ua.get("baseline")),
            "config": TrialConfig.from_dict(cfg).short() if cfg else "-",
            "reason": ua.get("reason", ""),
            "wall_s": ua.get("wall_s"),
        })
    return rows


class Tuner:
    """Runs and resumes one study. ``run`` returns the Recommendation (or None when nothing ran feasibly).

    >>> tuner = Tuner(Workload(model="resnet18", image_size=64))   # doctest: +SKIP
    >>> rec = tuner.run(trials=20)                                 # doctest: +SKIP
    """

    def __init__(self, workload: Workload, *, space=None, measure: MeasureSpec | None = None,
                 storage: str | None = None, study_name: str | None = None, hardware=None,
                 finalists: int = 3, finalist_rounds: int = 2, seed: int | None = None,
                 startup_trials: int = 5, prune_margin: float = 0.15, progress: bool = True,
                 log=None) -> None:
        from .hardware import detect
        from .limits import default_memory_cap_mb
        from .space import load_space

        self.workload = workload
        self.hardware = hardware or detect()
        self.space = space or load_space(hardware=self.hardware, device="cpu" if workload.device == "cpu" else "cuda")
        measure = measure or MeasureSpec()
        if measure.memory_cap_mb is None:
            measure = measure.replace(memory_cap_mb=default_memory_cap_mb(self.hardware))
        self.measure = measure
        self.storage_url = storage or DEFAULT_STORAGE
        self.study_name = study_name or study_name_for(workload, self.hardware.fingerprint)
        self.finalists = finalists
        self.finalist_rounds = finalist_rounds
        self.seed = seed
        self.startup_trials = startup_trials
        self.pruner = NoHopePruner(margin=prune_margin)
        self.progress = progress
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._storage = None
        self._study = None
        self._answered_free = False
        self._current = -1  # number of the trial objective() is (or was last) working on

    # --- study ---------------------------------------------------------------------------------------
    @property
    def artifacts_dir(self) -> Path:
        db = _sqlite_path(self.storage_url)
        root = db.parent if db is not None else Path("trials")
        return root / self.study_name

    def study(self):
        if self._study is None:
            import optuna

            # Optuna logs every failed trial with a traceback at WARNING; our progress line and `show` say it.
            optuna.logging.set_verbosity(optuna.logging.ERROR)
            self._storage = open_storage(self.storage_url)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = optuna.samplers.TPESampler(
                    seed=self.seed, n_startup_trials=self.startup_trials, multivariate=True, group=True,
                    constant_liar=True,
                )
            self._study = optuna.create_study(storage=self._storage, study_name=self.study_name,
                                              direction="maximize", sampler=sampler,
                                              pruner=_as_optuna_pruner(self.pruner), load_if_exists=True)
            s = self._study
            stored = s.user_attrs.get("fingerprint")
            if stored and stored != self.hardware.fingerprint:
                # Several machines may share one storage (and one study name), but a study holds the
                # measurements of one kind of machine: mixing them would recommend one machine's best to another.
                self._study = None
                raise StorageError(
                    f"study {self.study_name!r} was measured on other hardware (fingerprint {stored}: "
                    f"{s.user_attrs.get('hardware')}); this machine is {self.hardware.fingerprint}: drop --study-name "
                    "(the default name includes the fingerprint, so each kind of machine gets its own study)")
            meta = {"workload": self.workload.to_dict(), "fingerprint": self.hardware.fingerprint,
                    "hardware": self.hardware.summary_line(), "space": self.space.to_dict(),
                    "memory_cap_mb": self.measure.memory_cap_mb, "measure": self.measure.to_dict()}
            for k, v in meta.items():
                if s.user_attrs.get(k) != v:
                    s.set_user_attr(k, v)
        return self._study

    def _start(self, study) -> None:
        """Re-queue interrupted trials and queue the baseline, each exactly once even when several workers
        start at once on one PostgreSQL/MySQL study (under the study's server-side lock)."""
        with _rdb_lock(self._storage, f"autotune:{self.study_name}"):
            queued = self._recover(study)
            previous = len(study.trials)
            if baseline_trial_any(study) is None:
                self._enqueue(study, self.space.baseline_params(), baseline=True)
                self._log(f"new study {self.study_name} in {self.storage_url}; trial 0 is the PyTorch-defaults "
                          f"baseline ({self.space.baseline_config().short()})")
                likely = self.space.likely_params()
                if likely is not None:
                    self._enqueue(study, likely, likely_winner=True)
                    self._log(f"trial 1 tries the usual winners on this hardware first "
                              f"({self.space.effective(likely).short()})")
                # Batch size is the knob no rule of thumb settles: walk it from the likely winner (or the
                # baseline), one choice down and one up, then on in whichever direction keeps winning
                # (``_advance_batch_walk``). A sampler given few trials spends its first ones at random.
                anchor = likely if likely is not None else self.space.baseline_params()
                study.set_user_attr("batch_walk_anchor", anchor)
                steps = [(d, s) for d in (-1, 1) if (s := self.space.batch_step(anchor, d)) is not None]
                for d, step in steps:
                    self._enqueue(study, step, batch_line=d)
                if steps:
                    self._log("then its batch size one choice down and up ("
                              + ", ".join(str(s["batch_size"]) for _, s in steps)
                              + "), and on in whichever direction keeps winning")
            else:
                self._log(f"resuming study {self.study_name}: {previous} trials so far"
                          + (f", {queued} interrupted trial(s) re-queued" if queued else ""))

    def _enqueue(self, study, params: dict[str, Any], **roles: Any) -> None:
        """Queue a trial with these params and its role in the study; the config it will run is recorded too,
        so `show` can say what is queued before it runs."""
        study.enqueue_trial(params, user_attrs={**roles, "queued_config": self.space.effective(params).to_dict()},
                            skip_if_exists=False)

    def _recover(self, study) -> int:
        """Fail trials a killed run left RUNNING (we hold the study lock, so nobody else runs them) and
        re-queue every interrupted trial once. Returns how many were re-queued.

        On a shared database other workers may be alive: a RUNNING trial there is left to the heartbeat
        (failed and retried by Optuna's callback once it goes stale), and only trials a stopped run marked
        ``interrupted`` are re-queued."""
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get("retry_of") for t in trials if t.user_attrs.get("retry_of") is not None}
        for t in trials:  # retried by the heartbeat callback
            retried.update(t.system_attrs.get("retry_history") or ())
        single = _sqlite_path(self.storage_url) is not None
        queued = 0
        for t in trials:
            stale = t.state == TrialState.RUNNING and single
            interrupted = t.state == TrialState.FAIL and t.user_attrs.get("status") in (
                (None, "interrupted") if single else ("interrupted",))
            if stale:
                study._storage.set_trial_user_attr(t._trial_id, "status", "interrupted")
                study._storage.set_trial_user_attr(t._trial_id, "reason", "the tuner was killed during this trial")
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            if (stale or interrupted) and t.number not in retried and t.params:
                attrs = {"retry_of": t.number}
                for role in _ROLES:  # a retried walk step walks on
                    if t.user_attrs.get(role):
                        attrs[role] = t.user_attrs[role]
                self._enqueue(study, t.params, **attrs)
                retried.add(t.number)
                queued += 1
        return queued

    def _advance_batch_walk(self, study) -> None:
        """Queue the next step of the batch-size walk wherever the study's results now call for one.

        The walk starts at the anchor stored by ``_start`` (the likely winner, else the baseline) and goes one
        batch choice at a time in each direction for as long as each step beat the one before it. Worked out
        afresh from the study's finished trials after every trial, so it does not matter in which order the
        steps finish (several workers, Ray), whether a step was measured by the sampler rather than queued,
        or whether a run was killed half-way: the first step of a direction that is not measured yet is queued
        unless it already exists in any state. A step that failed, ran out of memory, was pruned or was not
        faster ends its direction. Decided on single trials' medians: on a noisy machine a lucky step may
        cost one more trial, an unlucky one hands the rest to the sampler.
        """
        from optuna.trial import TrialState

        anchor = study.user_attrs.get("batch_walk_anchor")
        if not anchor:
            return

        def key_of(t) -> tuple | None:
            """The config a trial runs (queued trials: the config their fixed params will give)."""
            if t.user_attrs.get("config"):
                return TrialConfig.from_dict(t.user_attrs["config"]).key()
            fixed = t.system_attrs.get("fixed_params")
            return self.space.effective(fixed).key() if fixed else None

        def measured(params: dict) -> float | None:
            """Best feasible median measured for this config; 0.0 when it failed, was pruned or was
            infeasible; None while no trial of it has finished."""
            key = self.space.effective(params).key()
            values = [(t.value or 0.0) if t.state == TrialState.COMPLETE and _feasible(t) else 0.0
                      for t in trials if keys[t.number] == key and t.state.is_finished()]
            return max(values) if values else None

        # two workers must not queue a step twice: what is already queued is read under the lock
        with _rdb_lock(self._storage, f"autotune:{self.study_name}"):
            trials = study.get_trials(deepcopy=False)
            keys = {t.number: key_of(t) for t in trials}
            for d in (-1, 1):
                here, value = anchor, measured(anchor)
                while value:  # the config we stand on was measured and feasible
                    step = self.space.batch_step(here, d)
                    if step is None:
                        break
                    step_value = measured(step)
                    if step_value is None:  # not measured yet: queued, running, or to be queued now
                        if self.space.effective(step).key() not in keys.values():
                            self._enqueue(study, step, batch_line=d)
                            self._log(f"batch {here['batch_size']} ({value:.1f} samples/s) beat the step before: "
                                      f"batch {step['batch_size']} is queued next")
                        break
                    if step_value <= value:
                        break
                    here, value = step, step_value

    def _out_of_time(self, trial_walls: list[float], deadline: float | None, budget_s: float | None) -> bool:
        """True when the search must stop to leave the finalists their reserve. A trial is never cut short,
        so one more starts only if a long trial (the 90th percentile of those so far: the longest while there
        are fewer than ten) would still end before the reserve begins: a long trial started late would
        otherwise eat the re-measurement that decides the recommendation. The percentile keeps one outlier
        (a trial that ran into its time limit) from ending a long search early."""
        if deadline is None:
            return False
        reserve = self._finalist_reserve_s(trial_walls, budget_s)
        left = deadline - time.monotonic()
        if not trial_walls:
            return left <= reserve
        walls = sorted(trial_walls)
        long_trial = walls[math.ceil(0.9 * len(walls)) - 1]  # nearest-rank 90th percentile
        return left <= reserve or left - reserve < long_trial

    # --- one trial -----------------------------------------------------------------------------------
    def _known(self, study) -> tuple[dict[tuple, Any], list[tuple[TrialConfig, int]]]:
        """Finished trials by config key, and the memory failures (config, trial number)."""
        from optuna.trial import TrialState

        done: dict[tuple, Any] = {}
        memory_failures: list[tuple[TrialConfig, int]] = []
        fingerprint = self.hardware.fingerprint
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            cfg = t.user_attrs.get("config")
            if not cfg or t.user_attrs.get("duplicate_of") is not None:
                continue
            if t.user_attrs.get("fingerprint", fingerprint) != fingerprint:
                continue  # measured on another kind of machine (a Ray node): not evidence about this one
            c = TrialConfig.from_dict(cfg)
            done.setdefault(c.key(), t)
            if t.user_attrs.get("status") in MEMORY_STATUSES:
                memory_failures.append((c, t.number))
        return done, memory_failures

    def objective(self, trial) -> float:
        self._answered_free = False  # set by _shortcut: the study answered this trial without running it
        self._current = trial.number
        config = self.space.suggest(trial)
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("fingerprint", self.hardware.fingerprint)
        history = trial.storage.get_trial_system_attrs(trial._trial_id).get("retry_history")
        if history:  # queued by the heartbeat callback: a worker died during trial history[-1]
            trial.set_user_attr("retry_of", history[-1])
            trial.storage.set_trial_system_attr(trial._trial_id, "autotune_measuring", False)  # copied: not ours
        self._wait_for_twin_in_flight(trial, config)
        shortcut = self._shortcut(trial, config)
        if shortcut is not None:
            return shortcut

        def on_window(index: int, samples_per_s: float) -> bool:
            trial.report(samples_per_s, index)
            return trial.should_prune()

        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        try:
            result = run_trial_for_tuner(self.workload, config, self.measure, on_window=on_window,
                                         log_path=self.artifacts_dir / f"trial-{trial.number}.log")
        except KeyboardInterrupt:
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("reason", "the tuner was stopped during this trial")
            raise
        if result.user_error:  # wrong for every config: stop the study with the one-line reason
            from .errors import WorkloadError

            trial.set_user_attr("status", "error")
            trial.set_user_attr("reason", result.reason)
            raise WorkloadError(result.reason.removeprefix("WorkloadError: "))
        return self._record(trial, result)

    def _wait_for_twin_in_flight(self, trial, config: TrialConfig) -> None:
        """Several workers on one PostgreSQL/MySQL study: when another worker is measuring this very config
        right now, wait for it and reuse its result (``_shortcut``) instead of measuring it twice at once.

        The claim is taken under the study's server-side lock, so of two workers that draw the same config at
        the same moment exactly one measures it. While waiting, stale trials are failed by heartbeat: if the
        twin's worker died, its trial fails (and is re-queued by the retry callback) and this one measures.
        """
        if _sqlite_path(self.storage_url) is not None:
            return  # one run per SQLite study: nothing else is in flight
        import optuna
        from optuna.trial import TrialState

        key = config.key()
        while True:
            with _rdb_lock(self._storage, f"autotune:{self.study_name}"):
                twin = None
                for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    cfg = t.user_attrs.get("config")
                    if (t.number != trial.number and t.system_attrs.get("autotune_measuring") and cfg
                            and TrialConfig.from_dict(cfg).key() == key):
                        twin = t
                        break
                if twin is None:
                    trial.storage.set_trial_system_attr(trial._trial_id, "autotune_measuring", True)
                    return
            trial.set_user_attr("waited_for", twin.number)
            self._log(f"trial {trial.number}: trial {twin.number} (another worker) is measuring the same config; "
                      "waiting to reuse its result")
            while (state := trial.storage.get_trial(twin._trial_id).state) == TrialState.RUNNING:
                time.sleep(1.0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    optuna.storages.fail_stale_trials(trial.study)
            if state in (TrialState.COMPLETE, TrialState.PRUNED):
                return  # ``_shortcut`` finds it among the finished trials

    def _shortcut(self, trial, config: TrialConfig) -> float | None:
        """Record ``trial`` without running it when the study already knows the answer: a larger batch of a
        config that ran out of memory (infeasible), or a config measured before (its figures are copied).
        Returns the value (or raises TrialPruned like a run would); None means: run it."""
        import optuna

        done, memory_failures = self._known(trial.study)

        for smaller, number in memory_failures:
            if smaller.batch_size <= config.batch_size and smaller.replace(batch_size=config.batch_size) == config:
                result = TrialResult(status="skipped", batch_size=config.batch_size,
                                     reason=f"not run: batch {config.batch_size} >= batch {smaller.batch_size}, "
                                            f"which ran out of memory with the same settings (trial {number})")
                self._answered_free = True
                return self._record(trial, result)

        twin = done.get(config.key())
        if twin is not None:
            self._answered_free = True
            trial.set_user_attr("duplicate_of", twin.number)
            for k, v in twin.user_attrs.items():  # its figures; not its role in the study nor its history
                if k not in _TRIAL_OWN_ATTRS:
                    trial.set_user_attr(k, v)
            trial.set_user_attr("reason", f"same config as trial {twin.number}: its figures, not re-measured")
            if twin.state.name == "PRUNED":
                raise optuna.TrialPruned(f"same config as trial {twin.number}, which was pruned")
            for k, v in twin.constraints.items():
                trial.set_constraint(k, v)
            return float(twin.value or 0.0)
        return None

    def _record(self, trial, result: TrialResult) -> float:
        import optuna

        from .diagnose import diagnose

        figures = result.figures()
        for k, v in figures.items():
            trial.set_user_attr(k, v)
        # one line on what limited this trial, stored so optuna-dashboard shows it too
        trial.set_user_attr("bottleneck", diagnose({**figures, "config": trial.user_attrs.get("config")},
                                                   memory_cap_mb=self.measure.memory_cap_mb).line())
        if result.traceback and result.status in ("error", "crashed"):
            trial.set_user_attr("traceback", result.traceback[-4000:])
        o = outcome(result, self.measure.memory_cap_mb)
        if o.state == "complete":
            trial.set_constraint("memory", o.memory_constraint)
            return o.value  # type: ignore[return-value]
        if o.state == "pruned":
            raise optuna.TrialPruned(result.reason)
        raise _TrialError(f"{result.status}: {result.reason}")

    # --- the run -------------------------------------------------------------------------------------
    def run(self, *, trials: int | None = None, timeout_s: float | None = None, backend: str = "local",
            address: str | None = None):
        """Search until ``trials`` more trials ran or ``timeout_s`` passed, then re-measure the finalists.

        The time budget covers the finalists too: the search stops early enough to leave them room.
        Ctrl-C/SIGTERM stop at once; everything finished is in the storage and a re-run resumes.
        """
        if trials is None and timeout_s is None:
            raise AutotuneError("give a budget: --trials N and/or --timeout DURATION (e.g. --timeout 8h)")
        if backend == "ray":
            from .backends import load_backend

            return load_backend("ray").run_study(self, trials=trials, timeout_s=timeout_s, address=address)
        if backend != "local":
            raise AutotuneError(f"unknown backend {backend!r}: use local or ray")
        from tqdm import tqdm

        study = self.study()  # opens (and checks) the storage before anything else touches its folder
        with _study_lock(self.storage_url, self.study_name):
            self._start(study)
            start = time.monotonic()
            deadline = start + timeout_s if timeout_s else None
            bar = tqdm(total=trials, desc="trials", unit="trial", file=sys.stderr, disable=not self.progress,
                       dynamic_ncols=True, bar_format="{desc} {n_fmt}" + ("/{total_fmt} [{elapsed}<{remaining}"
                                                                         if trials else " [{elapsed}")
                       + "{postfix}]")
            n = 0
            free_in_a_row = 0  # trials answered from the study without running (duplicates, known infeasible)
            trial_walls: list[float] = []
            try:
                while trials is None or n < trials:
                    if free_in_a_row >= _EXHAUSTED_AFTER:
                        self._log(f"the sampler proposed {free_in_a_row} configs in a row that the study already "
                                  "answered: the space looks exhausted; stopping the search")
                        break
                    # the finalists get at most FINALIST_SHARE of the budget; finalize() fits itself into it
                    if self._out_of_time(trial_walls, deadline, timeout_s):
                        break
                    t0 = time.monotonic()
                    self._answered_free = False
                    study.optimize(self.objective, n_trials=1, catch=(_TrialError,), gc_after_trial=False)
                    # the trial just run (the highest number may be a queued one still waiting)
                    last = next(t for t in study.get_trials(deepcopy=False) if t.number == self._current)
                    self._advance_batch_walk(study)
                    if self._answered_free:
                        # answered in no time from earlier trials: it does not use up the --trials budget
                        free_in_a_row += 1
                        continue
                    free_in_a_row = 0
                    trial_walls.append(time.monotonic() - t0)
                    n += 1
                    bar.update(1)
                    bar.set_postfix_str(self._postfix(study, last, deadline), refresh=True)
            finally:
                bar.close()
            self._log(f"search done: {n} trial(s) this run, {len(study.trials)} in the study")
            return self.finalize(deadline=deadline)

    def _finalist_reserve_s(self, trial_walls: list[float], budget_s: float | None = None) -> float:
        """Time the search leaves for the finalists: all rounds at the typical trial's length, but at most
        ``FINALIST_SHARE`` of the budget (``finalize`` then fits fewer finalists and rounds into it)."""
        if not trial_walls or self.finalists <= 0:
            return 0.0
        typical = sorted(trial_walls)[len(trial_walls) // 2]
        full = typical * 1.3 * (self.finalists + 1) * self.finalist_rounds
        return min(full, FINALIST_SHARE * budget_s) if budget_s else full

    def _postfix(self, study, last, deadline) -> str:
        parts = [f"last #{last.number} {last.user_attrs.get('status', last.state.name.lower())}"]
        base = baseline_value(study)
        try:
            best = study.best_trial
            parts.append(f"best {best.value:.1f}/s #{best.number}")
            if base:
                parts.append(f"x{best.value / base:.2f} vs baseline")
        except ValueError:
            pass
        if deadline is not None:
            parts.append(f"{max(0, deadline - time.monotonic()) / 60:.0f} min left")
        return ", ".join(parts)

    # --- finalists -----------------------------------------------------------------------------------
    def finalize(self, *, deadline: float | None = None):
        """Re-measure the top configs and the baseline, interleaved, with longer windows; pick by median.

        Rounds rotate the order (A B C, B C A, ...) so no config always runs first on a warm or cold machine.
        If the top two are within noise, the one with less memory (then fewer threads) wins.
        With a ``deadline`` (``time.monotonic()``), only whole rounds that fit before it are run, estimated from
        the candidates' search trials; if not even one fits, the best search trial is returned as a
        provisional recommendation instead of running past the user's budget.
        """
        from .recommendation import Recommendation

        study = self.study()
        feasible = _feasible_by_config(study, self.hardware.fingerprint)
        if not feasible:
            self._log("no feasible trial yet: nothing to recommend (see `autotune show` for why trials failed)")
            return None
        top = sorted(feasible.values(), key=lambda t: -(t.value or 0))[: max(1, self.finalists)]
        base = baseline_trial(study)
        measure = self.measure.replace(window_s=self.measure.window_s * 2)

        def candidates(k: int, with_base: bool = True) -> list:
            cands = list(top[:k])
            if with_base and base is not None and all(TrialConfig.from_dict(base.user_attrs["config"]) !=
                                                      TrialConfig.from_dict(t.user_attrs["config"]) for t in cands):
                cands.append(base)
            return cands

        def round_s(cands: list) -> float:  # a finalist's windows are twice as long as in its search trial
            return sum((t.user_attrs.get("wall_s") or 0.0) + measure.windows * self.measure.window_s for t in cands)

        rounds = self.finalist_rounds
        cands = candidates(len(top))
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            # When the budget is short, shrink in this order: fewer finalists (down to the top two), then the
            # baseline is not re-measured (its search figure stands in), then only the top one and the baseline;
            # then fewer rounds. Comparing the top two is what re-measuring is most for.
            options = [candidates(k) for k in range(len(top), 1, -1)]
            options += [candidates(2, with_base=False)] if len(top) >= 2 else []
            options += [candidates(1)]
            cands = next((c for c in options if round_s(c) <= left), options[-1])
            fit = int(left // round_s(cands)) if round_s(cands) > 0 else rounds
            if fit < 1:
                self._log(f"no time left in the budget to re-measure the finalists (~{round_s(cands):.0f} s "
                          "a round): recommending the best search trial, provisional; `autotune run --trials 0` "
                          "with more time checks it")
                return Recommendation.provisional_from_study(study, storage=self.storage_url)
            if cands != options[0] or fit < rounds:
                self._log(f"the time budget leaves room for {len(cands)} finalist(s) "
                          f"({'with' if base in cands else 'without'} the baseline) and {min(fit, rounds)} of "
                          f"{rounds} round(s)")
            rounds = min(rounds, fit)
        configs = [TrialConfig.from_dict(t.user_attrs["config"]) for t in cands]
        samples: dict[tuple, list[float]] = {c.key(): [] for c in configs}
        peaks: dict[tuple, float] = {c.key(): 0.0 for c in configs}
        runs: dict[tuple, list[dict]] = {c.key(): [] for c in configs}
        rounds = rounds if len(configs) > 1 else 1
        self._log(f"re-measuring {len(configs)} finalist(s) x {rounds} interleaved round(s), "
                  f"{measure.windows} windows of >= {measure.window_s:g} s each")
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[: r % len(configs)]
            for c in order:
                res = run_trial_for_tuner(self.workload, c, measure,
                                          log_path=self.artifacts_dir / f"finalist-{r}-{abs(hash(c.key())) % 10**6}.log")
                runs[c.key()].append({"round": r, "status": res.status, "samples_per_s": list(res.samples_per_s),
                                      "peak_host_mb": res.peak_host_mb, "reason": res.reason})
                if res.ok:
                    samples[c.key()].extend(res.samples_per_s)
                    peaks[c.key()] = max(peaks[c.key()], res.peak_host_mb or 0.0)
                self._log(f"  round {r + 1}/{rounds} {c.short():<40} {res.status:<8} "
                          + (f"{res.median_samples_per_s:.1f} samples/s" if res.ok else res.reason))
        rec = Recommendation.from_finalists(self, study, configs, cands, samples, peaks, runs, base)
        if rec is not None:
            study.set_user_attr("recommendation", rec.to_dict())
        return rec


# The most of a --timeout budget the finalists' re-measurement may take; the search gets the rest.
FINALIST_SHARE = 0.30

# Consecutive proposals the study could already answer after which the search stops: TPE re-proposes known
# configs mostly when little is left to try, and a small space can be fully measured.
_EXHAUSTED_AFTER = 25


class _TrialError(Exception):
    """A trial that crashed or raised: Optuna records it as FAIL and the study goes on."""


def run_trial_for_tuner(*args, **kwargs) -> TrialResult:
    """The runner as the tuner calls it (a seam the backends and tests can replace)."""
    from .runner import run_trial

    return run_trial(*args, **kwargs)


def _feasible_by_config(study, fingerprint: str | None = None) -> dict[tuple, Any]:
    """Best measured (status ok) feasible trial per distinct config, among the trials measured on hardware
    ``fingerprint`` (default: the study's): a Ray cluster may mix kinds of nodes, a recommendation may not."""
    from optuna.trial import TrialState

    fingerprint = fingerprint or study.user_attrs.get("fingerprint")
    out: dict[tuple, Any] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("status") != "ok" or t.user_attrs.get("duplicate_of") is not None:
            continue
        if fingerprint and t.user_attrs.get("fingerprint", fingerprint) != fingerprint:
            continue
        if not _feasible(t):
            continue
        key = TrialConfig.from_dict(t.user_attrs["config"]).key()
        if key not in out or (t.value or 0) > (out[key].value or 0):
            out[key] = t
    return out


# A queued trial's role in the study, kept by its retry.
_ROLES = ("baseline", "likely_winner", "batch_line")

# A trial's own attributes, which a copy of its figures (a duplicate config) does not take over.
_TRIAL_OWN_ATTRS = _ROLES + ("config", "queued_config", "retry_of", "duplicate_of", "waited_for", "reason", "wall_s")

# what `show` says of a trial that has no result yet
_UNFINISHED = {"RUNNING": "running", "WAITING": "queued"}


def _feasible(trial) -> bool:
    return all(c <= 0 for c in trial.constraints.values())


def baseline_trial(study):
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("baseline") and t.user_attrs.get("status") == "ok":
            return t
    return None


def baseline_value(study) -> float | None:
    t = baseline_trial(study)
    return t.value if t is not None else None


def summarize_or_none(xs: list[float]):
    return summarize(xs) if xs else None


def baseline_trial_any(study):
    """The baseline trial in any state (queued, running, finished), or None."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("baseline"):
            return t
    return None
