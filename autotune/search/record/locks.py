"""This machine's measuring lock: one process measures at a time, whatever user, study or storage it works for
(two trials at once share the cores and spoil each other's timings).

The lock file is shared by every local user, so it sits where all can write (``/tmp``) and is treated as
hostile (docs/security.md): it is opened without following a link (``_safefs.open_lock_file``), never chmodded,
truncated or written unless this process made it, and a holder is named from the kernel's lock table
(``/proc/locks``: pid, user, command), not from the file's text, which its owner may have written. When the shared
file cannot be used safely (a link, not a plain file, unreadable), the lock falls back to one per user, in a
folder the user owns, and says so: then only this user's runs are kept apart. A lock someone else holds is
reported at once, with the holder, never waited on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from autotune._redact import redact
from autotune.machine.safefs import UnsafeFile, open_lock_file, private_dir
from autotune.errors import StorageError

__all__ = ["machine_lock", "MACHINE_LOCK_ENV", "lock_holder"]

# The machine-wide lock file; tests (and several simulated machines on one) point it elsewhere.
MACHINE_LOCK_ENV = "AUTOTUNE_MACHINE_LOCK"
# re-entrant in the holding thread: a run's trials and finalists
_machine: dict[str, Any] = {"depth": 0, "thread": None}


@contextlib.contextmanager
def machine_lock(holder: str) -> Iterator[None]:
    """Hold this machine's measuring lock, or raise a one-line StorageError naming who holds it.

    One process measures at a time on a machine, whatever study or storage it works for (PostgreSQL workers
    too: the database's locks are per study, this one is per machine). ``Tuner.run`` on the local backend takes
    it before anything is written, so a refused run leaves no trace; a Ray trial on a CPU node takes it on the
    node. ``holder`` says what this process is doing, for the refusal's message. The file is
    ``$AUTOTUNE_MACHINE_LOCK``, else ``/tmp/autotune-machine.lock`` (not ``$TMPDIR``, which may be per user or
    per sandbox); the kernel drops the lock if the holder dies."""
    if _machine["depth"] and _machine["thread"] == threading.get_ident():
        _machine["depth"] += 1
        try:
            yield
        finally:
            _machine["depth"] -= 1
        return
    fd, mine = _open_machine_lock(shared_lock_path())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(f"another autotune run is measuring on this machine ({lock_holder(fd)}); wait for "
                               "it to finish: two at once share the cores and spoil each other's timings (a "
                               f"process that never lets go: stop it, or set {MACHINE_LOCK_ENV} to a file of "
                               "yours to measure beside it)") from None
        if mine:  # a note for a refused run on a system without /proc/locks
            _note(fd, f"pid {os.getpid()}, {holder}")
        _machine["depth"], _machine["thread"] = 1, threading.get_ident()
        try:
            yield
        finally:
            _machine["depth"], _machine["thread"] = 0, None
            if mine:
                _note(fd, "")
    finally:
        os.close(fd)


def shared_lock_path() -> Path:
    """``$AUTOTUNE_MACHINE_LOCK``, else ``/tmp/autotune-machine.lock``."""
    import tempfile

    shared = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    return Path(os.environ.get(MACHINE_LOCK_ENV) or shared / "autotune-machine.lock")


def user_lock_path() -> Path:
    """The per-user lock file used when the shared one is unsafe: in ``$XDG_RUNTIME_DIR`` (a folder the login
    gives this user alone) if there is one, else in ``~/.cache/autotune``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path.home() / ".cache"
    return private_dir(base / "autotune") / "machine.lock"


def _open_machine_lock(path: Path) -> tuple[int, bool]:
    """``(fd, mine)`` of the shared lock file, else of this user's own (with a note on stderr saying why)."""
    try:
        return open_lock_file(path, 0o644)  # others need only read access to flock it
    except UnsafeFile as exc:
        why = exc.strerror
    own = user_lock_path()
    print(f"autotune: warning: not using the machine lock {path} ({why}); using {own}, which keeps apart only "
          "this user's runs", file=sys.stderr, flush=True)
    try:
        return open_lock_file(own, 0o600)
    except UnsafeFile as exc:
        raise StorageError(f"cannot use the machine lock {path} ({why}) nor {own} ({exc.strerror}); set "
                           f"{MACHINE_LOCK_ENV} to a file of yours") from None


def _note(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)


def lock_holder(fd: int) -> str:
    """Who holds the flock on open file ``fd``: ``pid N of user U: COMMAND``, from the kernel's lock table (the
    truth, whatever the file says) with what it is doing (the note it wrote, else its command line); without
    /proc/locks, the note; else "another process"."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pid = None
    with contextlib.suppress(OSError):
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == dev:  # "->" lines are waiters
                    pid = int(fields[4])
                    break
    # the holder's note, as one line of printable text (the file may be another user's, written to mislead)
    note = " ".join("".join(c for c in os.pread(fd, 400, 0).decode(errors="replace") if c.isprintable()).split())
    if pid is None:
        return note if note.startswith("pid ") else "another process"
    try:
        import psutil

        proc = psutil.Process(pid)
        what = (note.removeprefix(f"pid {pid}, ") if note.startswith(f"pid {pid}, ") else
                redact(" ".join(" ".join(proc.cmdline()).split()))[:160] or proc.name())  # one line, no password
        return f"pid {pid} of user {proc.username()}: {what}"
    except Exception:  # noqa: BLE001 - gone meanwhile, or another user's process we may not read
        return f"pid {pid}"
