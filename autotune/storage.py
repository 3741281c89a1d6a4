"""Where studies live: open an Optuna storage, name a study, the locks that keep runs apart, where files go.

``open_storage`` turns a URL into an Optuna ``RDBStorage`` or a one-line ``StorageError``. ``machine_lock``
keeps a second measuring process off this machine (two trials at once share its cores and spoil each other's
timings), ``run_lock`` a second ``autotune run`` off a SQLite study, and ``server_lock`` serialises
check-then-write steps across the workers of one PostgreSQL/MySQL study. ``artifacts_dir`` is where a study's logs and reports go.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterator

from .config import Workload
from .errors import StorageError

__all__ = ["DEFAULT_STORAGE", "open_storage", "open_existing_storage", "check_storage", "sqlite_path", "study_name_for",
           "artifacts_dir", "run_lock", "server_lock", "machine_lock", "MACHINE_LOCK_ENV"]

DEFAULT_STORAGE = "sqlite:///trials/autotune.db"


def study_name_for(workload: Workload, fingerprint: str) -> str:
    """``resnet18-train-224px-synthetic-cpu-<fingerprint>``: one study per workload and hardware; a global
    batch is part of the workload (``...-cpu-gb256-<fingerprint>``)."""
    model = re.sub(r"[^A-Za-z0-9_.]+", ".", workload.model)
    if workload.data_dir is not None:
        data = "-data." + re.sub(r"[^A-Za-z0-9_]+", "_", Path(workload.data_dir).name)
    else:
        data = "" if workload.is_callable else "-synthetic"
    gb = f"-gb{workload.global_batch}" if workload.global_batch else ""
    return (f"{model}-{workload.task}-{workload.size_label}{data}-{workload.device.replace(':', '')}{gb}"
            f"-{fingerprint}")


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL; None for a database server."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


def artifacts_dir(url: str, study_name: str) -> Path:
    """Where a study's files (trial logs, Ray's files, reports, traces) live: beside its SQLite database,
    else under ``trials/`` in the working directory."""
    db = sqlite_path(url)
    return (db.parent if db is not None else Path("trials")) / study_name


def open_existing_storage(url: str | None = None):
    """``(storage, url)`` for a storage that must already hold studies (show, export, report, dashboard): a
    missing SQLite file is a one-line StorageError instead of a new empty database."""
    url = url or DEFAULT_STORAGE
    db = sqlite_path(url)
    if db is not None and not db.exists():
        raise StorageError(f"no study database at {db}: run `autotune run` first, or point --storage at it")
    check_storage(url)  # a damaged file is said as such, first
    return open_storage(url, create_dirs=False), url


def open_storage(url: str | None = None, *, create_dirs: bool = True):
    """An Optuna RDBStorage for ``url`` (default ``sqlite:///trials/autotune.db``), or a one-line StorageError.

    SQLite waits up to 60 s for a lock held by another process instead of failing. Other databases get
    heartbeats, so a trial whose worker died is failed and retried by a live worker.
    """
    import optuna

    url = url or DEFAULT_STORAGE
    db = sqlite_path(url)
    if db is not None:
        if create_dirs:
            _database_folder(db)
        elif db.parent.exists() and not os.access(db.parent, os.W_OK):
            raise StorageError(f"cannot write to {db.parent}: pick a writable folder with --storage sqlite:///DIR/autotune.db")
        kwargs: dict[str, Any] = {"engine_kwargs": {"connect_args": {"timeout": 60}}}
    elif url.startswith(("sqlite:", "postgresql", "mysql")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeats and the retry callback are marked experimental
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            kwargs = {"heartbeat_interval": _env_seconds("AUTOTUNE_HEARTBEAT_S", 30),
                      "grace_period": _env_seconds("AUTOTUNE_GRACE_S", 120)}
            if retry is not None:  # Optuna >= 4.9 renamed the callback and its argument
                kwargs["heartbeat_stale_trial_callback"] = retry(max_retry=2)
            else:  # pragma: no cover - older Optuna
                kwargs["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry=2)
    else:
        raise StorageError(f"storage URL {url!r} is not supported: use sqlite:///PATH.db or "
                           "postgresql://user@host/db (any SQLAlchemy URL Optuna accepts)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.storages.RDBStorage(_with_driver(url), **kwargs)
    except ImportError as exc:
        raise StorageError(f"storage {url!r} needs a database driver: {exc} "
                           '(for PostgreSQL: pip install "autotune[postgres]")') from None
    except Exception as exc:  # sqlalchemy ArgumentError / OperationalError: bad URL or unreachable server
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open storage {url!r}: {first}") from None


def _database_folder(db: Path) -> None:
    """Create the folder of SQLite database ``db`` if needed, or a one-line StorageError if it cannot hold it."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {db.parent} for the study database: {exc.strerror}") from None
    if not os.access(db.parent, os.W_OK):
        raise StorageError(f"cannot write to {db.parent}: pick a writable folder with --storage sqlite:///DIR/autotune.db")


