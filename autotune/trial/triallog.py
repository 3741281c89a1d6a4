"""A trial's log with a size cap: the child's stdout and stderr reach their file through a pipe, and the file keeps
the first ``LOG_HEAD_BYTES`` of what a trial printed and about the last ``LOG_TAIL_BYTES``, with one line between
them saying how much was left out. A workload that prints every step for hours fills a log, not the disk.
``scan`` reads every chunk as it passes (the parent watches the log for a DataLoader worker's error that no event
carries: ``loader_watch.LostBatchWatch``).

The cap holds on disk at every moment (at most head + tail x 2 + one line per trial run), so a tuner killed
mid-trial leaves a log within it: the bytes past the head are written as they come, and each time they reach
twice the tail the last ``LOG_TAIL_BYTES`` (from a line's start) are moved up behind the head and the file is cut
there. A log opened again (a later run's trial of the same name) keeps what it held, and the cap counts from there.

>>> with CappedLog("trial-3.log") as log:                          # doctest: +SKIP
...     proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
>>> ...; log.join()   # once the child and its descendants are gone: the file is complete
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

__all__ = ["CappedLog", "LOG_HEAD_BYTES", "LOG_TAIL_BYTES"]

LOG_HEAD_BYTES = 1 << 20  # 1 MiB: the start-up, the build, the first steps' warnings
LOG_TAIL_BYTES = 1 << 20  # 1 MiB: what the trial printed last, where a traceback is


class CappedLog:
    """The write end of a pipe (``fileno()``, for a child's stdout/stderr or a fork server) copied by a thread
    into ``path`` under the cap. ``with`` closes the parent's copy of the write end once the child is started;
    ``join()`` waits until every writer is gone and the file is complete. A write that fails (a full disk) loses
    that part of the log, never the trial: the pipe keeps being read, so the child never blocks on it."""

    def __init__(self, path: str | os.PathLike, *, head: int = LOG_HEAD_BYTES, tail: int = LOG_TAIL_BYTES,
                 scan: Callable[[bytes], None] | None = None) -> None:
        self.path = Path(path)
        self._scan = scan  # reads each chunk as it comes (``loader_watch.LostBatchWatch``); never stops the copy
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # read: the tail moves up; never through a link planted at the path (docs/security.md)
        self._fd = os.open(self.path,
                           os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o666)
        self._pos = os.lseek(self._fd, 0, os.SEEK_END)
        self._head, self._tail = head, tail
        self._head_end = self._pos + head
        self._after = 0  # bytes of output on disk past the head (and past the left-out line, once there is one)
        self.dropped = 0  # bytes of output left out so far
        self._r, self._w = os.pipe()
        self._thread = threading.Thread(target=self._copy, name=f"autotune log {self.path.name}", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._w

    def __enter__(self) -> "CappedLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close_writer()

    def close_writer(self) -> None:
        """Close this process's copy of the write end (the child and the server hold their own)."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the copy to end: every writer (the child, its descendants) has closed the pipe."""
        self.close_writer()
        self._thread.join(timeout)

    def _copy(self) -> None:
        try:
            while chunk := os.read(self._r, 65536):
                if self._scan is not None:
                    try:
                        self._scan(chunk)
                    except Exception:  # noqa: BLE001 - a reader's bug must not cost the trial its log
                        pass
                try:
                    self._write(chunk)
                except OSError:  # a full disk: this part of the log is lost; the trial goes on
                    self.dropped += len(chunk)
        finally:
            os.close(self._r)
            os.close(self._fd)

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, self._pos)
            self._pos += n
            view = view[n:]

    def _write(self, chunk: bytes) -> None:
        if self._pos < self._head_end:
            n = min(len(chunk), self._head_end - self._pos)
            self._put(chunk[:n])
            chunk = chunk[n:]
        if chunk:
            self._put(chunk)
            self._after += len(chunk)
            if self._after > 2 * self._tail:
                self._compact()

    def _compact(self) -> None:
        """Move the last ``tail`` bytes (from a line's start, when one is near) up behind the head and cut the
        file there, with the line that says how much is left out."""
        keep = os.pread(self._fd, self._tail, self._pos - self._tail)
        keep = keep[keep.find(b"\n", 0, 4096) + 1:]
        self.dropped += self._after - len(keep)
        note = (f"\n[autotune: {self.dropped} bytes of this trial's output left out here: a trial log keeps the "
                f"first {self._head} and about the last {self._tail} bytes]\n").encode()
        self._pos = self._head_end
        self._put(note + keep)
        os.ftruncate(self._fd, self._pos)
        self._after = len(keep)
