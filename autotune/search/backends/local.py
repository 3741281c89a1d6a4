"""The local backend: search trials one at a time on this machine (two trials sharing its cores would
spoil both timings), through ``study.optimize`` with a progress bar."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import TYPE_CHECKING, Iterator

from autotune.search.plan import phases
from autotune.search.backends import pairs, protocol
from autotune.search.record import trials as keys
from autotune.machine.safefs import private_dir
from autotune.config import TrialConfig
from autotune.errors import AutotuneError
from autotune.search.record.optuna_compat import trial_id
from autotune.search.record.storage import machine_lock, sqlite_path
from autotune.search.record.trials import baseline_value
from autotune.search.backends.base import SearchBackend
from autotune.search.plan.context import ConnectContext, Placement, SearchContext, SearchOutcome

if TYPE_CHECKING:
    from optuna import Study, Trial
    from optuna.trial import FrozenTrial

__all__ = ["LocalBackend", "EXHAUSTED_AFTER"]

# Consecutive proposals the study could already answer after which the search stops: TPE re-proposes known
# configs mostly when little is left to try, and a small space can be fully measured.
EXHAUSTED_AFTER = 25


class LocalBackend(SearchBackend):
    """One trial at a time in a child process of this one, until ``trials`` ran, the budget needs the rest, or
    the search settled (``phases.stop_reason``).

    Trials the study answers without running (copies of a measured config, a larger batch of one that ran
    out of memory) do not use up ``trials``; after ``EXHAUSTED_AFTER`` of them in a row the space is taken
    as exhausted (the eager search settles; compile, if the space has it, is still tried last)."""

    def __init__(self, *, address: str | None = None) -> None:
        if address:
            raise AutotuneError(f"--address {address} joins a Ray cluster: use it with --backend ray")
        super().__init__()

    @contextlib.contextmanager
    def connect(self, ctx: ConnectContext) -> Iterator[Placement]:
        """This machine's measuring lock, held from before the study is opened until the finalists are done."""
        with machine_lock(f"study {ctx.study_name}"):
            yield Placement()

    def search(self, ctx: SearchContext, study: Study, *, trials: int | None) -> SearchOutcome:
        from tqdm import tqdm

        bar = tqdm(total=trials, desc="trials", unit="trial", file=sys.stderr, disable=not ctx.progress,
                   dynamic_ncols=True, bar_format="{desc} {n_fmt}" + ("/{total_fmt} [{elapsed}<{remaining}"
                                                                     if trials else " [{elapsed}") + "{postfix}]")
        objective = _Objective(ctx)
        n = 0
        free_in_a_row = 0  # trials answered from the study without running (duplicates, known infeasible)
        walls: list[float] = []
        stopped = ""
        ctx.compile_gate.start(ctx.budget, walls)  # the sampler holds compile back when time is short
        try:
            while trials is None or n < trials:
                # the eager search settles (converged, exhausted, or the budget's end is compile's), compile is
                # tried last on its best config, then the search stops (``phases``)
                why = phases.stop_reason(ctx, study, walls=walls, trials_left=None if trials is None else trials - n,
                                         exhausted=free_in_a_row if free_in_a_row >= EXHAUSTED_AFTER else 0)
                if why is not None:
                    stopped = why
                    break
                if ctx.out_of_time(walls):
                    break
                if (trials is None or n + 2 <= trials) and pairs.waiting_pair(ctx, study, walls) is not None:
                    numbers, own = pairs.run_pair(ctx, study)  # a decision's two repeats, paired by turns
                    ctx.after_trial(study)
                    walls += own  # each child's own time: what a trial of it costs
                    n, free_in_a_row = n + 2, 0
                    bar.update(2)
                    last = next(t for t in study.get_trials(deepcopy=False) if t.number == numbers[-1])
                    bar.set_postfix_str(_postfix(study, last, phases.status_line(ctx, study)), refresh=True)
                    continue
                t0 = time.monotonic()
                study.optimize(objective, n_trials=1, catch=(protocol.TrialError,), gc_after_trial=False)
                wall = time.monotonic() - t0  # the trial's own: the ceilings' climb after it is not a trial's wall
                # the trial just run (the highest number may be a queued one still waiting)
                last = next(t for t in study.get_trials(deepcopy=False) if t.number == objective.number)
                ctx.after_trial(study)  # the batch walk's next step, the ceilings, the on_trial callbacks
                if objective.answered:  # in no time, from earlier trials: does not use up the budget
                    free_in_a_row += 1
                    continue
                free_in_a_row = 0
                walls.append(wall)
                n += 1
                bar.update(1)
                bar.set_postfix_str(_postfix(study, last, phases.status_line(ctx, study)), refresh=True)
        finally:
            ctx.compile_gate.stop()
            bar.close()
        return SearchOutcome(n, stopped)


