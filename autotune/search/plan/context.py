"""What the tuner hands the parts it drives, instead of itself: frozen, named and typed, built once per step.

``Tuner.run`` builds a ``ConnectContext`` for the backend's ``connect`` (before the study is opened), applies the
``Placement`` it yields (where the trials run: another cap, other hardware, the finalists' runner), then builds
one ``SearchContext`` for the backend's ``search`` and the phases (``phases``) and reads its ``SearchOutcome``;
``Tuner.finalize`` builds a ``finalists.FinalistContext`` for ``finalists.choose`` (beside it: the planned
search, which this module's types name, imports the finalists). Nothing here writes to the tuner:
what a part decides comes back as a value, and what it may ask of the tuner's state (the plan, convergence, the
numerics check's expected time, what follows a trial) is a named callable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage

    from autotune.config import MeasureSpec, TrialResult, Workload
    from autotune.machine.hardware import Hardware
    from autotune.search.budget import Budget
    from autotune.search.plan.compile_gate import CompileGate
    from autotune.search.plan.convergence import Convergence
    from autotune.search.plan.coordinate import Plan
    from autotune.search.plan.pruning import NoHopePruner
    from autotune.search.space.search_space import SearchSpace
    from autotune.search.record.trials import MemoryLimit

__all__ = ["ConnectContext", "Placement", "SearchContext", "SearchOutcome", "Log", "Runner"]

Log = Callable[[str], None]
# What runs one trial: ``runner(workload, config, measure, *, on_window=None, log_path=None) -> TrialResult``
# (``autotune.trial.runner.run_trial``: a fresh child process, watched by this one).
Runner = Callable[..., "TrialResult"]


@dataclass(frozen=True)
class ConnectContext:
    """What a backend's ``connect`` knows before the study is opened: this machine, the workload, the measurement
    and whether the user chose its caps (a chosen cap binds everywhere; a default one is this machine's)."""

    workload: Workload
    hardware: Hardware
    measure: MeasureSpec
    cap_given: bool
    device_cap_given: bool
    study_name: str
    log: Log


@dataclass(frozen=True)
class Placement:
    """Where the trials run, as ``connect`` found it. ``measure``: the measurement under the caps of the place
    (None: this machine's, unchanged); ``hardware``: the trial machines when they are unlike this one (None: this
    machine), then the study is theirs; ``runner``: the finalists' runner there (None: ``Tuner.runner`` here);
    ``where``: the place, for the log."""

    measure: MeasureSpec | None = None
    hardware: Hardware | None = None
    runner: Runner | None = None
    where: str = ""


@dataclass(frozen=True)
class SearchOutcome:
    """What a backend's ``search`` returns: how many search trials it ran, and why it stopped when a phase ended
    it (``phases.stop_reason``; "" when the trial count or the time budget did)."""

    trials_run: int
    stop_reason: str = ""


@dataclass(frozen=True)
class SearchContext:
    """Everything a backend's ``search`` (and ``phases``) reads, fixed for the run once the study is open.

    The callables are the tuner's state that moves during the search: ``after_trial(study)`` (each backend calls
    it after every finished trial: the planned search's next trials, the ``on_trial`` callbacks),
    ``out_of_time(walls)`` (within ``budget``), ``plan(study)``, ``convergence(study)`` and
    ``numerics_check_s(study)``. ``budget`` is the run's time budget (``search.budget.Budget``: its end, what the
    phases after the search keep back). ``compile_gate`` is the one object a search starts and stops
    (``start``/``stop``)."""

    workload: Workload
    space: SearchSpace
    measure: MeasureSpec
    limit: MemoryLimit
    fingerprint: str
    study_name: str
    storage_url: str
    storage: BaseStorage
    artifacts_dir: Path
    runner: Runner
    compile_gate: CompileGate
    pruner: NoHopePruner
    seed: int | None
    startup_trials: int
    patience: int | None
    finalists: int
    finalist_rounds: int
    progress: bool
    log: Log
    budget: Budget
    after_trial: Callable[[Study], None]
    out_of_time: Callable[[list[float]], bool]
    plan: Callable[[Study], Plan | None]
    convergence: Callable[[Study], Convergence]
    numerics_check_s: Callable[[Study], float]
    # whether two search trials' configs may run again as a pair by turns (``backends.pairs``); None: never
    pair_by_turns: Callable[[list], bool] | None = None
