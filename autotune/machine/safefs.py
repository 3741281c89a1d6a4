"""Files in places other users can reach: what autotune makes there is its own, what it finds there it does not
trust (docs/security.md).

``private_dir`` makes a folder 0700, or accepts an existing one only if it is a real folder of this user that
no other user can write; ``open_append`` opens a log for appending without following a symbolic link;
``open_lock_file`` opens a lock file in a shared folder (``/tmp``) without following a link and says whether this
process may write to it (only a plain file it made itself, never another user's or a hard link to one of its
files).

>>> folder = private_dir(Path("/tmp/my-study"))   # doctest: +SKIP
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from autotune.errors import StorageError

__all__ = ["private_dir", "open_append", "open_lock_file", "UnsafeFile"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(OSError):
    """A path that must not be used: a symbolic link, not a plain file, or not readable by this user."""


def private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can write: made with mode 0700 when missing; an existing one must be a
    real folder (not a link) owned by this user and not writable by others, else a one-line StorageError.

    A study's folder holds what trials load back (inductor's cache: pickles and shared objects) and logs they
    append to; beside a database in /tmp its name is predictable, so another user could make it first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # ours, just made: the umask may have left it narrower than the owner needs
        return path
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(f"cannot create {path}: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StorageError(f"refusing {path}: it is "
                           f"{'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}, "
                           "not a folder autotune made; remove it or put the study database elsewhere (--storage)")
    if st.st_uid != os.geteuid():
        raise StorageError(f"refusing {path}: it belongs to another user ({_user(st.st_uid)}), who could plant "
                           "files trials load; put the study database in a folder of yours (--storage "
                           "sqlite:///DIR/autotune.db)")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise StorageError(f"refusing {path}: every user can write to it; `chmod o-w {path}`, or put the study "
                           "database elsewhere (--storage)")
    return path


def open_append(path: Path):
    """``path`` opened for appending in binary mode, made if missing (the umask's permissions), without
    following a symbolic link: a link planted there is refused (``OSError`` ELOOP), not written through."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
    return os.fdopen(fd, "ab")


def open_lock_file(path: Path, mode: int = 0o644) -> tuple[int, bool]:
    """``(fd, mine)`` for lock file ``path``, opened without following a link and without blocking (a FIFO
    planted there would block a plain open); ``mine``: this process made it now, or it is a plain file of this
    user with no other name (so not another file of the user's that someone hard-linked there), so writing a
    note into it harms nothing. Another user's file is opened read-only (flock needs no more) and never written.
    Raises ``UnsafeFile`` for a link, anything but a plain file, or a file this user cannot read."""
    flags = _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, mode)
    except FileExistsError:
        fd = None
    except OSError as exc:
        raise UnsafeFile(exc.errno, f"cannot create it: {exc.strerror}") from None
    if fd is not None:
        os.fchmod(fd, mode)  # made just now: the umask must not keep other users from opening it to lock
        return fd, True
    try:
        try:
            fd = os.open(path, os.O_RDWR | flags)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | flags)
    except OSError as exc:
        import errno

        why = "it is a symbolic link" if exc.errno == errno.ELOOP else f"cannot open it: {exc.strerror}"
        raise UnsafeFile(exc.errno, why) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(0, "it is not a plain file")
    return fd, st.st_uid == os.geteuid() and st.st_nlink == 1


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except (ImportError, KeyError):
        return f"uid {uid}"