class _Objective:
    """The Optuna objective of one local trial: the trial protocol around ``ctx.runner``."""

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx
        self.number = -1        # the trial it is (or was last) working on
        self.answered = False   # the study answered that trial without running it

    def __call__(self, trial: Trial) -> float:
        import optuna

        ctx = self.ctx
        self.number, self.answered = trial.number, False
        config = ctx.space.suggest(trial)
        protocol.begin(trial, config, fingerprint=ctx.fingerprint)
        if sqlite_path(ctx.storage_url) is None:  # one run per SQLite study: nothing else is in flight
            self._wait_for_twin_in_flight(trial, config)
        try:
            value = protocol.answer_from_study(trial, config, fingerprint=ctx.fingerprint, limit=ctx.limit)
        except optuna.TrialPruned:
            self.answered = True  # a copy of a pruned config
            raise
        if value is not None:
            self.answered = True
            return value

        def on_window(index: int, samples_per_s: float) -> bool:
            trial.report(samples_per_s, index)
            return trial.should_prune()

        private_dir(ctx.artifacts_dir)  # made by Tuner.run; again if someone removed it meanwhile
        log_path = ctx.artifacts_dir / f"trial-{trial.number}.log"
        try:
            result = ctx.runner(ctx.workload, config, ctx.measure, on_window=on_window, log_path=log_path)
        except KeyboardInterrupt:
            trial.set_user_attr(keys.STATUS, "interrupted")
            trial.set_user_attr(keys.REASON, "the tuner was stopped during this trial")
            raise
        if result.user_error:  # wrong for every config: stop the study with the one-line reason
            trial.set_user_attr(keys.STATUS, "error")
            trial.set_user_attr(keys.REASON, result.reason)
            if result.traceback:
                trial.set_user_attr(keys.TRACEBACK, result.traceback[-4000:])
            raise protocol.workload_error(trial.number, result.reason, log_path)
        return protocol.record(trial, result, limit=ctx.limit)

    def _wait_for_twin_in_flight(self, trial: Trial, config: TrialConfig) -> None:
        """Several workers on one PostgreSQL/MySQL study: when another worker is measuring this very config
        right now, wait for it and reuse its result (``answer_from_study``) instead of measuring it twice."""
        ctx = self.ctx
        while True:
            twin = protocol.claim(trial, config, storage=ctx.storage, study_name=ctx.study_name)
            if twin is None:
                return
            trial.set_user_attr(keys.WAITED_FOR, twin.number)
            ctx.log(f"trial {trial.number}: trial {twin.number} (another worker) is measuring the same config; "
                      "waiting to reuse its result")
            if protocol.wait_for(trial.study, trial_id(twin)).name in ("COMPLETE", "PRUNED"):
                return  # ``answer_from_study`` finds it among the finished trials


def _postfix(study: Study, last: FrozenTrial, phase: str) -> str:
    parts = [f"last #{last.number} {last.user_attrs.get(keys.STATUS, last.state.name.lower())}"]
    base = baseline_value(study)
    try:
        best = study.best_trial
        parts.append(f"best {best.value:.1f}/s #{best.number}")
        if base:
            parts.append(f"x{best.value / base:.2f} vs baseline")
    except ValueError:
        pass
    return ", ".join(parts + [phase])
