"""What the machine did, in one line: errors that are not the user's mistake nor autotune's bug (a full disk, a
damaged study database, a file that cannot be written) become one line and exit code 2 in the CLI instead of a
traceback. Anything else is a bug and keeps its traceback.

>>> print(environment_error(OSError(28, "No space left on device", "best.yaml")))
no space left on the device for best.yaml: free some space and run the command again (what was stored before is intact)
"""

from __future__ import annotations

import errno
import sqlite3
from typing import Iterator

__all__ = ["environment_error"]

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FILE = {errno.EACCES: "permission denied", errno.EPERM: "not permitted", errno.EROFS: "read-only file system",
         errno.EISDIR: "is a folder", errno.ENOTDIR: "a part of the path is not a folder",
         errno.ENOENT: "no such file or folder", errno.ENAMETOOLONG: "name too long", errno.EIO: "input/output error"}
_KEPT = "what was stored before is intact"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, innermost last."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def environment_error(exc: BaseException, *, storage: str | None = None) -> str | None:
    """One line for ``exc`` when the machine, not the command, is at fault; None for anything else (a bug).
    ``storage``: the storage URL the command used; its SQLite file is named in a database's error."""
    from autotune.search.record.storage import sqlite_path

    db = sqlite_path(storage) if storage else None
    where = f"the study database {db}" if db is not None else "the study database"
    for e in _chain(exc):
        if isinstance(e, sqlite3.DatabaseError):
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "full" in text:
                return (f"the disk holding {where} is full ({text}): free some space and run the same command "
                        f"again; {_KEPT} (SQLite rolls back a write it cannot finish)")
            if isinstance(e, sqlite3.OperationalError):
                return f"{where} cannot be used: {text}"
            return (f"{where} is damaged ({text}): restore it from a backup, or save what is readable with "
                    "`sqlite3 FILE .recover | sqlite3 NEW.db`")
        if isinstance(e, OSError) and e.errno in _FULL:
            name = f" for {e.filename}" if e.filename else ""
            return f"no space left on the device{name}: free some space and run the command again ({_KEPT})"
        if isinstance(e, OSError) and e.errno in _FILE:
            name = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "") if e.filename else "a file"
            return f"cannot use {name}: {_FILE[e.errno]}"
    return None
