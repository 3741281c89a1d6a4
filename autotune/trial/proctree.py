"""Keeping a trial's processes together, Linux side: a child that dies with its parent, a trial process that
adopts its orphaned descendants, and the kill of every descendant it has.

Why adoption: the runner ends a trial by killing its process group, and a descendant that calls ``setsid`` (a
daemon, a data server, anything double-forked) leaves the group, and, once its parent exits, the tree too: it is
re-parented to init and outlives the trial. A process that is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``)
gets its orphaned descendants instead of init, so they stay in its tree, where the memory watch counts them and
``kill_descendants`` (at the trial's end) or the runner's kill (``memwatch.MemoryWatch.kill``) finds them. The
trial child and the fork server are subreapers; the tuner itself is not (it is the user's process, and would
have to reap every orphan of everything it ever started).

>>> die_with_parent(); adopt_orphans()   # doctest: +SKIP
"""

from __future__ import annotations

import signal
import sys

__all__ = ["die_with_parent", "adopt_orphans", "kill_descendants"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the parent dies, so a killed tuner leaves no trial running."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def adopt_orphans() -> bool:
    """Make this process the one its orphaned descendants are re-parented to (instead of init), so one that
    called ``setsid`` and lost its parent is still in this process's tree. True where Linux did it."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def kill_descendants(*, keep: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """SIGKILL every descendant of this process but those in ``keep`` (and theirs); returns the pids killed.
    A killed process's own children are re-parented to this one when it adopts orphans: call again after
    reaping to reach them."""
    import psutil

    try:
        tree = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    spared = {p.pid for p in tree if p.pid in keep}
    for p in tree:
        if p.pid in keep:
            continue
        try:
            if p.ppid() in spared:
                spared.add(p.pid)  # a descendant of one kept
                continue
            p.kill()
        except psutil.Error:
            pass
    return [p.pid for p in tree if p.pid not in spared]
