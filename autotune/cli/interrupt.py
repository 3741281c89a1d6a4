"""Ctrl-C and SIGTERM for a long command: the first stops it cleanly, a second ends it at once.

The first SIGINT or SIGTERM raises ``KeyboardInterrupt`` where the command is: the trial in flight is ended (the
runner kills its tree), what finished is kept, and the command says in one line how to resume (``stopped``). While
it does that (ending a child, closing the fork servers, marking the trial interrupted), a second SIGINT or SIGTERM
ends the process at once (exit 130), after that one line if it was not said yet: its children end with it (their
parent-death signal, ``autotune.machine.proctree``), and a run stopped so is resumed as a killed one is. SIGINT is
handled even when the command was started with it ignored (``nohup``, a shell's ``&``): a supervisor's ``kill
-INT`` stops it as Ctrl-C does.

>>> with interruptible() as stop:                                # doctest: +SKIP
...     try:
...         long_work()
...     except KeyboardInterrupt:
...         stop.say("autotune run: stopped; run the same command again to resume")
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable, Iterator

__all__ = ["interruptible", "Stop", "EXIT_INTERRUPTED"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class Stop:
    """What the handlers share: whether a stop began, the line that says how to resume, and whether it was said."""

    def __init__(self, line: Callable[[], str]) -> None:
        self.line = line
        self.stopping = False
        self.said = False

    def say(self, text: str | None = None) -> None:
        """Print the one line (``text``, else ``line()``) once."""
        if not self.said:
            self.said = True
            print(text if text is not None else self.line(), file=sys.stderr, flush=True)

    def handle(self, signum: int, frame) -> None:
        if self.stopping:  # the second: now
            with contextlib.suppress(Exception):
                self.say()
            os._exit(EXIT_INTERRUPTED)
        self.stopping = True
        raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible(line: Callable[[], str] = lambda: "stopped") -> Iterator[Stop]:
    """Handle SIGINT and SIGTERM as the module docstring says while the block runs; ``line()``: the line a second
    signal prints when the block did not say one yet. The handlers in place before are restored after."""
    stop = Stop(line)
    before = {s: signal.signal(s, stop.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
