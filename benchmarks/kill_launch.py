"""`autotune` as the kill benchmark runs it: the real CLI, with each phase of a run held ``--hold`` seconds once
it is recorded in the study, before its work.

The recommendation's writing and the dashboard note take milliseconds; a kill drawn inside them (``kill_anywhere``)
can land there only if they last. How long a phase lasts is the benchmark's business, not autotune's, so the hold
is put around ``RunPhases.enter`` here (``held_phases``) and autotune itself is left as a user runs it.

    python -m benchmarks.kill_launch --hold 1.5 run --model kill_workload:build ...   # ROOT on PYTHONPATH

Run with ``-m`` from the run's folder, as ``python -m autotune.cli`` would be: that folder stays first on
``sys.path``, so ``--model kill_workload:build`` is imported from it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator, Sequence

from autotune.search.record.run_phase import RunPhases


@contextlib.contextmanager
def held_phases(seconds: float) -> Iterator[None]:
    """Within it, every ``RunPhases.enter`` that records a new phase then sleeps ``seconds`` (a phase entered again,
    which records nothing, does not); ``RunPhases`` as it was after."""
    enter = RunPhases.enter

    def enter_and_hold(self: RunPhases, phase: str) -> None:
        new = phase != self.current
        enter(self, phase)
        if new and seconds > 0:
            time.sleep(seconds)

    RunPhases.enter = enter_and_hold
    try:
        yield
    finally:
        RunPhases.enter = enter


def main(argv: Sequence[str] | None = None) -> int:
    """``--hold SECONDS`` first, then the arguments of ``autotune`` itself; its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--hold":
        print("usage: python -m benchmarks.kill_launch --hold SECONDS <autotune arguments>", file=sys.stderr)
        return 2
    from autotune.cli.main import main as autotune

    with held_phases(float(args[1])):
        return autotune(args[2:])


if __name__ == "__main__":
    sys.exit(main())
