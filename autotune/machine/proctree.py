"""Keeping the processes autotune starts together, Linux side: a child that dies with its parent, a trial process
that adopts its orphaned descendants, and the kill of every descendant it has.

Why adoption: the runner ends a trial by killing its process group, and a descendant that calls ``setsid`` (a
daemon, a data server, anything double-forked) leaves the group, and, once its parent exits, the tree too: it is
re-parented to init and outlives the trial. A process that is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``)
gets its orphaned descendants instead of init, so they stay in its tree, where the memory watch counts them and
``kill_descendants`` (at the trial's end) or the runner's kill (``memwatch.MemoryWatch.kill``) finds them. The
trial child and the fork server are subreapers; the tuner itself is not (it is the user's process, and would
have to reap every orphan of everything it ever started).

Why a parent-death signal, and the rules it comes with (Linux's ``PR_SET_PDEATHSIG``; nothing polls):

- it is set *in the child*, so a child started by ``python_command`` sets it in its first lines, before it imports
  anything (``autotune.machine.launch``), and a forked one right after the fork: a parent killed while its child
  still imports torch takes the child with it;
- it fires when the parent *thread* that started the child ends, not only its process: a child must be started
  by a thread that outlives it (a pool's fork servers are started by the pool's own thread, not a trial's; a
  trial is waited for where it started);
- a parent that dies before the child set it leaves the child orphaned already: the child then checks its
  parent is still the one that started it (``getppid``) and goes if not;
- fork clears it: a process's own children set their own (``children_die_with_me`` does it for every fork of
  its main thread, which is how DataLoader workers start under the ``fork`` start method); workers started by
  ``spawn`` or ``forkserver`` (Python 3.14's default on Linux) run no fork hook, so the trial's loader sets it
  in each worker as its first act (``loader_workers_die_with_me``, a ``worker_init_fn``);
- a process that only supervises others (a fork server, the supervisor of DDP ranks) is asked for a catchable
  signal instead, and takes its whole tree down before it goes (``take_down_with_parent``): a DataLoader worker
  or a rank still importing torch has set nothing yet, and would outlive it;
- a program started with ``subprocess`` (``pip list`` for the environment stamp, a compile worker) sets nothing
  either: a child that starts such programs splits itself first (``supervised``), and its supervising half takes
  the group down.

Elsewhere than Linux none of this exists: each call does nothing, and a killed tuner's children end when they
next find their parent gone (a fork server at EOF on its socket).

>>> die_with_parent(); adopt_orphans()   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
import threading
from typing import Callable

__all__ = ["die_with_parent", "adopt_orphans", "kill_descendants", "children_die_with_me", "take_down_with_parent",
           "supervised", "kill_group", "loader_workers_die_with_me"]

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


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` (SIGKILL) to this process when its parent dies, so a killed tuner leaves no trial
    running. ``parent``: the pid that started this process; when it is no longer the parent (it died before the
    signal was set: this process was orphaned already), this process ends at once, by ``sig`` (its handler, for a
    caught one). Returns whether Linux set it (False elsewhere: nothing to do)."""
    done = _prctl(_PR_SET_PDEATHSIG, int(sig))
    if parent is not None and os.getppid() != parent:  # without the signal (not Linux) this check is all there is
        os.kill(os.getpid(), sig)
        if sig == signal.SIGKILL:  # pragma: no cover - not reached
            os._exit(128 + sig)
    return done


# the fork in progress: whether the main thread makes it, and the pid that makes it (the child's expected parent);
# and the process that registered the hooks (a forked child inherits them, and registers none again)
_fork: dict[str, int] = {"main": 0, "pid": 0, "registered": 0}


def _before_fork() -> None:
    _fork["main"] = int(threading.current_thread() is threading.main_thread())
    _fork["pid"] = os.getpid()


def _after_fork_in_child() -> None:
    if _fork["main"]:  # a fork of another thread would die when that thread ends, not with this process
        die_with_parent(_fork["pid"])


def children_die_with_me() -> None:
    """Every child this process forks from its main thread (``os.fork``, ``multiprocessing``'s fork: DataLoader
    workers) dies with it, as if it had called ``die_with_parent`` first thing. Not the children ``subprocess``
    starts (no Python runs in them between fork and exec) nor those forked by another thread (the signal would
    fire when that thread ends); those the trial's own end kills (``kill_descendants``), or its group's."""
    if _fork["registered"]:  # here, or in the process this one was forked from: the hooks came with the fork
        return
    _fork["registered"] = os.getpid()
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)



