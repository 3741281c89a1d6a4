"""The tuner: one study per workload and hardware, searched by a backend, then its finalists re-measured.

``Tuner`` only orchestrates; each decision lives in its own module: where the study is stored and locked
(``storage``), what stored trials mean (``trials``: attribute keys, the outcome mapping), when a trial is cut
short (``pruning``), what is queued (``study_queue``; the planned search: ``coordinate``, ``batch_walk``), the
steps of one trial (``protocol``), when the search stops (``phases``: the sampler's ``convergence``, then
``compile_last``), where trials run (``backends``), and the finalists and the choice (``finalists``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from autotune.search.plan import ceiling_runs
from autotune.search.record import ceilings
from autotune.search.choose import confirm, final_checks
from autotune.search.choose import finalists as fin
from autotune.search.plan import queue as study_queue
from autotune.search.record import trials as keys
from autotune._redact import redact
from autotune.machine.safefs import private_dir
from autotune.search.plan.compile_gate import CompileGate
from autotune.search.plan.context import ConnectContext, Placement, Runner, SearchContext, SearchOutcome
from autotune.config import MeasureSpec, TrialResult, Workload
from autotune.search.plan.convergence import Convergence, convergence
from autotune.search.record.effects import save_dashboard_note
from autotune.errors import AutotuneError, StorageError
from autotune.search.choose.finalist_rounds import SavedRounds, record_parity
from autotune.search.choose.settle import ExtraRounds
from autotune.search.plan import resume
from autotune.search.record.run_phase import RunPhases
from autotune.search.choose.payback import RunLength
from autotune.search.backends.protocol import make_sampler
from autotune.search.plan.pruning import NoHopePruner, as_optuna_pruner
from autotune.search.record.storage import (DEFAULT_STORAGE, artifacts_dir, check_study_name, machine_lock,
                                            open_storage, run_lock, sqlite_path, study_name_for)
from autotune.search.record.trials import MemoryLimit, baseline_trial, feasible_by_config
from autotune.search.plan.warm_start import queue_warm_start

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage

    from autotune.search.backends import SearchBackend
    from autotune.search.plan.coordinate import Plan

__all__ = ["Tuner", "Runner", "CEILING_S"]

# The time budget of a run given none: it stops when the search converges, and at the latest after this.
CEILING_S = 8 * 3600.0

# ``Runner`` (``context.Runner``): what runs one trial, ``runner(workload, config, measure, *, on_window=None,
# log_path=None) -> TrialResult`` (``autotune.trial.runner.run_trial``: a fresh child process, watched by this one).
# What ``Tuner(on_trial=...)`` calls after each finished trial: ``callback(study, frozen_trial)``, as Optuna's.
TrialCallback = Callable[..., None]


class Tuner:
    """Runs and resumes one study. ``run`` returns the Recommendation, or None when no config qualified (none
    ran feasibly, or every finalist failed a round or the numerics check).

    ``runner`` runs one trial (default ``autotune.trial.runner.run_trial`` with the study's inductor cache,
    ``compile_cache_dir``); a test passes its own, as ``torch.utils.benchmark.Timer`` takes ``timer=``. (A
    backend that measures elsewhere, like Ray's, runs the same ``run_trial`` there, and hands the tuner a runner
    for the finalists from ``connect``.) ``run_length`` (``payback.RunLength``; default an assumed hour) is how
    long the user's training runs: the finalists are ranked by their throughput over it, compile included.

    ``on_trial``: callbacks ``(study, trial)`` called, like Optuna's ``study.optimize(callbacks=...)``, once for
    each trial that finishes during ``run`` (measured, answered from the study, pruned or failed), whatever the
    backend (e.g. ``autotune.integrations.mlflow.MLflowLogger``).

    >>> tuner = Tuner(Workload(model="resnet18", image_size=64))   # doctest: +SKIP
    >>> rec = tuner.run(trials=20)                                 # doctest: +SKIP
    """

    def __init__(self, workload: Workload, *, space=None, measure: MeasureSpec | None = None,
                 storage: str | None = None, study_name: str | None = None, hardware=None,
                 finalists: int = 3, finalist_rounds: int = 2, seed: int | None = None,
                 startup_trials: int = 5, prune_margin: float = 0.15, progress: bool = True,
                 log: Callable[[str], None] | None = None, runner: Runner | None = None,
                 parity_steps: int = 30, parity: Callable | None = None, cap_given: bool | None = None,
                 patience: int | None = None, pruner: NoHopePruner | None = None,
                 on_trial: Sequence[TrialCallback] = (), run_length: RunLength | None = None,
                 warm_start: bool = True, output: str | Path | None = None) -> None:
        from autotune.machine.hardware import detect
        from autotune.machine.limits import default_device_memory_cap_mb, default_memory_cap_mb
        from autotune.search.space.search_space import space_for

        self.workload = workload
        self.hardware = hardware or detect()
        # the workload's own knobs: no channels_last for text, no length bucketing for images; with a global batch
        # only the batch sizes that divide it are searched (a one-line error if none does)
        self.space = space_for(workload, self.hardware, space=space)
        from autotune.trial.ddp import check_ranks

        # more ranks than GPUs, or than usable cores unless the space oversubscribes: one line, before any trial
        check_ranks(workload, usable_cores=self.hardware.usable_cores, gpus=len(self.hardware.visible_gpus()),
                    oversubscribe=self.space.oversubscribe)
        measure = measure or MeasureSpec()
        # a cap the user chose binds everywhere; the default (a share of this machine's free memory) is this
        # machine's, and a backend measuring elsewhere replaces it with its nodes' (RayBackend.connect)
        self.cap_given = measure.memory_cap_mb is not None if cap_given is None else cap_given
        if measure.memory_cap_mb is None:
            measure = measure.replace(memory_cap_mb=default_memory_cap_mb(self.hardware))
        self.device_cap_given = measure.device_memory_cap_mb is not None
        if measure.device_memory_cap_mb is None and workload.device != "cpu":
            measure = measure.replace(device_memory_cap_mb=default_device_memory_cap_mb(self.hardware, workload.device))
        self.measure = measure
        self.storage_url = storage or DEFAULT_STORAGE
        self.study_name = check_study_name(study_name or study_name_for(workload, self.hardware.fingerprint))
        self.finalists = finalists
        self.finalist_rounds = finalist_rounds
        self.seed = seed
        self.startup_trials = startup_trials
        self.pruner = pruner or NoHopePruner(margin=prune_margin)  # a test passes its own
        self.pruner.limit = self.limit
        # holds compile trials back when the time left for the search is shorter than one (compile_gate)
        self.compile_gate = CompileGate(lambda walls, budget_s: fin.search_reserve_s(
            walls, finalists=self.finalists, rounds=self.finalist_rounds, budget_s=budget_s, measure=self.measure))
        self.progress = progress
        # the default runs each trial in a child that shares this study's inductor cache (``compile_cache_dir``)
        self.runner: Runner = runner or self._run_trial
        # how long the user's training runs: a compile config must pay its compile back over it (``payback``)
        self.run_length = run_length or RunLength.default()
        self.parity_steps = parity_steps  # steps of the numerics check of the winner; 0: no check
        self.parity = parity  # the check (default ``parity.parity_check``; a test passes its own)
        # sampler trials without a gain after which the search has converged (``convergence``); None: from the
        # measured cost of a trial and what a gain saves over the run; 0: never
        self.patience = patience
        self._said: set[str] = set()  # the planned search's decisions logged so far (``coordinate``)
        self._plan: tuple | None = None  # (the study's trials' states, the plan worked out from them)
        # a new study measures the winners of earlier studies on this hardware among its first trials
        self.warm_start = warm_start
        self.stop_reason = ""  # why the last search stopped (set by the backend), for the closing summary
        self.log: Callable[[str], None] = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.on_trial = tuple(on_trial)  # called with (study, FrozenTrial) for each trial this run finishes
        self._reported: set[int] = set()
        self._storage = None
        self._study = None
        self._deadline: float | None = None  # the run's time budget's end (time.monotonic()), while a run is on
        self._budget_s: float | None = None  # the run's whole time budget (--timeout), while a run is on
        self._run_started, self._backend = time.monotonic(), "local"  # when the run (its budget) began; where
        self._check_steps = parity_steps  # the numerics check's steps in this run: fewer where the budget is short
        self.phases = RunPhases(self.study)  # where a run stands, in its study: a killed one resumes from there
        self.output = output  # where a run writes its recommendation's YAML too (``run_phase.RunPhases.finish``)

    # --- the study -----------------------------------------------------------------------------------
    @property
    def limit(self) -> MemoryLimit:
        """The memory a config may use in this run: the cap less the margin (``MeasureSpec.memory_margin``),
        and on a GPU its memory less the same margin."""
        return MemoryLimit.of(self.measure, self.device_memory_mb)

    @property
    def device_memory_mb(self) -> float | None:
        """The device memory cap the trials run under (``MeasureSpec.device_memory_cap_mb``); None on the CPU."""
        return None if self.workload.device == "cpu" else self.measure.device_memory_cap_mb

    @property
    def artifacts_dir(self) -> Path:
        return artifacts_dir(self.storage_url, self.study_name)

    @property
    def compile_cache_dir(self) -> Path:
        """Where this study's trials keep inductor's cache (``TORCHINDUCTOR_CACHE_DIR``): beside its trial logs,
        so a compile config's later trials and the finalists' rounds load what its first trial compiled."""
        return self.artifacts_dir / "inductor-cache"

    def _run_trial(self, workload: Workload, config, measure: MeasureSpec, **kw) -> TrialResult:
        """``runner.run_trial`` with this study's compile cache."""
        from autotune.trial.runner import run_trial

        return run_trial(workload, config, measure, compile_cache_dir=self.compile_cache_dir, **kw)

    @property
    def storage(self) -> BaseStorage:
        """The open Optuna storage (opened by ``study()``)."""
        if self._storage is None:
            self.study()
        return self._storage

    def study(self) -> Study:
        """The study, created or loaded, checked to be this hardware's, its description kept up to date."""
        if self._study is None:
            import optuna

            # Optuna logs every failed trial with a traceback at WARNING; our progress line and `show` say it.
            optuna.logging.set_verbosity(optuna.logging.ERROR)
            self._storage = open_storage(self.storage_url)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study = optuna.create_study(storage=self._storage, study_name=self.study_name,
                                            direction="maximize", pruner=as_optuna_pruner(self.pruner),
                                            sampler=make_sampler(seed=self.seed, startup_trials=self.startup_trials,
                                                                 hold_back=self.compile_gate),
                                            load_if_exists=True)
                if study.metric_names != [keys.OBJECTIVE]:  # new studies, and those made before it was named
                    study.set_metric_names([keys.OBJECTIVE])
            stored = study.user_attrs.get(keys.STUDY_FINGERPRINT)
            if stored and stored != self.hardware.fingerprint:
                # Several machines may share one storage (and one study name), but a study holds the
                # measurements of one kind of machine: mixing them would recommend one machine's best to another.
                raise StorageError(
                    f"study {self.study_name!r} was measured on other hardware (fingerprint {stored}: "
                    f"{study.user_attrs.get(keys.STUDY_HARDWARE)}); this machine is {self.hardware.fingerprint}: "
                    "drop --study-name (the default name includes the fingerprint, so each kind of machine gets "
                    "its own study)")
            meta = {keys.STUDY_WORKLOAD: self.workload.to_dict(), keys.STUDY_FINGERPRINT: self.hardware.fingerprint,
                    keys.STUDY_HARDWARE: self.hardware.summary_line(), keys.STUDY_SPACE: self.space.to_dict(),
                    keys.STUDY_MEMORY_CAP: self.measure.memory_cap_mb, keys.STUDY_MEASURE: self.measure.to_dict(),
                    keys.STUDY_DEVICE_MEMORY: self.device_memory_mb}
            for k, v in meta.items():
                if study.user_attrs.get(k) != v:
                    study.set_user_attr(k, v)
            self._study = study
        return self._study

    def adopt_hardware(self, hardware) -> None:
        """Trials run on other machines than this one (a laptop driving a Ray cluster): the study is theirs,
        named after their fingerprint (unless named explicitly) and over the space trimmed to them."""
        from autotune.search.space.search_space import load_space, space_for

        derived = self.study_name == study_name_for(self.workload, self.hardware.fingerprint)
        self.hardware = hardware
        self.pruner.limit = self.limit
        self._study = None
        if derived:
            self.study_name = study_name_for(self.workload, hardware.fingerprint)
        source = self.space.source
        if source and Path(source).is_file():
            self.space = space_for(self.workload, hardware,
                                   space=load_space(source, hardware=hardware, device=self.workload.device))

    def record_parity(self, trial_number: int, result) -> None:
        """Keep a finalist's numerics check in the study (``finalist_rounds.record_parity``)."""
        record_parity(self.study(), trial_number, result)

    def set_memory_cap(self, cap_mb: float) -> None:
        """Run the trials under another cap (e.g. a Ray node's share): what the child is killed at, and what
        every later decision counts as feasible."""
        self.measure = self.measure.replace(memory_cap_mb=cap_mb)
        self.pruner.limit = self.limit

    def set_device_memory_cap(self, cap_mb: float | None) -> None:
        """Trials run under another device memory cap (a Ray node's GPU: its free memory, not this machine's)."""
        self.measure = self.measure.replace(device_memory_cap_mb=cap_mb)
        self.pruner.limit = self.limit

    # --- what the parts it drives get (``context``) ---------------------------------------------------------
    def connect_context(self) -> ConnectContext:
        """What a backend's ``connect`` reads: this machine, the workload, the measurement and its caps."""
        return ConnectContext(workload=self.workload, hardware=self.hardware, measure=self.measure,
                              cap_given=self.cap_given, device_cap_given=self.device_cap_given,
                              study_name=self.study_name, log=self.log)

    def place(self, placement: Placement) -> Runner | None:
        """Run the trials where the backend's ``connect`` found them: under its caps, and on other hardware the
        study is the trial machines' (``adopt_hardware``). Returns the finalists' runner there, or None (here)."""
        if placement.measure is not None and placement.measure != self.measure:
            self.measure = placement.measure
            self.pruner.limit = self.limit
        hw = placement.hardware
        if hw is not None and hw.fingerprint != self.hardware.fingerprint:
            self.adopt_hardware(hw)
            self.log(f"trials run on {placement.where or 'machines'} unlike this machine ({hw.summary_line()}, "
                     f"fingerprint {hw.fingerprint}); study {self.study_name} is theirs and the finalists are "
                     "re-measured there")
        return placement.runner

    def search_context(self) -> SearchContext:
        """What a backend's ``search`` and the phases read, fixed for the run (the study's storage is opened)."""
        return SearchContext(
            workload=self.workload, space=self.space, measure=self.measure, limit=self.limit,
            fingerprint=self.hardware.fingerprint, study_name=self.study_name, storage_url=self.storage_url,
            storage=self.storage, artifacts_dir=self.artifacts_dir, runner=self.phases.searching(self.runner),
            compile_gate=self.compile_gate,
            pruner=self.pruner, seed=self.seed, startup_trials=self.startup_trials, patience=self.patience,
            finalists=self.finalists, finalist_rounds=self.finalist_rounds, progress=self.progress, log=self.log,
            after_trial=self.after_trial, out_of_time=self.out_of_time, plan=self.plan, convergence=self.convergence,
            numerics_check_s=self.numerics_check_s)

    def finalist_context(self) -> fin.FinalistContext:
        """What ``finalists.choose`` reads."""
        return fin.FinalistContext(
            workload=self.workload, hardware=self.hardware, measure=self.measure, limit=self.limit,
            study_name=self.study_name, storage_url=self.storage_url, artifacts_dir=self.artifacts_dir,
            compile_cache_dir=self.compile_cache_dir, run_length=self.run_length, parity_steps=self._check_steps,
            parity=self.parity, log=self.log, numerics_cut=self._check_steps == 0 < self.parity_steps)

    # --- the search ----------------------------------------------------------------------------------------
    def prepare(self, study: Study) -> None:
        """Queue what the study needs before the search: retries of interrupted trials, and in a new study
        the baseline, the likely winner, the winners of earlier studies on this hardware (unless
        ``warm_start=False``, ``warm_start.queue_warm_start``) and the first batch-walk steps
        (``study_queue.queue_first_trials``)."""
        def warm() -> int:
            return queue_warm_start(study, self.space, storage=self.storage, fingerprint=self.hardware.fingerprint,
                                    device=self.workload.device, enqueue=study_queue.enqueue, log=self.log,
                                    world_size=self.workload.nproc_per_node)

        study_queue.queue_first_trials(study, self.space, storage=self.storage,
                                       single_run=sqlite_path(self.storage_url) is not None, log=self.log,
                                       where=redact(self.storage_url),
                                       warm_start=warm if self.warm_start else None)
        self.advance_batch_walk(study)  # a resumed study: what its plan needs and a killed run did not queue

    def after_trial(self, study: Study) -> None:
        """What follows every finished trial (each backend calls it): the planned search's next trials (or
        compile's next mode), then the ``on_trial`` callbacks for each trial finished since the last call."""
        self.advance_batch_walk(study)
        if not self.on_trial:
            return
        for t in study.get_trials(deepcopy=False):
            if t.state.is_finished() and t.number not in self._reported:
                self._reported.add(t.number)
                for callback in self.on_trial:
                    callback(study, t)

    def advance_batch_walk(self, study: Study) -> None:
        """Queue what the planned search needs now (``study_queue.advance_plan``: the bundle apart, the batch
        walk, one knob at a time; in a study from before it, the batch walk's next step), compile's next mode
        (``phases.advance``), and a re-run of a trial pruned far below its neighbours
        (``study_queue.requeue_far_pruned``); after every trial."""
        from autotune.search.plan import phases

        if study.user_attrs.get(keys.PLAN):
            # after the baseline and the likely winners: the two ceilings, when the data path may bind; here, where
            # the trials run (a Ray cluster's nodes are not this machine: not measured there yet)
            left = None if self._deadline is None else self._deadline - time.monotonic()
            if self._backend == "local":
                ceiling_runs.measure_if_wanted(study, self.space, runner=self.phases.searching(self.runner),
                                               workload=self.workload, measure=self.measure, log_dir=self.artifacts_dir,
                                               log=self.log, time_left_s=left, said=self._said)
            planned = study_queue.advance_plan(study, self.space, storage=self.storage, limit=self.limit,
                                               fingerprint=self.hardware.fingerprint, log=self.log, said=self._said)
            self._plan = (self._states(study), planned)  # its needs are queued now: present, not needed
        else:
            study_queue.advance_batch_walk(study, self.space, storage=self.storage, limit=self.limit, log=self.log)
        phases.advance(study, self.space, fingerprint=self.hardware.fingerprint, limit=self.limit, log=self.log)
        study_queue.requeue_far_pruned(study, self.space, storage=self.storage, log=self.log)

    @staticmethod
    def _states(study: Study) -> tuple:
        return tuple((t.number, t.state.name) for t in study.get_trials(deepcopy=False))

    def plan(self, study: Study) -> Plan | None:
        """Where the planned search stands (``coordinate.Plan``); a study from before it has none (None)."""
        from autotune.search.plan.coordinate import plan

        if not study.user_attrs.get(keys.PLAN):
            return None
        states = self._states(study)
        if self._plan is None or self._plan[0] != states:
            self._plan = (states, plan(self.space, study.get_trials(deepcopy=False), limit=self.limit,
                                       fingerprint=self.hardware.fingerprint, feed=ceilings.feed(study, self.space)))
        return self._plan[1]

    def convergence(self, study: Study) -> Convergence:
        """How far the sampler's search is from converging (``convergence``): its trials without a gain, against
        a patience from the cost of a trial and the planned run; never converged while the plan is not done."""
        from autotune.search.plan.phases import run_seconds

        plan = self.plan(study)
        return convergence(study, patience_k=self.patience, fingerprint=self.hardware.fingerprint, limit=self.limit,
                           run_s=run_seconds(study, run_length=self.run_length, fingerprint=self.hardware.fingerprint,
                                             limit=self.limit), ready=plan is None or plan.done,
                           run_label=self.run_length.label().split(" (")[0])

    def out_of_time(self, trial_walls: list[float], deadline: float | None, budget_s: float | None) -> bool:
        """True when no further search trial may start: the finalists need the time left."""
        check_s = self.numerics_check_s(self.study()) if deadline is not None and trial_walls else 0.0
        return fin.out_of_time(trial_walls, deadline, budget_s, finalists=self.finalists,
                               rounds=self.finalist_rounds, check_s=check_s, measure=self.measure)

    def numerics_check_s(self, study: Study, *, steps: int | None = None) -> float:
        """The expected time of the numerics check of the best feasible config so far, of ``steps`` steps (default
        ``parity_steps``; ``finalists.expected_check_s``); 0 without a check, such a config or a baseline."""
        steps = self.parity_steps if steps is None else steps
        feasible = feasible_by_config(study, self.hardware.fingerprint, self.limit)
        if not steps or not feasible:
            return 0.0
        best = max(feasible.values(), key=lambda t: t.value or 0.0)
        return fin.expected_check_s(best, baseline_trial(study), steps=steps, workload=self.workload)

    # --- the run -------------------------------------------------------------------------------------
    def run(self, *, trials: int | None = None, timeout_s: float | None = None, backend: str = "local",
            address: str | None = None, ceiling_s: float = CEILING_S, started: float | None = None):
        """Search until ``trials`` more trials ran, ``timeout_s`` passed or the search settled (the planned search
        done, then the sampler converged or ran out of new configs, then compile tried last on the best eager
        config: ``phases``), whichever comes first, then re-measure the finalists. With neither ``trials`` nor
        ``timeout_s``, ``ceiling_s`` (8 h) is the time budget, against a search that never settles.

        The time budget covers the finalists too: the search stops early enough to leave them room, and the
        checks after them (numerics, worst case) and the environment stamp are inside it. ``started``: when the
        budget began (``time.monotonic()``; the CLI's start, so its workload check counts); default now.
        A KeyboardInterrupt (the CLI turns SIGTERM into one) stops at once; every finished trial is in the
        storage, the one running is marked interrupted, and a re-run resumes and retries it.
        """
        from autotune.search.backends import load_backend
        from autotune.trial.forkserver import closing_default

        if trials is None and timeout_s is None:
            if self.patience == 0:
                raise AutotuneError("give a budget (--trials N and/or --timeout DURATION) or leave --patience "
                                    "on: with --patience 0 and no budget the search would only stop at the ceiling")
            timeout_s = ceiling_s
        self._run_started = time.monotonic() if started is None else started
        self._deadline = self._run_started + timeout_s if timeout_s else None
        self._budget_s = timeout_s
        searcher, self._backend = load_backend(backend, address=address), backend
        self.stop_reason = ""
        with searcher.connect(self.connect_context()) as placement:
            finalist_runner = self.place(placement)  # before the lock: the study may be the trial machines'
            with run_lock(self.storage_url, self.study_name), \
                    closing_default():  # the run's fork servers (autotune.trial.forkserver) end with it
                return self._search_then_finalize(searcher, trials=trials, timeout_s=timeout_s,
                                                  finalist_runner=finalist_runner)

    def _search_then_finalize(self, searcher: SearchBackend, *, trials: int | None, timeout_s: float | None,
                              finalist_runner: Runner | None):
        """``run`` with the backend connected and the run lock held."""
        # its folder (trial logs, inductor's cache that trials load back): 0700, and no other user's
        private_dir(self.artifacts_dir)
        study = self.study()  # opens (and checks) the storage once this run may write to it
        self._reported = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
        deadline = self._deadline
        if deadline is not None:  # the stamp the recommendation keeps, now (inside the budget), never beside a trial
            from autotune.machine.envstamp import collect_env_stamp

            collect_env_stamp()
        # an earlier run of this command killed or stopped: this one goes on from the phase it was in (plan.resume)
        then = resume.begin(self.phases, ask={"trials": trials, "timeout_s": timeout_s, "backend": self._backend},
                            log=self.log)
        self.stop_reason = then.stop_reason
        if then.search:
            self.prepare(study)
            outcome: SearchOutcome = searcher.search(self.search_context(), study, trials=trials, deadline=deadline,
                                                     budget_s=timeout_s)
            n = outcome.trials_run
            self.stop_reason = outcome.stop_reason or (
                f"ran the {trials} trial(s) asked for" if trials is not None and n >= trials
                else "out of time: what is left of the budget is the finalists'")
            self.log(f"search done: {n} trial(s) this run, {len(study.trials)} in the study; search stopped: "
                     f"{self.stop_reason}")
        self.phases.keep(stop_reason=self.stop_reason)
        from autotune.recommendation import stored_recommendation

        rec = (self.finalize(deadline=deadline, runner=finalist_runner) if then.finalize
               else stored_recommendation(study))
        # optuna-dashboard's study note: whether its importance bars mean anything yet, what one knob did
        return self.phases.finish(rec, note=lambda: save_dashboard_note(study, self.log), yaml_path=self.output)

    def finalize(self, *, deadline: float | None = None, runner: Runner | None = None):
        """Re-measure the top configs and the baseline, interleaved, with longer windows; pick by median
        (``finalists``); confirm the claim (``confirm``). With a ``deadline`` (``time.monotonic()``), only whole
        rounds that fit before it run; if none fits, the best search trial is the provisional recommendation."""
        study = self.study()
        feasible = feasible_by_config(study, self.hardware.fingerprint, self.limit)
        if not feasible:
            self.log("no feasible trial yet: nothing to recommend (see `autotune show` for why trials failed)")
            return None
        top = sorted(feasible.values(), key=lambda t: -(t.value or 0))[: max(1, self.finalists)]
        base = baseline_trial(study)
        # the checks after the rounds (numerics, worst case) are inside the budget: the rounds get what they leave
        self._check_steps = self.parity_steps
        if deadline is not None and runner is None and self.parity_steps:
            self._check_steps = fin.check_steps_within(self.numerics_check_s(study), self.parity_steps,  # its share
                                                       budget_s=self._budget_s, left_s=deadline - time.monotonic(),
                                                       log=self.log)
        checks_s = (final_checks.expected_s(study, self.workload, self.numerics_check_s(study, steps=self._check_steps))
                    if deadline is not None and runner is None else 0.0)
        # the confirmation's rounds (search.choose.confirm) have the rest to ``end``, and at least two rounds' reserve
        end, (deadline, chosen) = deadline, confirm.plan_finalists(
            top, base, plan=fin.plan, deadline=deadline, checks_s=checks_s, budget_s=self._budget_s,
            rounds=self.finalist_rounds, measure=self.measure, finalists=fin.finalist_measure(self.measure),
            log=self.log)
        if chosen is None:
            return ceilings.recorded(study, fin.provisional(study, storage=self.storage_url))
        cands, rounds = chosen
        configs = [keys.config_of(t) for t in cands]
        here = contextlib.nullcontext() if runner is not None else machine_lock(f"finalists of {self.study_name}")
        rounds, measure = (rounds if len(configs) > 1 else 1), fin.finalist_measure(self.measure)
        saved = SavedRounds(study, configs, rounds=rounds, measure=measure)  # a kill here loses no finished round
        run, phase = runner or self.runner, self.phases.around  # each phase recorded as its first child starts
        with here:
            evidence = fin.remeasure(configs, rounds, runner=phase("finalists", run), workload=self.workload,
                                     measure=measure, log_dir=self.artifacts_dir, log=self.log, saved=saved,
                                     deadline=deadline)
            if evidence.rounds_run == 1:  # one round is not a comparison: the search trials count as a second
                fin.pool_search_round(evidence, configs, cands)
            # the numerics check runs here too: it needs this machine (a remote node's device is not here)
            # and the latency bound and the worst-case batch (final_checks), whose child runs here or remotely
            more = ExtraRounds(runner=phase("extra rounds", run), workload=self.workload, measure=measure, saved=saved,
                               log_dir=self.artifacts_dir, log=self.log, deadline=deadline, run=self.run_length)
            from autotune.trial.parity import parity_check

            check = saved.checking(phase("numerics", self.parity or parity_check))  # a finished check is kept
            ctx = dataclasses.replace(self.finalist_context(), parity=check)
            rec = final_checks.choose(ctx, study, configs, cands, evidence, base, more=more,
                                      runner=saved.keeping("worst-case", phase("worst case", run)),
                                      check_numerics=runner is None)
            rec = confirm.confirmed(rec, base, runner=phase("confirmation", run), workload=self.workload,
                                    measure=measure, log_dir=self.artifacts_dir, log=self.log, deadline=end,
                                    search_s=time.monotonic() - self._run_started, trials=top)
        if rec is not None:
            rec = ceilings.recorded(study, rec)
            stopped = (f"search stopped: {self.stop_reason}",) if self.stop_reason else ()
            rec = dataclasses.replace(rec, notes=stopped + rec.notes)
        # a recommendation of an earlier run must not outlive this one's verdict (e.g. under a lower cap)
        study.set_user_attr(keys.STUDY_RECOMMENDATION, None if rec is None else rec.to_dict())
        self.phases.enter("recommendation")  # stored: a run killed from now on keeps it (``plan.resume``)
        saved.clear()
        if rec is None:
            self.log("no finalist qualified (see the notes in the log above and `autotune show`): nothing to recommend")
        return rec
