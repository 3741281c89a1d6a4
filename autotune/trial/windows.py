"""The trial child's measured windows: streamed as they finish, the warm-up's tail told apart from them, and, where
the child is one of a round's children that measure by turns (``trial.lockstep``), each window taken at its turn.

Turns: on these VMs the machine's own speed moves by 10-20% within seconds, so two configs measured one after the
other differ by the machine's moment as much as by themselves. A round whose children are all alive and take short
turns (``TURN_S``, between two steps) meets the same moments in each; each child is still a fresh process (its own
level, its warm-up) and a window is still its own process's measurement: its steps over its own time, summed over its
turns. Between its turns the parent stops the child's whole process group (its DataLoader workers and OpenMP threads
too, ``trial.lockstep``): nothing it does while waiting is charged to the child whose turn it is, and its loader's
queue is where it was. The first step of each turn is not timed: after a wait the caches hold the other children's
data, and that step ran 2-10% slower than the turn's later ones (resnet18 at 32 px, batch 8 and 64, 2-core Xeon).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from autotune.trial.events import Event, Turn, Window

__all__ = ["Turns", "TurnsEnded", "TURN_S", "measure_windows", "tight"]


class TurnsEnded(Exception):
    """The parent closed the round's turns while this child waited (it is ending the round): the child ends, failed
    (its windows so far were sent as they finished)."""


# How long one turn lasts (at least one step, after its untimed first): far shorter than the machine's slow spells,
# which last seconds, so the children of a round meet the same ones, and long enough that the untimed step costs
# little. Measured on the 2-core Xeon, 2026-11-29 (docs/claims.md, "Rounds by turns"): two fresh processes of one
# config taking turns of 0.2 s differed by 2.0% (sd of the log ratio over 9 s each), of 3 s by 9.2%; one after the
# other, 7-13%.
TURN_S = 0.5


class Turns:
    """The child's side of the turns: ``wait`` tells the parent the child is at its gate (a ``Turn`` event), then
    blocks until the parent gives it the turn (one byte on the FIFO at ``path``, which the parent holds open);
    ``over`` says when the turn's ``slice_s`` is spent; ``waited_s`` is the time spent waiting, off the child's
    clock for the figures that divide by time."""

    def __init__(self, path: str, send: Callable[[Event], None], slice_s: float = TURN_S) -> None:
        self._gate = open(path, "rb", buffering=0)  # noqa: SIM115 - held for the child's life
        self._send = send
        self.slice_s = slice_s
        self.turns = 0
        self.waited_s = 0.0
        self.fresh = False  # a turn was given and its untimed first step not run yet (``_Stepper.window``)
        self._began = time.perf_counter()

    def over(self) -> bool:
        """Whether this turn's timed steps have had ``slice_s``."""
        return time.perf_counter() - self._began >= self.slice_s

    def begin(self) -> None:
        """The turn's timed steps start now (after its untimed first)."""
        self.fresh = False
        self._began = time.perf_counter()

    def wait(self) -> None:
        t0 = time.perf_counter()
        self._send(Turn(index=self.turns))
        if not self._gate.read(1):  # every writer gone: the parent is ending the round
            raise TurnsEnded("the round's parent closed the turns")
        self.turns += 1
        self._began = time.perf_counter()
        self.waited_s += self._began - t0
        self.fresh = True


def measure_windows(stepper: Any, spec: Any, warm: Any, send: Callable[[Event], None],
                    turns: Turns | None = None) -> dict:
    """The measured windows, streamed as they finish; returns the totals over them.

    The warm-up ends where the windows say it does: the first window is held until settle_windows more are in,
    and is sent as measured only if it belongs with them (measure.window_settled); if not, it was the warm-up's
    tail: it is re-labelled warm-up (its rate kept in ``warmup_windows``) and the next is judged. With ``turns``
    the windows are measured a turn at a time (``_Stepper.window``)."""
    from autotune.measure import MAX_UNSETTLED_WINDOWS, window_settled

    totals: dict[str, Any] = {"waits": [], "comps": [], "all_steps": 0, "steps": 0, "samples": 0, "spans": [],
                              "rates": []}
    held: list[dict] = []
    unsettled: list[dict] = []
    later = min(spec.settle_windows, spec.windows - 1)
    settled = later == 0
    sent = 0

    def emit(w: dict) -> None:
        nonlocal sent
        totals["steps"] += w["steps"]
        totals["samples"] += w["samples"]
        totals["waits"].append(w["data_wait_s"])
        totals["comps"].append(w["compute_s"])
        # whose steps' latencies count: the window's own time, its turns' waits out
        totals["spans"] += w.get("spans") or [(w["started"], w["started"] + w["elapsed"])]
        totals["rates"].append(w["samples_per_s"])
        send(Window(index=sent, samples_per_s=w["samples_per_s"], steps=w["steps"], data_wait_s=w["data_wait_s"],
                    compute_s=w["compute_s"], tokens_per_s=w.get("tokens_per_s"),
                    rank_samples_per_s=w.get("rank_samples_per_s")))
        sent += 1

    if turns is not None:
        turns.wait()  # the first turn: the round's next child starts only once this one is here
    while sent < spec.windows and not tight(totals["rates"], spec.tight_spread):
        w = stepper.window(spec, turns) if turns is not None else stepper.window(spec)  # DDP's lead takes no turns
        totals["all_steps"] += w["steps"] + w.get("untimed_steps", 0)
        if settled:
            if sent == 0:  # not checked: one window only, or settle_windows 0
                send(warm.event(w, unsettled, None))
            emit(w)
            continue
        held.append(w)
        if len(held) <= later:
            continue
        rates = [x["samples_per_s"] for x in held]
        confirmed = window_settled(rates[0], rates[1:], spec.settle_tolerance)
        # the warm-up's limit is on the child's own clock: the turns it waited for are not its warm-up
        if (confirmed or len(unsettled) >= MAX_UNSETTLED_WINDOWS
                or time.perf_counter() - warm.t_settle - (turns.waited_s if turns else 0.0) > spec.warmup_max_s):
            settled = True
            send(warm.event(held[0], unsettled, confirmed))
            for x in held:
                emit(x)
            held = []
        else:
            unsettled.append(held.pop(0))
    return totals


def tight(rates: list[float], spread: float) -> bool:
    """Whether the measured windows may stop before ``MeasureSpec.windows``: at least three, all within ``spread``
    of their median (the settled windows of a quiet device agree; a noisy machine's never do)."""
    if not spread or len(rates) < 3:
        return False
    mid = statistics.median(rates)
    return mid > 0 and (max(rates) - min(rates)) / mid <= spread