def loader_workers_die_with_me(then: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn`` under which every worker dies with this process, whatever started it.

    - ``fork``: the worker is this process's child (``children_die_with_me`` did it already; done again, harmless);
    - ``spawn``: the worker is this process's child, but no Python ran in it between fork and exec: it sets its
      parent-death signal here;
    - ``forkserver`` (Python 3.14's default on Linux): the worker's parent is multiprocessing's fork server, which
      would not go with this process: it exits when every holder of its "alive" pipe has, and each worker it forked
      holds one. So the worker also watches this process itself (a pidfd, one blocked thread, nothing polls) and
      goes when it ends. That thread needs the GIL: a worker stuck in C code that holds it is ended only by the
      trial's own kill of its group.

    Either way the worker first checks that this process is its parent or its parent's parent; if not, this process
    died before the worker got here, and it goes at once. ``then``: a workload's own ``worker_init_fn``, called
    after. Picklable (spawn and forkserver send it to the worker)."""
    return functools.partial(_worker_dies_with, os.getpid(), then)


def _worker_dies_with(manager: int, then: Callable[[int], None] | None, worker_id: int) -> None:
    if sys.platform.startswith("linux"):
        die_with_parent()
        parent = os.getppid()
        if parent != manager:
            if _parent_of(parent) != manager:
                os.kill(os.getpid(), signal.SIGKILL)
            _watch_process(manager)
    if then is not None:
        then(worker_id)


def _watch_process(pid: int) -> None:
    """SIGKILL this process when ``pid`` ends (at once if it has: a zombie's pidfd is readable). Without pidfds
    (Linux before 5.3) it does nothing."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
    except (OSError, AttributeError):
        return

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="autotune: die with the trial", daemon=True).start()


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])  # after the name, which may hold spaces
    except (OSError, IndexError, ValueError):
        return None


def take_down_with_parent(parent: int | None = None, *, groups: Callable[[], list[int]] = list) -> bool:
    """For a process that supervises others (a fork server, the supervisor of DDP ranks): when its parent dies,
    SIGKILL the process groups ``groups()`` names (a trial child's, with its DataLoader workers and ranks), then
    every descendant (one that left its group: this process adopts orphans), then this process. Its main thread
    must come back to Python often (a loop on ``select`` or ``wait`` does): the handler runs there. ``parent``:
    as for ``die_with_parent``. Returns whether Linux set the signal."""
    import psutil  # noqa: F401 - imported now, not in the handler (``kill_descendants`` uses it)

    def on_parent_death(signum, frame) -> None:
        kill_descendants()
        for pgid in groups():  # what was forking meanwhile; this process's own group last of all
            if pgid != os.getpgrp():
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)
        if os.getpgrp() in groups():
            os.killpg(os.getpgrp(), signal.SIGKILL)
        signal.signal(signum, signal.SIG_DFL)  # then ends by the signal itself, as its parent would see it uncaught
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # pragma: no cover - not reached

    signal.signal(signal.SIGTERM, on_parent_death)
    return die_with_parent(parent, signal.SIGTERM)


def supervised() -> None:
    """Split this process in two, first thing (before any thread: it forks): the caller's process becomes the
    supervisor of a worker, which returns from this call and does the work. When the parent dies the supervisor
    takes the whole group down (``take_down_with_parent``), the worker with whatever it started with
    ``subprocess``; when the worker ends, the supervisor ends as it did (its exit code, or its signal), so the
    parent sees one process end as it would have. Elsewhere than Linux it returns at once, unsplit."""
    if not sys.platform.startswith("linux"):
        return
    me = os.getpid()
    # set before the fork: from its first moment the worker (and what it starts) is taken down with this process
    take_down_with_parent(os.getppid(), groups=lambda: [os.getpgrp()])
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the handler is the supervisor's
        die_with_parent(me)
        return
    try:
        _, status = os.waitpid(pid, 0)  # a signal's handler runs meanwhile (PEP 475 retries the wait)
        code = os.waitstatus_to_exitcode(status)
    except ChildProcessError:  # pragma: no cover - reaped by no one else
        code = 1
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


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


def kill_group(pid: int, *, timeout_s: float = 5.0) -> None:
    """SIGKILL the process group of ``pid`` (a child started as a session leader, and what it started), and wait,
    up to ``timeout_s``, until each of them has exited: a zombie has (it waits only for its parent, or init, to
    reap it), so a grandchild whose parent went with it does not hold the caller. ``pid`` itself is the caller's to
    reap."""
    import time

    import psutil

    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        tree = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    for p in tree:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
