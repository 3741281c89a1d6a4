"""Write a file so that a reader sees the old content or the new, never half of either."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsynced, then renamed over it,
    and the folder fsynced so the rename itself is on disk.
    The file gets the permissions of any other the user writes (the umask), not mkstemp's 0600. An error
    (a full disk, a folder at ``path``) is an ``OSError`` that names ``path``, and leaves its old content."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    try:
        _write(path, text)
    except OSError as exc:
        if exc.filename is None:  # a failed write or fsync names no file: the user's is the one to name
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    _fsync_folder(path.parent)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the file should read like any other the user writes
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable: it lives in the folder's entries, which reach the disk with the folder's own
    fsync; without it a power cut after ``export`` said "wrote" can leave the old file, or none."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a filesystem that cannot sync a folder: nothing to do
            raise
    finally:
        os.close(fd)
