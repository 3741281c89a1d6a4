"""One round of several configs measured by turns: each in a fresh child of its own, all alive, taking short turns
(``trial.windows.TURN_S``, between two steps), so the configs a round compares meet the same moments of the machine.

Why: a round compares configs on a machine whose speed moves. On the 2-core VMs here one config's rate moves 10-20%
within seconds, in spells that last seconds; run one after the other, each config's run meets other spells, and the
round's ratio carries them (two fresh processes of one config: 7-15% apart, sd of the log ratio). Taking turns of
half a second, they meet the same spells (3.1% apart; ``benchmarks/lockstep.py``, docs/claims.md). Each child is
still a fresh process with its own warm-up and level, so the round stays the unit of repetition and every interval
over rounds keeps its meaning.

How: the children start one at a time, each after the one before is at its first gate (start-up, imports and the
first step never share the cores). Then the turns: the parent gives one child its turn (``SIGCONT`` to its process
group, one byte on its FIFO), waits until it is at its gate again (its ``Turn`` event) or has ended, stops its whole
process group (``SIGSTOP``: the DataLoader workers' prefetching and the OpenMP threads' spinning do not run into the
next child's turn) and gives the next child its turn. The child's side is ``trial.windows.Turns``; each child is
watched by its own ``runner.run_trial`` in a thread (the memory cap, the time limit without the time it was stopped,
the kill), and nothing in the parent times anything.

Only on one machine's CPU, one process per trial: a GPU's memory would hold every child's model at once, and DDP
ranks are process groups of their own. The callers decide (``search.choose.finalist_rounds.turns_fit``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from autotune.trial.windows import TURN_S

__all__ = ["Gate", "run_round", "available"]

_POLL_S = 0.5  # how often the round looks again at a child it waits for (its thread may have ended)


class Gate:
    """One child's place in a round (the parent's side): its FIFO, its process group, whether it is at its gate
    (stopped), running, or ended (final), and how long it has been stopped."""

    def __init__(self, path: Path, changed: threading.Condition, aborted: threading.Event,
                 turn_s: float = TURN_S) -> None:
        self.path, self.turn_s = path, turn_s
        os.mkfifo(path, 0o600)
        self._fd = os.open(path, os.O_RDWR)  # held: the child's open does not block, and it reads EOF once closed
        self._changed, self._aborted = changed, aborted
        self.pid: int | None = None
        self.state = "starting"  # -> waiting <-> running -> ended
        self._stopped_at: float | None = None
        self._stopped_s = 0.0

    # --- from the child's watcher (``runner.run_trial``, in the child's thread) ---
    def started(self, pid: int) -> None:
        with self._changed:
            self.pid = pid
        if self._aborted.is_set():  # the round ended while this child was being launched
            self._signal(signal.SIGKILL)

    def at_gate(self) -> None:
        """The child said it is at its gate: stop its group until its next turn."""
        with self._changed:
            if self.state == "ended":
                return
            self._signal(signal.SIGSTOP)
            self._stopped_at = time.monotonic()
            self.state = "waiting"
            self._changed.notify_all()

    def ended(self) -> None:
        with self._changed:
            self._resume_clock()
            self.state = "ended"
            self._changed.notify_all()

    def stopped_s(self) -> float:
        """The time the child spent stopped, so far (off its time limit)."""
        with self._changed:
            return self._stopped_s + (time.monotonic() - self._stopped_at if self._stopped_at is not None else 0.0)

    # --- from the round ---
    def give_turn(self) -> bool:
        """Continue the child and give it one turn; False (nothing done) unless it is at its gate."""
        with self._changed:
            if self.state != "waiting":
                return False
            self._resume_clock()
            self.state = "running"
            self._signal(signal.SIGCONT)
        os.write(self._fd, b"t")
        return True

    def kill(self) -> None:
        with self._changed:
            if self.state != "ended":
                self._signal(signal.SIGKILL)

    def close(self) -> None:
        """End the turns: the FIFO goes first (a child that has not opened it yet cannot block on it), then the
        parent's end (a child still waiting reads EOF and ends); its group is continued so that it can."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with self._changed:
            if self.state != "ended":
                self._signal(signal.SIGCONT)

    def _resume_clock(self) -> None:
        if self._stopped_at is not None:
            self._stopped_s += time.monotonic() - self._stopped_at
            self._stopped_at = None

    def _signal(self, sig: int) -> None:
        """To the child's group (it and its DataLoader workers); never once it ended (its pid may be reused)."""
        if self.pid is not None and self.state != "ended":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)


def run_round(configs: list[Any], run: Callable[[int, Gate], Any], *, turn_s: float = TURN_S) -> list[Any]:
    """Each of ``configs`` run by ``run(i, gate)`` (a trial runner of ``configs[i]`` given the gate, returning its
    result) in a thread of its own, started one at a time, then measured by turns (module docstring). Returns the
    results in the order of ``configs``; an exception a run raised (a config no child could run) is raised after the
    round. A child that ends at any point (failed, killed over its cap or time limit) leaves the others to go on.
    ``turn_s``: how long a turn lasts (at least one step)."""
    changed, aborted = threading.Condition(), threading.Event()
    results: list[Any] = [None] * len(configs)
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="autotune-turns-") as folder:  # 0700: no other user's FIFO
        gates = [Gate(Path(folder) / f"turn-{i}", changed, aborted, turn_s) for i in range(len(configs))]

        def one(i: int) -> None:
            try:
                results[i] = run(i, gates[i])
            except BaseException as exc:  # noqa: BLE001 - raised in the round's thread, after the round
                errors.append(exc)
            finally:
                gates[i].ended()

        threads = [threading.Thread(target=one, args=(i,), name=f"autotune turn {i}", daemon=True)
                   for i in range(len(configs))]
        try:
            for t, g in zip(threads, gates):
                t.start()
                _until_still(g, t, changed)
            while live := [(g, t) for g, t in zip(gates, threads) if g.state == "waiting"]:
                for g, t in live:
                    if g.give_turn():
                        _until_still(g, t, changed)
        except BaseException:  # Ctrl-C, SIGTERM: no child outlives the round (each watcher reaps its own)
            aborted.set()
            for g in gates:
                g.kill()
            raise
        finally:
            for g in gates:
                g.close()
            for t in threads:
                if t.ident is not None:  # started
                    t.join()
            _trim_servers()
    if errors:
        raise errors[0]
    return results


@functools.cache
def available() -> bool:
    """Whether rounds by turns can run on this machine at all: signals that stop and continue a process group, and
    a FIFO in the temp folder (some filesystems have none, and some platforms neither); where not, the callers run
    a round's configs one after the other (``search.choose.finalist_rounds.turns_possible``)."""
    if not (hasattr(signal, "SIGSTOP") and hasattr(os, "mkfifo")):
        return False
    try:
        with tempfile.TemporaryDirectory(prefix="autotune-turns-") as folder:
            os.mkfifo(Path(folder) / "probe", 0o600)
    except OSError:
        return False
    return True


def _until_still(gate: Gate, thread: threading.Thread, changed: threading.Condition) -> None:
    """Until ``gate``'s child is at its gate or has ended (its thread done, whatever it said)."""
    with changed:
        while gate.state not in ("waiting", "ended") and thread.is_alive():
            changed.wait(_POLL_S)


def _trim_servers() -> None:
    """The fork servers a round started beside each other (one per child alive), back to the pool's size."""
    from autotune.trial.forkserver import default_servers

    with contextlib.suppress(Exception):
        default_servers().trim()
