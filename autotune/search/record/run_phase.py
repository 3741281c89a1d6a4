"""Where a run stands, kept in its study: the phase it is in, so that a run killed anywhere resumes from there.

A run passes through ``PHASES`` in order, each where it applies: the search (its trials), the ceilings' climb
(children of its own, between two search trials), the finalists' rounds, the extra rounds of two finalists in
dispute, the numerics check of the winner, its worst-case batch, the confirmation of the claim, the recommendation
(stored in the study, and written as YAML where the run was asked to), and optuna-dashboard's note. The phase is
the study's user attribute ``run_phase:<host>`` (``key``: one per machine, since several machines may run one
study on a database server, each its own run; a machine measures one run at a time)::

    {"phase": "confirmation", "pid": 4242, "since": 1764000000.0, "ask": {"trials": 3, ...},
     "stop_reason": "ran the 3 trial(s) asked for"}

written when the phase changes (a write per phase, not per trial: a phase is entered as its first child starts,
``RunPhases.around``, ``RunPhases.searching``), and removed when the run ends (``RunPhases.finish``). A run that
finds one was killed (or stopped by Ctrl-C) where it says, and ``search.plan.resume`` decides what the new run
does about it.

The run's split (``RunPhases.split``): the seconds each phase took in this run, from the budget's start (the
start-up before the first phase: the CLI's checks, the workload's probe, opening the study) to the recommendation,
each as a share of the budget (``--timeout``) or, without one, of the run: the closing lines, the YAML's
``budget_split`` and ``autotune show`` say where the time went (issue 50).

>>> PHASES[0], PHASES[-1]
('search', 'dashboard note')
>>> describe("numerics")
'the numerics check'
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record import trials as keys

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["PHASES", "AFTER_SEARCH", "STORED", "RunPhases", "describe", "read", "key", "split_line"]

# each phase and how a log line names it
_NAMES = {
    "search": "the search", "ceilings": "the ceilings' climb", "finalists": "the finalists' rounds",
    "extra rounds": "the extra finalist rounds", "numerics": "the numerics check", "worst case": "the worst-case check",
    "confirmation": "the confirmation", "recommendation": "the recommendation's writing",
    "dashboard note": "the dashboard note",
}
PHASES = tuple(_NAMES)
AFTER_SEARCH = PHASES[2:]  # the finalists' phases and after: the search was done
STORED = ("recommendation", "dashboard note")  # the recommendation is stored in the study: it stands


def describe(phase: str) -> str:
    """How the log names ``phase`` ("the confirmation"); an unknown one (a later autotune's) by its name."""
    return _NAMES.get(phase, f"the {phase}")


def key(host: str | None = None) -> str:
    """The study attribute that keeps the phase of ``host``'s run (default: this machine's)."""
    return f"{keys.RUN_PHASE}:{host or socket.gethostname()}"


def read(study: Study) -> dict[str, Any] | None:
    """The phase record of this machine's run in progress, or of one that was killed or stopped (None: every run
    ended)."""
    stored = study.user_attrs.get(key())
    return stored if isinstance(stored, dict) and stored.get("phase") else None


class RunPhases:
    """The phase of one run, kept in its study (``study()`` gives it, opened): ``enter`` records a phase when it
    changes, ``around`` wraps a runner (or a check) so its phase is entered when it is called, ``finish`` ends the
    run's record. ``ask``: what the run was asked (``begin``), kept with each record so a resume knows it is the
    same command.

    >>> phases = RunPhases(lambda: study)                          # doctest: +SKIP
    >>> run = phases.around("finalists", runner)                   # doctest: +SKIP
    """

    def __init__(self, study: Callable[[], Study]) -> None:
        self._study = study
        self.current: str | None = None
        self.extra: dict[str, Any] = {}  # kept with every record (the ask; the search's stop reason)
        # the run's clock (``split``): when it began (time.monotonic()), seconds per phase, when the current began
        self._started: float | None = None
        self._spent: dict[str, float] = {}
        self._since = 0.0
        self._resumed: str | None = None

    def begin(self, ask: dict[str, Any], *, started: float | None = None) -> dict[str, Any] | None:
        """Start this run's record (nothing is written until a phase is entered); returns the record an earlier run
        left, if it was killed or stopped before its end. ``started``: when the run began (``time.monotonic()``,
        the budget's start; default now): what passes before its first phase is its start-up (``split``)."""
        self.current, self.extra = None, {"ask": ask}
        self._started = time.monotonic() if started is None else started
        self._spent, self._since = {}, self._started
        earlier = read(self._study())
        self._resumed = earlier.get("phase") if earlier else None  # the split then says it is this run's part
        return earlier

    def split(self, *, budget_s: float | None = None) -> dict[str, Any] | None:
        """Where this run's time went so far: ``{"budget_s", "elapsed_s", "of": "budget" | "run", "phases":
        [{"phase", "s", "share"}, ...]}`` in the order of ``PHASES`` ("start-up" first), each phase's seconds from
        its first child to the next phase's (the parent's work between children counted where it happened), shares
        of ``budget_s`` where given, else of the run (``resumed_from``: the phase an earlier run of the command was
        stopped in, whose work is not in this split); None before ``begin``."""
        if self._started is None:
            return None
        now = time.monotonic()
        spent = dict(self._spent)
        spent[self.current or "start-up"] = spent.get(self.current or "start-up", 0.0) + now - self._since
        elapsed = now - self._started
        whole = budget_s or elapsed or 1.0
        order = ("start-up",) + PHASES
        rows = [{"phase": p, "s": round(spent[p], 1), "share": round(spent[p] / whole, 3)}
                for p in sorted(spent, key=lambda p: order.index(p) if p in order else len(order)) if spent[p] >= 0.05]
        return {"budget_s": budget_s, "elapsed_s": round(elapsed, 1), "of": "budget" if budget_s else "run",
                "phases": rows, **({"resumed_from": self._resumed} if self._resumed else {})}

    def keep(self, **extra: Any) -> None:
        """Keep ``extra`` (e.g. ``stop_reason``) with this and every later record of the run."""
        self.extra.update(extra)
        if self.current is not None:
            self._write(self.current)

    def enter(self, phase: str) -> None:
        """Record that the run is in ``phase`` now (nothing when it already is)."""
        if phase == self.current:
            return
        if self._started is not None:  # the phase left ends now (``split``)
            now, left = time.monotonic(), self.current or "start-up"
            self._spent[left] = self._spent.get(left, 0.0) + now - self._since
            self._since = now
        self.current = phase
        self._write(phase)

    def around(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (a runner, a check) entering ``phase`` each time it is called, before it runs."""
        def entered(*args: Any, **kwargs: Any) -> Any:
            self.enter(phase)
            return fn(*args, **kwargs)

        return entered

    def searching(self, runner: Callable[..., Any]) -> Callable[..., Any]:
        """The search's ``runner``: a trial enters the search, a ceiling's child (a run that measures one part of
        the pipeline, ``MeasureSpec.part`` "model" or "data") the ceilings' climb."""
        def run(workload: Any, config: Any, measure: Any, **kwargs: Any) -> Any:
            self.enter("search" if getattr(measure, "part", "full") == "full" else "ceilings")
            return runner(workload, config, measure, **kwargs)

        return run

    def finish(self, rec: Any, *, note: Callable[[], Any], yaml_path: Any = None) -> Any:
        """End the run: the recommendation stored (``rec``, None for none) is written to ``yaml_path`` as well,
        optuna-dashboard's note (``note()``), and the run's record goes, with any finalists' rounds left (the
        recommendation that used them is stored). Returns ``rec``."""
        self.enter("recommendation")
        if rec is not None and yaml_path is not None:
            rec.to_yaml(yaml_path)
        self.enter("dashboard note")
        note()
        study = self._study()
        if study.user_attrs.get(keys.FINALIST_ROUNDS) is not None:
            study.set_user_attr(keys.FINALIST_ROUNDS, None)
        study.set_user_attr(key(), None)
        self.current = None
        return rec

    def _write(self, phase: str) -> None:
        record = {"phase": phase, "pid": os.getpid(), "since": round(time.time(), 3), **self.extra}
        self._study().set_user_attr(key(), record)


# how the split names a phase in one line
_SHORT = {"start-up": "start-up", "search": "search", "ceilings": "ceilings", "finalists": "finalists",
          "extra rounds": "extra rounds", "numerics": "numerics check", "worst case": "worst case",
          "confirmation": "confirmation", "recommendation": "writing", "dashboard note": "dashboard note"}


def split_line(split: dict[str, Any] | None) -> str:
    """The run's split (``RunPhases.split``) in one line; "" without one.

    >>> split_line({"budget_s": 600.0, "elapsed_s": 590.0, "of": "budget", "phases": [
    ...     {"phase": "start-up", "s": 9.0, "share": 0.015}, {"phase": "search", "s": 400.0, "share": 0.667},
    ...     {"phase": "confirmation", "s": 181.0, "share": 0.302}]})
    'the 600 s budget went to: start-up 9 s (2%), search 400 s (67%), confirmation 181 s (30%); 590 s in all'
    """
    if not split or not split.get("phases"):
        return ""
    parts = ", ".join(f"{_SHORT.get(r['phase'], r['phase'])} {r['s']:.0f} s ({100 * r['share']:.0f}%)"
                      for r in split["phases"])
    head = (f"the {split['budget_s']:.0f} s budget went to" if split.get("of") == "budget"
            else "the run's time went to")
    if split.get("resumed_from"):  # what the run stopped there spent is not in it
        head = (f"this run, resumed from {describe(split['resumed_from'])}: "
                + head.replace("the run's time", "its time").replace(" budget went to", " budget: its part went to"))
    return f"{head}: {parts}; {split['elapsed_s']:.0f} s in all"