def _with_driver(url: str) -> str:
    """``postgresql://`` names no driver, and SQLAlchemy 2.1 then wants psycopg 3; ``autotune[postgres]``
    installs psycopg2, so a bare URL uses whichever of the two is installed (psycopg 3 first)."""
    if url.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def _env_seconds(name: str, default: int) -> int:
    """A whole number of seconds from the environment (Optuna wants ints), e.g. AUTOTUNE_HEARTBEAT_S=1 in tests."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise StorageError(f"{name}={raw!r} is not a number of seconds (e.g. {name}={default})") from None
    if value < 1:
        raise StorageError(f"{name}={raw!r} must be at least 1 second")
    return value


def check_storage(url: str | None = None) -> None:
    """Say at once, in one line, that a storage cannot be used (a command says it before anything else), and
    write nothing: a database server is connected to and let go (no schema is made); an existing SQLite file is
    checked for damage (``PRAGMA quick_check``, read-only). A SQLite file that does not exist yet is fine."""
    url = url or DEFAULT_STORAGE
    db = sqlite_path(url)
    if db is not None:
        if db.is_file():
            _check_sqlite_file(db)
        return
    if not url.startswith(("sqlite:", "postgresql", "mysql")):
        return  # open_storage says which forms are accepted
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(_with_driver(url))
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except ImportError as exc:
        raise StorageError(f"storage {url!r} needs a database driver: {exc} "
                           '(for PostgreSQL: pip install "autotune[postgres]")') from None
    except Exception as exc:  # sqlalchemy ArgumentError / OperationalError: bad URL or unreachable server
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"cannot open storage {url!r}: {first}") from None


def _check_sqlite_file(db: Path) -> None:
    import sqlite3

    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        verdict = str(exc)
    if verdict != "ok":
        raise StorageError(f"the study database {db} is damaged ({verdict.splitlines()[0]}): restore it from a "
                           "backup, or save what is readable with `sqlite3 FILE .recover | sqlite3 NEW.db`")


@contextlib.contextmanager
def server_lock(storage, study_name: str) -> Iterator[None]:
    """The lock of study ``study_name`` shared by every worker of a PostgreSQL/MySQL study (a server-side advisory lock), held around
    check-then-write steps that must not interleave across machines (queue the baseline once, re-queue an
    interrupted trial once, queue a batch-walk step once, claim a config). SQLite needs none: one run per
    SQLite study (``run_lock``). The server releases the lock if the holder dies."""
    engine = getattr(storage, "engine", None)
    dialect = engine.dialect.name if engine is not None else ""
    if dialect not in ("postgresql", "mysql"):
        yield
        return
    import hashlib

    from sqlalchemy import text

    key = int.from_bytes(hashlib.sha256(f"autotune:{study_name}".encode()).digest()[:8], "big", signed=True)
    lock, unlock, params = (("SELECT pg_advisory_lock(:k)", "SELECT pg_advisory_unlock(:k)", {"k": key})
                            if dialect == "postgresql" else
                            ("SELECT GET_LOCK(:n, 600)", "SELECT RELEASE_LOCK(:n)", {"n": f"autotune{key}"[:64]}))
    with engine.connect() as conn:
        conn.execute(text(lock), params)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text(unlock), params)
            conn.commit()


@contextlib.contextmanager
def run_lock(storage_url: str, study_name: str) -> Iterator[None]:
    """One `autotune run` per SQLite study: a second one is refused clearly instead of corrupting timings
    (two trials on one machine share its cores) or the trial bookkeeping."""
    db = sqlite_path(storage_url)
    if db is None:
        yield
        return
    _database_folder(db)
    lock_path = db.parent / f".{db.name}.{study_name}.lock"
    fh = open(lock_path, "w")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(
                f"another autotune run is already working on study {study_name!r} in {db} on this machine; "
                "wait for it to finish (two runs would share the cores and spoil each other's timings)"
            ) from None
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()


# The machine-wide lock file; tests (and several simulated machines on one) point it elsewhere.
MACHINE_LOCK_ENV = "AUTOTUNE_MACHINE_LOCK"
_machine: dict[str, Any] = {"depth": 0, "thread": None}  # re-entrant in the holding thread: a run's trials and finalists


@contextlib.contextmanager
def machine_lock(holder: str) -> Iterator[None]:
    """Hold this machine's measuring lock, or raise a one-line StorageError naming who holds it.

    One process measures at a time on a machine, whatever study or storage it works for (PostgreSQL workers
    too: the database's locks are per study, this one is per machine). ``Tuner.run`` on the local backend takes
    it before anything is written, so a refused run leaves no trace; a Ray trial on a CPU node takes it on the
    node. ``holder`` says what this process is doing, for the refusal's message. The file is
    ``$AUTOTUNE_MACHINE_LOCK``, else ``/tmp/autotune-machine.lock`` (not ``$TMPDIR``, which may be per user or
    per sandbox), made readable and writable by every user (flock needs only read access, so another user's
    file still locks); the kernel drops the lock if the holder dies."""
    import tempfile
    import threading

    if _machine["depth"] and _machine["thread"] == threading.get_ident():
        _machine["depth"] += 1
        try:
            yield
        finally:
            _machine["depth"] -= 1
        return
    shared = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    path = Path(os.environ.get(MACHINE_LOCK_ENV) or shared / "autotune-machine.lock")
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            with contextlib.suppress(OSError):  # the umask narrowed it: another user must still open it
                os.fchmod(fd, 0o666)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise StorageError(f"cannot open the machine lock {path}: {exc.strerror}; set {MACHINE_LOCK_ENV} to a "
                           "file this user can open") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = os.pread(fd, 400, 0).decode(errors="replace").strip() or "another process"
            raise StorageError(f"another autotune run is measuring on this machine ({who}); wait for it to "
                               "finish: two at once share the cores and spoil each other's timings") from None
        with contextlib.suppress(OSError):  # read-only (another user's file): the lock holds, the note is skipped
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, {holder}".encode(), 0)
        _machine["depth"], _machine["thread"] = 1, threading.get_ident()
        try:
            yield
        finally:
            _machine["depth"], _machine["thread"] = 0, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)

