"""Where studies live: open an Optuna storage, name a study, the locks that keep runs apart, where files go.

``open_storage`` turns a URL into an Optuna ``RDBStorage`` or a one-line ``StorageError``. ``machine_lock``
(``search.record.locks``) keeps a second measuring process off this machine (two trials at once share its cores and
spoil each other's timings), ``run_lock`` a second ``autotune run`` off a SQLite study, and ``server_lock`` serialises
check-then-write steps across the workers of one PostgreSQL/MySQL study. ``artifacts_dir`` is where a study's logs and
reports go.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterator

from autotune._redact import redact
from autotune.machine.safefs import UnsafeFile, open_lock_file
from autotune.config import Workload
from autotune.errors import ConfigError, StorageError
from autotune.search.record.locks import MACHINE_LOCK_ENV, machine_lock

__all__ = ["DEFAULT_STORAGE", "open_storage", "open_study", "open_existing_storage", "check_storage", "sqlite_path",
           "study_name_for", "check_study_name", "folder_name", "artifacts_dir", "run_lock", "server_lock",
           "machine_lock", "MACHINE_LOCK_ENV"]

DEFAULT_STORAGE = "sqlite:///trials/autotune.db"


def study_name_for(workload: Workload, fingerprint: str) -> str:
    """``resnet18-train-224px-synthetic-cpu-<fingerprint>``: one study per workload and hardware; a global
    batch is part of the workload (``...-cpu-gb256-<fingerprint>``), and so is a world size (``...-cpu-x2-...``)."""
    model = re.sub(r"[^A-Za-z0-9_.]+", ".", workload.model)
    if workload.data_dir is not None:
        data = "-data." + re.sub(r"[^A-Za-z0-9_]+", "_", Path(workload.data_dir).name)
    else:
        data = "" if workload.is_callable else "-synthetic"
    gb = f"-gb{workload.global_batch}" if workload.global_batch else ""
    gb += f"-x{workload.nproc_per_node}" if workload.nproc_per_node > 1 else ""  # N ranks: never one process's study
    return (f"{model}-{workload.task}-{workload.size_label}{data}-{workload.device.replace(':', '')}{gb}"
            f"-{fingerprint}")


# What a study name may be: it names a folder beside the database (``artifacts_dir``) and a lock file.
_STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


def check_study_name(name: str) -> str:
    """``name`` if it may name a study, else a one-line ConfigError: 1-200 letters, digits, ``_``, ``.`` and
    ``-``, not starting with ``.`` or ``-`` (no ``/``, no ``..``, nothing a folder name could not hold)."""
    if not isinstance(name, str) or not _STUDY_NAME.fullmatch(name):
        raise ConfigError(f"study name {name!r} is not allowed: use 1-200 letters, digits, '_', '.' and '-', "
                          "starting with a letter, digit or '_' (it names the study's folder beside the database)")
    return name


def folder_name(study_name: str) -> str:
    """The name of a study's folder: the name itself where ``check_study_name`` allows it; else (a name written
    into a database by another tool, or by someone else: ``../../x``, ``a/b``) a cleaned form with a hash of the
    name, which can neither leave the folder it is put in nor collide with another study's."""
    if isinstance(study_name, str) and _STUDY_NAME.fullmatch(study_name):
        return study_name
    import hashlib

    digest = hashlib.sha256(str(study_name).encode(errors="replace")).hexdigest()[:12]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(study_name)).strip("._-")[:80]
    return f"{cleaned or 'study'}-{digest}"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL; None for a database server."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return None


def artifacts_dir(url: str, study_name: str) -> Path:
    """Where a study's files (trial logs, Ray's files, reports, traces) live: beside its SQLite database,
    else under ``trials/`` in the working directory; the folder's name is ``folder_name(study_name)``, never a
    stored name taken as a path."""
    db = sqlite_path(url)
    return (db.parent if db is not None else Path("trials")) / folder_name(study_name)


def open_existing_storage(url: str | None = None):
    """``(storage, url)`` for a storage that must already hold studies (show, export, report, dashboard): a
    missing SQLite file is a one-line StorageError instead of a new empty database, and a database without
    Optuna's tables (an empty file, another program's) is one too, left as it was: these commands read, and
    never create a schema (``open_storage(existing=True)``). ``url`` is for showing: its password is masked
    (``_redact``); the storage holds the real one."""
    url = url or DEFAULT_STORAGE
    db = sqlite_path(url)
    if db is not None and not db.exists():
        raise StorageError(f"no study database at {db}: run `autotune run` first, or point --storage at it")
    check_storage(url)  # a damaged file is said as such, first
    return open_storage(url, create_dirs=False, existing=True), redact(url)


