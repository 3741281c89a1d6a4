"""The tuner: one study per workload and hardware, searched by a backend, then its finalists re-measured and its
claim confirmed. The door of ``search``: it only orchestrates, one phase a screen, and each decision lives in the
room that owns it:

- plan (``prepare``): what the study needs queued before the search (``plan.queue``, ``plan.warm_start``);
- search (``run``): a backend (``backends``) searches within the run's ``Budget`` (``search.budget``), asking the
  plan after every trial what comes next (``plan.phases``) and when to stop;
- choose (``finalize``): the finalists' interleaved rounds, the checks of the winner (``choose.finalists``,
  ``choose.final_checks``);
- confirm and record: the claim from rounds that did not choose it (``choose.confirm``), and the recommendation
  kept in the study with the ceilings it was sized by (``record``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from autotune.config import MeasureSpec, TrialConfig, TrialResult, Workload
from autotune.errors import AutotuneError
from autotune.machine.safefs import private_dir
from autotune.search.backends.protocol import make_sampler
from autotune.search.budget import SEARCH_WINDOWS, TURN_EXTRA_PRIOR, Budget, confirm_measure
from autotune.search.choose import confirm, final_checks, time_plan
from autotune.search.choose import finalists as fin
from autotune.search.choose.contenders import contenders, lost_gap, near_misses, planned_trial, with_near
from autotune.search.choose import finalist_rounds as fin_rounds
from autotune.search.choose.finalist_rounds import SavedRounds
from autotune.search.choose.payback import RunLength
from autotune.search.choose.rewrite import numerics_unchecked
from autotune.search.choose.settle import ExtraRounds
from autotune.search.plan import phases, resume
from autotune.search.plan import queue as study_queue
from autotune.search.plan.compile_gate import CompileGate
from autotune.search.plan.context import ConnectContext, Placement, Runner, SearchContext, SearchOutcome
from autotune.search.plan.convergence import Convergence
from autotune.search.plan.pruning import NoHopePruner, as_optuna_pruner
from autotune.search.plan.warm_start import queue_warm_start
from autotune.search.record import ceilings
from autotune.search.record import trials as keys
from autotune.search.record.effects import save_dashboard_note
from autotune.search.record.run_phase import RunPhases
from autotune.search.record.storage import (DEFAULT_STORAGE, artifacts_dir, check_study_name, machine_lock,
                                            open_study, run_lock, sqlite_path, study_name_for)
from autotune.search.record.trials import MemoryLimit, baseline_trial, feasible_by_config, window_noise
from autotune.search.record.untried import one_draw_line, untried_in_study, untried_line
from autotune._redact import redact

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage

    from autotune.search.backends import SearchBackend
    from autotune.search.plan.coordinate import Plan

__all__ = ["Tuner", "Runner", "CEILING_S"]

# The time budget of a run given none: it stops when the search converges, and at the latest after this.
CEILING_S = 8 * 3600.0

# What ``Tuner(on_trial=...)`` calls after each finished trial: ``callback(study, frozen_trial)``, as Optuna's.
TrialCallback = Callable[..., None]


class Tuner:
    """Runs and resumes one study. ``run`` returns the Recommendation, or None when no config qualified.

    ``runner`` runs one trial (``context.Runner``; default ``trial.runner.run_trial`` with the study's inductor
    cache); a test passes its own, as ``torch.utils.benchmark.Timer`` takes ``timer=``, and a backend measuring
    elsewhere (Ray) hands the finalists' runner from ``connect``. ``run_length`` (``payback.RunLength``, default an
    hour): the user's training run, over which compile must pay back. ``parity_steps``: the winner's numerics check
    (0: none). ``patience``: sampler trials without a gain before the search has converged (None: from the cost of a
    trial; 0: never). ``on_trial``: callbacks ``(study, trial)`` for each trial this run finishes, whatever the
    backend, like Optuna's ``study.optimize(callbacks=...)`` (e.g. ``integrations.mlflow.MLflowLogger``).
    ``output``: a file the run writes its recommendation's YAML to, inside the run.

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
        from autotune.machine.limits import with_default_caps
        from autotune.search.space.search_space import space_for
        from autotune.trial.ddp import check_ranks

        self.workload, self.hardware = workload, hardware or detect()
        # the workload's own knobs; with a global batch, the batch sizes that divide it (one line if none does)
        self.space = space_for(workload, self.hardware, space=space)
        # more ranks than GPUs, or than usable cores unless the space oversubscribes: one line, before any trial
        check_ranks(workload, usable_cores=self.hardware.usable_cores, gpus=len(self.hardware.visible_gpus()),
                    oversubscribe=self.space.oversubscribe)
        measure = measure or MeasureSpec(windows=SEARCH_WINDOWS)
        # a cap the user chose binds everywhere; the default (a share of this machine's free memory) is this
        # machine's, and a backend measuring elsewhere replaces it with its nodes' (RayBackend.connect)
        self.cap_given = measure.memory_cap_mb is not None if cap_given is None else cap_given
        self.device_cap_given = measure.device_memory_cap_mb is not None
        self.measure = with_default_caps(measure, self.hardware, workload.device)
        self.storage_url = storage or DEFAULT_STORAGE
        self.study_name = check_study_name(study_name or study_name_for(workload, self.hardware.fingerprint))
        self.finalists, self.finalist_rounds = finalists, finalist_rounds
        self.seed, self.startup_trials, self.patience = seed, startup_trials, patience
        self.pruner = pruner or NoHopePruner(margin=prune_margin)  # a test passes its own
        self.pruner.limit = self.limit
        self.compile_gate, self.progress, self.runner = CompileGate(), progress, runner or self._run_trial
        self._turns = False  # the rounds after the search take turns (``finalize``: decided there, per run)
        self.run_length = run_length or RunLength.default()  # a compile config must pay its compile back over it
        self.parity_steps, self.parity, self.warm_start = parity_steps, parity, warm_start
        self.stop_reason = ""  # why the last search stopped (set by the backend), for the closing summary
        self.log: Callable[[str], None] = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.on_trial = tuple(on_trial)  # called with (study, FrozenTrial) for each trial this run finishes
        # the run's time budget (``search.budget``), one frozen record made by ``run``; none until then
        self.budget = Budget.of(None, measure=self.measure, finalists=finalists, rounds=finalist_rounds)
        # where the run's trials run; trials told to on_trial; what ``pick_needs_confirming`` read, and its answer
        self._backend, self._reported, self._pick = "local", set(), None
        self._asked_s: float | None = None  # the --timeout the user gave (not the ceiling): the split's shares
        self._memo = phases.PlanMemo()  # the planned search's decisions said so far, and its plan
        self._storage = self._study = None
        # where a run stands, kept in its study (a killed one resumes from there); its YAML's file, if asked
        self.phases, self.output = RunPhases(self.study), output

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
        from autotune.trial.runner import run_trial  # with this study's compile cache

        return run_trial(workload, config, measure, compile_cache_dir=self.compile_cache_dir, **kw)

    @property
    def storage(self) -> BaseStorage:
        """The open Optuna storage (opened by ``study()``)."""
        if self._storage is None:
            self.study()
        return self._storage

    def study(self) -> Study:
        """The study, created or loaded, checked to be this hardware's, its description kept up to date
        (``storage.open_study``)."""
        if self._study is None:
            meta = keys.study_meta(self.workload, self.hardware, self.space, self.measure, self.device_memory_mb)
            sampler = make_sampler(seed=self.seed, startup_trials=self.startup_trials, hold_back=self.compile_gate)
            self._storage, self._study = open_study(self.storage_url, self.study_name, sampler=sampler,
                                                    pruner=as_optuna_pruner(self.pruner),
                                                    fingerprint=self.hardware.fingerprint, meta=meta)
        return self._study

    # --- where the trials run (``context``) ------------------------------------------------------------------
    def connect_context(self) -> ConnectContext:
        """What a backend's ``connect`` reads: this machine, the workload, the measurement and its caps."""
        return ConnectContext(workload=self.workload, hardware=self.hardware, measure=self.measure,
                              cap_given=self.cap_given, device_cap_given=self.device_cap_given,
                              study_name=self.study_name, log=self.log)

    def place(self, placement: Placement) -> Runner | None:
        """Run the trials where the backend's ``connect`` found them: under its caps, and on other hardware the
        study is the trial machines' (named after their fingerprint unless named explicitly, over the space
        trimmed to them). Returns the finalists' runner there, or None (here)."""
        from autotune.search.space.search_space import load_space, space_for

        if placement.measure is not None and placement.measure != self.measure:
            self.measure = placement.measure
        hw = placement.hardware
        if hw is not None and hw.fingerprint != self.hardware.fingerprint:
            derived = self.study_name == study_name_for(self.workload, self.hardware.fingerprint)
            self.hardware, self._study = hw, None
            self.study_name = study_name_for(self.workload, hw.fingerprint) if derived else self.study_name
            if self.space.source and Path(self.space.source).is_file():
                self.space = space_for(self.workload, hw, space=load_space(self.space.source, hardware=hw,
                                                                           device=self.workload.device))
            self.log(f"trials run on {placement.where or 'machines'} unlike this machine ({hw.summary_line()}, "
                     f"fingerprint {hw.fingerprint}); study {self.study_name} is theirs and the finalists are "
                     "re-measured there")
        self.pruner.limit = self.limit
        return placement.runner

    def search_context(self) -> SearchContext:
        """What a backend's ``search`` and the phases read, fixed for the run (the study's storage is opened)."""
        return SearchContext(
            workload=self.workload, space=self.space, measure=self.measure, limit=self.limit,
            fingerprint=self.hardware.fingerprint, study_name=self.study_name, storage_url=self.storage_url,
            storage=self.storage, artifacts_dir=self.artifacts_dir, runner=self.phases.searching(self.runner),
            compile_gate=self.compile_gate, pruner=self.pruner, seed=self.seed, startup_trials=self.startup_trials,
            patience=self.patience,
            finalists=self.finalists, finalist_rounds=self.finalist_rounds, progress=self.progress, log=self.log,
            budget=self.budget, after_trial=self.after_trial, out_of_time=self.out_of_time, plan=self.plan,
            convergence=self.convergence, numerics_check_s=self.numerics_check_s, pair_by_turns=self._by_turns)

    # --- plan: what the study needs before and after each trial ------------------------------------------------
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
        for t in study.get_trials(deepcopy=False) if self.on_trial else ():
            if t.state.is_finished() and t.number not in self._reported:
                self._reported.add(t.number)
                for callback in self.on_trial:
                    callback(study, t)

    def advance_batch_walk(self, study: Study) -> None:
        """Queue what the plan needs now (``phases.after_trial``: the ceilings where they are wanted and the trials
        run here, the planned search's next steps, compile's next mode, re-runs of trials pruned far too low)."""
        self._memo.after_trial(self.search_context(), study, ceilings_here=self._backend == "local")

    def plan(self, study: Study) -> Plan | None:
        """Where the planned search stands (``coordinate.Plan``); None in a study from before it."""
        return self._memo.plan(study, self.space, limit=self.limit, fingerprint=self.hardware.fingerprint)

    def convergence(self, study: Study) -> Convergence:
        """How far the sampler's search is from converging (``convergence``; never while the plan is not done)."""
        return self._memo.convergence(study, self.space, patience=self.patience, run_length=self.run_length,
                                      fingerprint=self.hardware.fingerprint, limit=self.limit)

    def out_of_time(self, trial_walls: list[float]) -> bool:
        """True when no further search trial may start within the run's budget: the phases after it need the
        time left (``Budget.out_of_time``, the numerics check of the best config so far reserved too)."""
        check_s = self.numerics_check_s(self.study()) if self.budget.deadline is not None and trial_walls else 0.0
        out = self.budget.out_of_time(trial_walls, check_s=check_s)
        if not out and self.budget.confirm_released(trial_walls):
            held, study = dataclasses.replace(self.budget, confirm_needed=None), self.study()
            if held.out_of_time(trial_walls, check_s=check_s) and study.user_attrs.get(keys.CONFIRM_TO_SEARCH) is None:
                study.set_user_attr(keys.CONFIRM_TO_SEARCH, round(reserve := held.confirm_reserve_s(trial_walls), 1))
                self.log(f"the best so far is PyTorch's defaults, which have no claim to confirm: the search goes on "
                         f"into the confirmation's {reserve:.0f} s while they are (a better config found in them is "
                         "confirmed in what is left, or says what --timeout would confirm it)")
        return out

    def pick_needs_confirming(self) -> bool:
        """Whether the provisional pick (``finalists.provisional``: the search ending now) has a claim to confirm, not
        being PyTorch's defaults (``Budget.confirm_needed``); read afresh only when what it reads changed."""
        study, trials = self.study(), self.study().get_trials(deepcopy=False)  # and what the provisional pick reads:
        state = (sum(1 for t in trials if t.state.is_finished()), str(study.user_attrs.get(keys.PLAN_KEPT)),
                 len(study.user_attrs.get(keys.PARITY) or {}))
        if self._pick is None or self._pick[0] != state:
            base = baseline_trial(study)
            try:
                pick = fin.provisional(study, storage=self.storage_url).config.key()
            except AutotuneError:  # nothing feasible yet
                pick = None
            others = base is not None and any(t.state.is_finished() and t.value and t.number != base.number
                                              and t.user_attrs.get(keys.CONFIG) for t in trials)  # not alone
            self._pick = (state, not others or pick is None or keys.config_of(base).key() != pick)
        return self._pick[1]

    def turn_price_so_far(self) -> float:
        """The search's price of the rounds by turns after it (``Budget.turn_price``): what their untimed steps add
        (``finalist_rounds.turn_extra``) for the configs that would be the finalists if the search ended now and the
        baseline, at least ``TURN_EXTRA_PRIOR`` (a later best may step more slowly; a config at 0.8 s a step takes
        one untimed step for each timed one: 1.0, three times the prior); 0 where they would not take turns here
        (``_by_turns``: their memory or their loaders' batches all at once)."""
        study = self.study()
        feasible = feasible_by_config(study, self.hardware.fingerprint, self.limit)
        base = baseline_trial(study)
        group = sorted(feasible.values(), key=lambda t: -(t.value or 0))[: max(1, self.finalists)]
        group += [base] if base is not None and base not in group else []
        if len(group) >= 2 and not self._by_turns(group, None):
            return 0.0
        return max(TURN_EXTRA_PRIOR, fin_rounds.turn_extra(group))

    def numerics_check_s(self, study: Study, *, steps: int | None = None) -> float:
        """The expected time of the numerics check of the best feasible config so far, of ``steps`` steps (default
        ``parity_steps``; ``finalists.expected_check_s``); 0 without a check, such a config or a baseline."""
        return fin.best_check_s(study, fingerprint=self.hardware.fingerprint, limit=self.limit, workload=self.workload,
                                steps=self.parity_steps if steps is None else steps)

    # --- search: the run ---------------------------------------------------------------------------------------
    def run(self, *, trials: int | None = None, timeout_s: float | None = None, backend: str = "local",
            address: str | None = None, ceiling_s: float = CEILING_S, started: float | None = None):
        """Search until ``trials`` more trials ran, ``timeout_s`` passed or the search settled (``phases``), then
        re-measure the finalists and confirm the claim. With neither, ``ceiling_s`` (8 h) is the time budget.

        The time budget (``search.budget.Budget`` from ``started``, the CLI's start; default now) covers what follows
        the search too. A KeyboardInterrupt (the CLI's SIGTERM too) stops at once: what finished is stored, the trial
        running is marked interrupted, and the same command resumes from the phase it was in (``plan.resume``)."""
        from autotune.search.backends import load_backend
        from autotune.trial.forkserver import closing_default

        started = time.monotonic() if started is None else started
        self._asked_s = timeout_s  # the budget the user gave, not the ceiling (the split's shares)
        if trials is None and timeout_s is None:
            if self.patience == 0:
                raise AutotuneError("give a budget (--trials N and/or --timeout DURATION) or leave --patience "
                                    "on: with --patience 0 and no budget the search would only stop at the ceiling")
            timeout_s = ceiling_s
        searcher, self._backend = load_backend(backend, address=address), backend
        self.stop_reason = ""
        with searcher.connect(self.connect_context()) as placement:
            finalist_runner = self.place(placement)  # before the lock: the study may be the trial machines'
            # the budget, made once the caps of the place are known (its rounds are priced in its measurement)
            self.budget = Budget.of(timeout_s, started=started, measure=self.measure, finalists=self.finalists,
                                    rounds=self.finalist_rounds)
            if finalist_runner is None and self._by_turns_here():  # the reserve kept back for rounds by turns
                self.budget = dataclasses.replace(self.budget, turn_price=self.turn_price_so_far)
            self.budget = dataclasses.replace(self.budget, confirm_needed=self.pick_needs_confirming)
            with run_lock(self.storage_url, self.study_name), \
                    closing_default():  # the run's fork servers (autotune.trial.forkserver) end with it
                return self._search_then_finalize(searcher, trials=trials, finalist_runner=finalist_runner)

    def _search_then_finalize(self, searcher: SearchBackend, *, trials: int | None,
                              finalist_runner: Runner | None):
        """``run`` with the backend connected and the run lock held."""
        private_dir(self.artifacts_dir)  # its trial logs, inductor's cache: 0700, and no other user's
        study = self.study()  # opens (and checks) the storage once this run may write to it
        self._reported = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
        if self.budget.deadline is not None:  # the recommendation's stamp, now (inside the budget), not beside a trial
            from autotune.machine.envstamp import collect_env_stamp

            collect_env_stamp()
        # an earlier run of this command killed or stopped: this one goes on from the phase it was in (plan.resume)
        then = resume.begin(self.phases, ask={"trials": trials, "timeout_s": self.budget.budget_s,
                                              "backend": self._backend}, log=self.log, started=self.budget.started)
        self.stop_reason = then.stop_reason
        if then.search:
            self.prepare(study)
            if study.user_attrs.get(keys.CONFIRM_TO_SEARCH) is not None:  # an earlier run's, not this one's
                study.set_user_attr(keys.CONFIRM_TO_SEARCH, None)
            self.budget = dataclasses.replace(self.budget, trials_before=len(self._reported))  # a resumed study's
            outcome: SearchOutcome = searcher.search(self.search_context(), study, trials=trials)
            self.stop_reason = phases.search_done(outcome, study, trials=trials, log=self.log)
        self.phases.keep(stop_reason=self.stop_reason)
        from autotune.recommendation import stored_recommendation

        rec = (self.finalize(budget=self.budget, runner=finalist_runner) if then.finalize
               else stored_recommendation(study))
        # optuna-dashboard's study note: whether its importance bars mean anything yet, what one knob did
        return self.phases.finish(rec, note=lambda: save_dashboard_note(study, self.log), yaml_path=self.output)

    # --- choose, confirm, record -------------------------------------------------------------------------------
    def finalize(self, *, budget: Budget | None = None, runner: Runner | None = None):
        """Re-measure the top configs and the baseline, interleaved, with longer windows; pick by median
        (``finalists``); confirm the claim (``confirm``); keep the recommendation in the study. Within ``budget``
        (default: none) only whole rounds that fit before its end run; if none fits, the best search trial is the
        provisional recommendation, its claim confirmed. ``runner``: the finalists' runner where trials ran."""
        budget = budget or Budget.of(None, measure=self.measure, finalists=self.finalists, rounds=self.finalist_rounds)
        study = self.study()
        feasible = feasible_by_config(study, self.hardware.fingerprint, self.limit)
        if not feasible:
            self.log("no feasible trial yet: nothing to recommend (see `autotune show` for why trials failed)")
            return None
        ranked = sorted(feasible.values(), key=lambda t: -(t.value or 0))
        # no round for a config that lost beyond the noise; the finalists' windows as their noise asks
        gap = lost_gap(study.get_trials(deepcopy=False))
        # the best config's knobs measured against their absence, paired (``contenders.lighter_sibling``), the planned
        base, kept = baseline_trial(study), planned_trial(study, feasible)  # search's best, its near misses after all
        near = near_misses(kept, feasible, plan.one_draw if (plan := self.plan(study)) is not None else [])
        chosen = with_near(contenders(ranked, k=self.finalists, gap=gap, base=base, planned=kept), near, gap=gap,
                           k=self.finalists, base=base, planned=kept, fits=lambda ts: self._by_turns(ts, runner))
        top = chosen.top
        # the rounds after the search take turns where all of them fit here at once; priced with the untimed steps.
        # By turns a finalist runs as a confirmation run does (``Budget.finalist_measure``): the search trials' window
        # noise, run one after another, is mostly the machine's spells, which every config of a round by turns meets
        self._turns = self._by_turns([*top, *([base] if base is not None else [])], runner)
        budget = dataclasses.replace(budget, window_noise=None if self._turns else window_noise(top),
                                     turn_extra=fin_rounds.turn_extra([*top, base]) if self._turns else 0.0,
                                     turn_price=None, confirm_needed=None, by_turns=self._turns)
        planned = self._plan_finalists(study, top, budget, local=runner is None)
        # this machine's lock while the finalists run on it (a backend's runner runs them elsewhere: none)
        local_lock = contextlib.nullcontext() if runner is not None else machine_lock(f"finalists of {self.study_name}")
        with local_lock:  # no finalist round fits: the best search trial, provisional, its claim confirmed
            rec, saved = (self._choose(study, planned, runner) if planned is not None
                          else (fin.provisional(study, storage=self.storage_url), None))
            if planned is None and self.parity_steps:  # a provisional pick's numerics are not checked: said
                rec = numerics_unchecked(rec)
            run = self.phases.around("confirmation", runner or self.runner)
            pair = [confirm.trial_of(rec, top), baseline_trial(study)] if rec is not None else []
            rec = confirm.confirmed(rec, baseline_trial(study), runner=run, workload=self.workload, trials=top,
                                    measure=confirm_measure(self.measure), log_dir=self.artifacts_dir, log=self.log,
                                    budget=budget, by_turns=self._turns and self._by_turns(pair, runner))
        if rec is not None and planned is not None:  # a shortcut says what it skipped and why; added finalists' rounds
            rec = dataclasses.replace(rec, notes=rec.notes + chosen.notes_for(planned[1]))
        return self._record(study, rec, saved)

    def _plan_finalists(self, study: Study, top: list, budget: Budget, *, local: bool):
        """``(the finalists' deadline, candidates, rounds, numerics check steps)`` that fit the budget, the checks
        after them (numerics, worst case) and the confirmation's rounds inside it; None when not one round fits.
        ``local``: the finalists run on this machine (no runner from a backend elsewhere); only then are the checks
        after them priced and the numerics check cut to fit."""
        check_steps = self.parity_steps  # the numerics check's steps in this run: fewer where the budget is short
        if budget.deadline is not None and local and self.parity_steps:
            check_steps = fin.check_steps_within(self.numerics_check_s(study), self.parity_steps, budget=budget,
                                                 log=self.log)
        checks_s = (final_checks.expected_s(study, self.workload, self.numerics_check_s(study, steps=check_steps))
                    if budget.deadline is not None and local else 0.0)
        end, chosen = time_plan.plan_finalists(top, baseline_trial(study), plan=fin.plan, budget=budget,
                                               checks_s=checks_s, log=self.log)
        return None if chosen is None else (end, *chosen, check_steps, budget.finalist_measure())

    def _by_turns_here(self) -> bool:
        """Whether this run's rounds after the search can take turns at all (``_by_turns`` decides per round)."""
        return self.runner == self._run_trial and fin_rounds.turns_possible(self.workload)

    def _by_turns(self, trials: list, runner: Runner | None = None) -> bool:
        """Whether a round of ``trials``' configs takes turns (``finalist_rounds.turns_fit``): only with this tuner's
        own runner on this machine (a backend's runner, or one given to the Tuner, runs each trial as it will)."""
        return runner is None and self.runner == self._run_trial and fin_rounds.turns_fit(
            trials, self.workload, margin=self.measure.memory_margin, cap_mb=self.measure.memory_cap_mb)

    def _choose(self, study: Study, planned: tuple, runner: Runner | None):
        """``(recommendation, saved rounds)``: the finalists' interleaved rounds (``planned``), extra rounds where
        two are close, and the checks of the winner (``final_checks.choose``)."""
        end, cands, rounds, check_steps, measure = planned
        configs = [keys.config_of(t) for t in cands]
        rounds = rounds if len(configs) > 1 else 1
        turns = self._turns and self._by_turns(list(cands), runner)  # the round's children alive at once, by turns
        saved = SavedRounds(study, configs, rounds=rounds, measure=measure, by_turns=turns)  # a kill loses no round
        run, phase = runner or self.runner, self.phases.around  # each phase recorded as its first child starts
        evidence = fin.remeasure(configs, rounds, runner=phase("finalists", run), workload=self.workload,
                                 measure=measure, log_dir=self.artifacts_dir, log=self.log, saved=saved, deadline=end,
                                 by_turns=turns)
        if evidence.rounds_run == 1:  # one round is not a comparison: the search trials count as a second
            fin.pool_search_round(evidence, configs, cands)
        # the numerics check runs here too (a remote node's device is not here), and the latency bound and the
        # worst-case batch (final_checks), whose child runs here or remotely
        more = ExtraRounds(runner=phase("extra rounds", run), workload=self.workload, measure=measure, saved=saved,
                           log_dir=self.artifacts_dir, log=self.log, deadline=end, run=self.run_length, by_turns=turns)
        from autotune.trial.parity import parity_check  # a finished check, an extra pair: kept for a resumed run
        ctx = fin.FinalistContext(
            workload=self.workload, hardware=self.hardware, measure=self.measure, limit=self.limit,
            study_name=self.study_name, storage_url=self.storage_url, artifacts_dir=self.artifacts_dir,
            compile_cache_dir=self.compile_cache_dir, run_length=self.run_length, parity_steps=check_steps,
            parity=saved.checking(phase("numerics", self.parity or parity_check)), log=self.log,
            numerics_cut=check_steps == 0 < self.parity_steps)
        rec = final_checks.choose(ctx, study, configs, cands, evidence, baseline_trial(study), more=more,
                                  runner=saved.keeping("worst-case", phase("worst case", run)),
                                  check_numerics=runner is None)
        return rec, saved

    def _with_untried(self, study: Study, rec):
        """``rec`` with the knob values no finished trial ran (``record.untried``): its YAML's ``try`` and a note; and
        a note of the candidates one trial put out within the noise (``Plan.one_draw``)."""
        knobs, plan = untried_in_study(self.space, study.get_trials(deepcopy=False), rec.config), self.plan(study)
        rounds = [rec.config.key(), *(TrialConfig.from_dict(r["config"]).key() for r in rec.runners_up)]  # measured
        lines = (untried_line(knobs, budget_ended=self._asked_s is not None and "time" in self.stop_reason),
                 one_draw_line(plan.one_draw if plan else [], rec.config, rounds if rec.finalist_rounds else ()))
        return dataclasses.replace(rec, untried=knobs or rec.untried, notes=rec.notes + tuple(x for x in lines if x))

    def _record(self, study: Study, rec, saved: SavedRounds | None):
        """Keep ``rec`` in the study (a provisional one too, with its confirmation), with its ceilings and why the
        search stopped: an earlier run's must not outlive this one's verdict. ``saved``: None without finalists."""
        if rec is not None:
            rec = ceilings.recorded(study, rec)
            stopped = (f"search stopped: {self.stop_reason}",) if self.stop_reason else ()
            # where this run's time went, up to the recommendation (a resumed run's: this run's part alone)
            rec = dataclasses.replace(rec, notes=stopped + rec.notes,
                                      budget_split=self.phases.split(budget_s=self._asked_s))
            rec = self._with_untried(study, rec)
        study.set_user_attr(keys.STUDY_RECOMMENDATION, None if rec is None else rec.to_dict())
        self.phases.enter("recommendation")  # stored: a run killed from now on keeps it (``plan.resume``)
        if saved is not None:
            saved.clear()
        if rec is None:
            self.log("no finalist qualified (see the notes in the log above and `autotune show`): nothing to recommend")
        return rec
