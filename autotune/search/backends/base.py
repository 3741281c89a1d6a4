"""The backend interface: where a study's search trials run.

``Tuner.run`` owns the study's life: it opens and checks the study, takes the run lock, queues the first trials
and the retries, hands the search to a backend, and re-measures the finalists. A backend owns only the search:
asking Optuna for trials, running them, and recording each through the trial protocol
(``search.backends.protocol``), the same functions for every backend. It never sees the tuner: it reads a frozen
context (``autotune.search.plan.context``) and answers with values (a ``Placement``, a ``SearchOutcome``).
"""

from __future__ import annotations

import abc
import contextlib
from typing import TYPE_CHECKING, Iterator

from autotune.search.plan.context import ConnectContext, Placement, SearchContext, SearchOutcome

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["SearchBackend"]


class SearchBackend(abc.ABC):
    """Runs a study's search trials. Subclass it and implement ``search``.

    Like Optuna's ``BaseSampler``, the one abstract method says what it may assume and what it must do;
    ``connect`` is an optional hook with a do-nothing default.
    """

    def __init__(self, *, address: str | None = None) -> None:
        self.address = address  # the cluster to join, for backends that have one

    @abc.abstractmethod
    def search(self, ctx: SearchContext, study: Study, *, trials: int | None) -> SearchOutcome:
        """Run up to ``trials`` more search trials (None: no count limit) into ``study``; return how many ran, and
        why the search stopped when a phase ended it (``phases.stop_reason``).

        May assume: ``study`` is the tuner's study, opened and checked against this hardware; ``ctx`` describes
        it; the run lock is held; the baseline, the likely winner, the first batch-walk steps and the retries of
        interrupted trials are queued. ``ctx.budget`` is the run's time budget (``search.budget.Budget``; its
        ``deadline`` is None without one).

        Must: record every trial through ``search.backends.protocol`` (``begin``; ``claim`` where several trials of
        the study may run at once; ``answer_from_study``; ``record``), run each measured trial with a fresh child
        process (``ctx.runner`` locally, or the same runner on another machine), call ``ctx.after_trial(study)``
        after each finished trial, start no trial once ``ctx.out_of_time(walls)`` says the
        finalists need the time left, and leave no trial RUNNING when it returns or raises (``KeyboardInterrupt``
        included): an unfinished trial is failed with status ``interrupted`` so a re-run re-queues it. A trial that says
        the workload itself is wrong (``TrialResult.user_error``) stops the search with ``WorkloadError``.
        Must not re-measure the finalists: the tuner does.
        """

    @contextlib.contextmanager
    def connect(self, ctx: ConnectContext) -> Iterator[Placement]:
        """Set up where trials run, before the study is opened, and tear it down after the finalists.
        ``Tuner.run`` always enters it around ``search``; a backend may rely on that.

        Yields where the trials run (``Placement``): the default, this machine as it is. When trials run on other
        machines than this one, the placement names their hardware (the study becomes theirs), the caps they run
        under and the runner for the finalists there."""
        yield Placement()