def open_storage(url: str | None = None, *, create_dirs: bool = True, existing: bool = False):
    """An Optuna RDBStorage for ``url`` (default ``sqlite:///trials/autotune.db``), or a one-line StorageError.

    SQLite waits up to 60 s for a lock held by another process instead of failing. Other databases get
    heartbeats, so a trial whose worker died is failed and retried by a live worker. ``existing``: the
    database must already hold Optuna's tables (checked without writing); none are created.
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
        raise StorageError(f"storage URL {redact(url)!r} is not supported: use sqlite:///PATH.db or "
                           "postgresql://user@host/db (any SQLAlchemy URL Optuna accepts)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if existing:
                _require_optuna_tables(url, db)
            return optuna.storages.RDBStorage(_with_driver(url), skip_table_creation=existing, **kwargs)
    except StorageError:
        raise
    except Exception as exc:
        raise _storage_error(exc, url) from None


# Optuna's own tables (optuna.storages._rdb.models; Alembic's stamp): a database without them holds no study
_OPTUNA_TABLES = frozenset({"studies", "trials", "version_info", "alembic_version"})


def open_study(storage_url: str, study_name: str, *, sampler, pruner, fingerprint: str, meta: dict[str, Any]):
    """``(storage, study)``: the study ``study_name`` in ``storage_url``, created or loaded (maximizing samples/s,
    its one metric named), checked to be this hardware's (``fingerprint``), its attributes ``meta`` (the workload,
    the hardware, the space, the caps: ``trials.STUDY_*``) kept up to date. A study measured on other hardware
    is a one-line ``StorageError``: one study holds the measurements of one kind of machine, and mixing them
    would recommend one machine's best to another (several machines may share a storage, each its own study)."""
    import optuna

    from autotune.search.record import trials as keys

    # Optuna logs every failed trial with a traceback at WARNING; our progress line and `show` say it.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(storage_url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(storage=storage, study_name=study_name, direction="maximize", pruner=pruner,
                                    sampler=sampler, load_if_exists=True)
        if study.metric_names != [keys.OBJECTIVE]:  # new studies, and those made before it was named
            study.set_metric_names([keys.OBJECTIVE])
    stored = study.user_attrs.get(keys.STUDY_FINGERPRINT)
    if stored and stored != fingerprint:
        raise StorageError(
            f"study {study_name!r} was measured on other hardware (fingerprint {stored}: "
            f"{study.user_attrs.get(keys.STUDY_HARDWARE)}); this machine is {fingerprint}: drop --study-name (the "
            "default name includes the fingerprint, so each kind of machine gets its own study)")
    for k, v in meta.items():
        if study.user_attrs.get(k) != v:
            study.set_user_attr(k, v)
    return storage, study


def _require_optuna_tables(url: str, db: Path | None) -> None:
    """A one-line StorageError unless the database of ``url`` holds Optuna's tables, found without writing a
    byte: SQLite opened read-only (``mode=ro``), a server asked for its table names."""
    if db is not None:
        import sqlite3
        from urllib.parse import quote

        try:
            con = sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True, timeout=60)
            try:
                tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            finally:
                con.close()
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"{db} is not a study database: {exc}") from None
        where = str(db)
    else:
        import sqlalchemy

        engine = sqlalchemy.create_engine(_with_driver(url))
        try:
            tables = set(sqlalchemy.inspect(engine).get_table_names())
        finally:
            engine.dispose()
        where = redact(url)
    if not _OPTUNA_TABLES <= tables:
        raise StorageError(f"{where} is not a study database (no Optuna tables{': it is empty' if not tables else ''}"
                           "); point --storage at the database `autotune run` wrote")


def _database_folder(db: Path) -> None:
    """Create the folder of SQLite database ``db`` if needed, or a one-line StorageError if it cannot hold it."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {db.parent} for the study database: {exc.strerror}") from None
    if not os.access(db.parent, os.W_OK):
        raise StorageError(f"cannot write to {db.parent}: pick a writable folder with --storage sqlite:///DIR/autotune.db")


def _masked(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with the URL's password masked, wherever it appears."""
    text = redact(text)
    try:
        from sqlalchemy.engine import make_url

        password = make_url(url).password
    except Exception:  # noqa: BLE001 - an unparsable URL: redact() has done what can be done
        return text
    return text.replace(str(password), "***") if password else text


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
    except Exception as exc:
        raise _storage_error(exc, url) from None


def _storage_error(exc: Exception, url: str) -> StorageError:
    """The one-line error for a storage that cannot be opened (no driver, a bad URL, an unreachable server),
    the URL's password masked wherever it appears."""
    if isinstance(exc, ImportError):
        return StorageError(f"storage {redact(url)!r} needs a database driver: {redact(str(exc))} "
                            '(for PostgreSQL: pip install "autotune[postgres]")')
    # sqlalchemy ArgumentError / OperationalError: bad URL or unreachable server
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StorageError(f"cannot open storage {redact(url)!r}: {_masked(first, url)}")


def _check_sqlite_file(db: Path) -> None:
    import sqlite3

    with open(db, "rb") as f:
        header = f.read(16)
    if header != b"SQLite format 3\x00":
        return  # empty, or not SQLite at all: not damaged, just not a study database (open_storage says so)
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
    """The lock of study ``study_name`` shared by every worker of a PostgreSQL/MySQL study (a server-side advisory
    lock), held around check-then-write steps that must not interleave across machines (queue the baseline once,
    re-queue an interrupted trial once, queue a batch-walk step once, claim a config). SQLite needs none: one run per
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
    lock_path = db.parent / f".{db.name}.{folder_name(study_name)}.lock"
    try:
        fd, mine = open_lock_file(lock_path, 0o644)  # beside a database in /tmp another user could plant a link
    except UnsafeFile as exc:
        raise StorageError(f"cannot use the run lock {lock_path}: {exc.strerror}; remove it, or put the study "
                           "database in a folder of yours") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(
                f"another autotune run is already working on study {study_name!r} in {db} on this machine; "
                "wait for it to finish (two runs would share the cores and spoil each other's timings)"
            ) from None
        if mine:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
