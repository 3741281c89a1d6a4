"""What a run does about an earlier run of its study that was killed or stopped (``search.record.run_phase``).

The same command run again goes on from the phase the earlier run was in, and says so in one line:

- in the search or the ceilings' climb: the search goes on (its finished trials are kept, the one in flight is
  retried, the climb is measured again);
- in the finalists' rounds, their extra rounds, the numerics check, the worst-case check or the confirmation: the
  search is done and kept, no trial is run; the finalists are planned again (with ``--timeout`` from this run's own
  budget, so they may be other finalists or other rounds) and take from the study what the killed run finished and
  the new plan shares (``finalist_rounds.SavedRounds``: whole rounds of this plan's finalists, a config's check); the
  finalists' log says exactly which, so this line promises no more; the phase that was cut short runs again (a
  confirmation whole: its rounds pair runs of one moment, and one cut short has no pair);
- once the recommendation was stored: it stands; what follows it (its YAML, the dashboard note) is done again.

Another command (another ``--trials`` or ``--timeout``, another backend) is another run: it starts with the search,
and says why it does not resume.

>>> resume(None, ask={"trials": 3}).search
True
>>> r = resume({"phase": "confirmation", "ask": {"trials": 3}, "pid": 7, "since": 0.0,
...             "stop_reason": "ran the 3 trial(s) asked for"}, ask={"trials": 3}, now=90.0)
>>> r.search, r.finalize
(False, True)
>>> r.line.split(": ")[0]
'resuming the run (pid 7) stopped 2 min ago during the confirmation'
>>> r.line.split("; ")[-1]
'the confirmation runs again, whole'
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from autotune.search.record.run_phase import AFTER_SEARCH, PHASES, STORED, RunPhases, describe

__all__ = ["Resume", "resume", "begin"]


@dataclass(frozen=True)
class Resume:
    """What this run does: search (``search``), then the finalists to the recommendation (``finalize``); the one
    line that says it resumes (empty for a run that does not), and the stopped search's reason, kept."""

    search: bool = True
    finalize: bool = True
    line: str = ""
    stop_reason: str = ""


# what happens to the phase a run was stopped in (the phases before it are kept whole)
_GOES_ON = {
    "finalists": "the finalists' rounds go on",
    "extra rounds": "the extra finalist rounds go on",
    "numerics": "the numerics check runs again",
    "worst case": "the worst-case check runs again",
    "confirmation": "the confirmation runs again, whole",
}
# what the finalists keep: only what this run's plan shares with the killed run's (said as they start)
_KEPT = "the finalists' runs it finished are kept where this run's plan shares them (the finalists say which)"


def _ago(since: Any, now: float) -> str:
    if not isinstance(since, (int, float)):
        return "earlier"
    s = max(0.0, now - since)
    return f"{s:.0f} s ago" if s < 90 else f"{s / 60:.0f} min ago" if s < 5400 else f"{s / 3600:.1f} h ago"


def resume(stored: dict[str, Any] | None, *, ask: dict[str, Any], now: float | None = None) -> Resume:
    """The decision for a run asked ``ask`` (``--trials``, ``--timeout``, the backend), given the record an earlier
    run left (``run_phase.read``; None: it ended)."""
    if not stored:
        return Resume()
    phase = stored.get("phase")
    who = f"the run (pid {stored.get('pid', '?')}) stopped {_ago(stored.get('since'), now or time.time())} during " \
          f"{describe(phase)}"
    if stored.get("ask") != ask or phase not in PHASES:
        why = "another budget was asked" if phase in PHASES else "a phase this autotune does not know"
        return Resume(line=f"not resuming {who}: {why}; this run starts with the search (finished trials are kept)")
    if phase in STORED:
        return Resume(search=False, finalize=False, stop_reason=stored.get("stop_reason", ""),
                      line=f"resuming {who}: its recommendation was stored and stands; what follows it is done again")
    if phase in AFTER_SEARCH:
        stopped = stored.get("stop_reason")
        kept = f"its search is kept (it stopped: {stopped})" if stopped else "its search is kept"
        return Resume(search=False, stop_reason=stopped or "",
                      line=f"resuming {who}: {kept}; {_KEPT}; {_GOES_ON[phase]}")
    return Resume(line=f"resuming {who}: the search goes on (finished trials are kept, the one in flight is retried)")


def begin(phases: RunPhases, *, ask: dict[str, Any], log: Any, started: float | None = None) -> Resume:
    """Start a run's record (``phases``) asked ``ask``: the decision about the record an earlier run left, its one
    line said (``log``), the stopped search's reason kept with this run's records; a run that searches is in the
    search from now on (before it queues anything: a kill then resumes the search). ``started``: when the run began
    (its start-up counts from there, ``RunPhases.split``)."""
    then = resume(phases.begin(ask, started=started), ask=ask)
    if then.line:
        log(then.line)
    phases.keep(stop_reason=then.stop_reason)
    if then.search:
        phases.enter("search")
    return then
