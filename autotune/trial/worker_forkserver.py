"""A fork server: import torch once, then fork one trial child per request. Run by ``forkserver.py`` as
``python -m autotune.trial.worker_forkserver SOCKET_FD`` (by way of ``_launch``: nothing of the working folder on
``sys.path``) with exactly the environment its trials need.

Why it is safe to fork here: the server runs no torch code after importing it, so no OpenMP/MKL thread pool,
no CUDA context and no allocator cache exist yet (a pool read OMP_NUM_THREADS at load, from this process's
environment, which is the trial's). The only threads at the fork are those a library starts at load and
stops around ``fork`` itself (OpenBLAS, via pthread_atfork). The name holds ``autotune.trial.worker`` so tools that
look for trial processes by command line (the fault tests' orphan check) see the server and its children.

Protocol (JSON lines on a Unix socket; a request carries two file descriptors, the trial's log and the write
end of its event pipe):
    parent -> server  {"payload": ...} + fds   server -> parent  {"forked": pid}, later {"exited": pid, "rc": n}
    server -> parent  {"ready": pid, "s": import seconds} once, at start.
The child makes itself a session leader (its own process group: the parent's kill-by-group reaches it and its
DataLoader workers, and never the server), sends its log to the trial's log, and runs ``_worker.main``.
The server reaps its children and reports their exit codes as ``subprocess`` does (negative = signal). It
exits when the parent closes the socket, when the parent dies, or when idle too long. When the parent dies (a
parent-death signal it catches, once torch is imported: ``machine.proctree.take_down_with_parent``) it SIGKILLs
each trial's process group and every descendant first: a DataLoader worker or a DDP rank still importing torch has
no parent-death signal of its own yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time

from autotune.machine.proctree import adopt_orphans, die_with_parent, kill_descendants, take_down_with_parent

IDLE_EXIT_S = 900.0  # an idle server holds ~0.7 GiB (torch imported): a forgotten one goes by itself


def _preload() -> None:
    """Import what every trial imports, without running anything that starts threads or touches a device."""
    import importlib

    for name in ("torch", "torch.utils.data", "PIL.Image", "torchvision", "torchvision.transforms",
                 "autotune.machine.device", "autotune.trial.worker", "autotune.config", "autotune.errors",
                 "autotune.machine.oom", "autotune.workloads.build"):
        try:
            importlib.import_module(name)
        except ImportError:  # a workload without torchvision imports only what it needs
            pass


def cuda_initialised() -> bool:
    """Whether this server's torch has a CUDA context (nothing here should make one: a library that did on
    import would hand it to every child)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without the call: it made no context we could know of
        return False


def _child(sock: socket.socket, payload: str, log_fd: int, chan_fd: int, led: int, server: int,
           cwd: str | None = None) -> None:
    """In the forked child: die with the server (fork cleared the signal; a server killed since the fork is no
    longer the parent, and the child goes), become a session leader, move to the launcher's working folder
    (``cwd``), take the trial's log as stdout/stderr, run the worker."""
    code = 1
    try:
        die_with_parent(server)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler (``take_down_with_parent``) is its own
        if cwd:
            with contextlib.suppress(OSError):  # a folder removed since: where the server is, as before
                os.chdir(cwd)
        os.setsid()
        os.close(led)  # tells the server the process group exists: the parent may kill it from now on
        sock.close()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        from autotune.trial import worker as _worker

        sys.argv = ["autotune.trial.worker", str(chan_fd), payload]
        code = _worker.main(sys.argv)  # it ends the process itself (os._exit), also on failure
    except BaseException:  # noqa: BLE001 - the parent sees the exit code and the log
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _reap(orphans: set[int], children: set[int]) -> set[int]:
    """Reap the killed orphans that are gone; kill what they left behind in turn. Returns those still due."""
    left = set()
    for pid in orphans:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped by the loop above, or never ours
            continue
        if not done:
            left.add(pid)
    if len(left) < len(orphans):
        left.update(kill_descendants(keep=children))
    return left


def serve(sock: socket.socket, *, idle_exit_s: float = IDLE_EXIT_S, children: set[int] | None = None) -> None:
    """Fork a trial child per request on ``sock`` until the parent goes (see the module docstring); ``children``:
    the trial children running, kept up to date here (each is its own process group)."""
    children = set() if children is None else children
    orphans: set[int] = set()  # adopted from trials and killed, not reaped yet
    buf = b""
    fds_in: list[int] = []  # descriptors arrive with a message's first byte, which may precede its line's end
    last = time.monotonic()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.02 if children else 1.0)
        while children:  # report each exit as it happens, the way subprocess does (negative = signal)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            if pid not in children:  # an orphan adopted from a trial, reaped once killed: not a trial's exit
                continue
            children.discard(pid)
            sock.sendall(json.dumps({"exited": pid, "rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            last = time.monotonic()
            # a trial that died abruptly left its descendants to this server (a subreaper): they go now, and
            # theirs as they are reaped in turn
            orphans.update(kill_descendants(keep=children))
        if orphans:
            orphans = _reap(orphans, children)
        if not ready:
            if not children and time.monotonic() - last > idle_exit_s:
                return
            continue
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
        if not msg:  # the parent closed its end (or died): the trials it runs are its, they go too
            for pid in children:
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass
            return
        buf += msg
        fds_in += fds
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if cuda_initialised():  # never fork a CUDA context: the parent sees the server gone, trials go cold
                return
            request = json.loads(line)
            log_fd, chan_fd = fds_in[:2]
            del fds_in[:2]
            sys.stdout.flush()
            sys.stderr.flush()
            wait_r, led_w = os.pipe()
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(wait_r)
                _child(sock, json.dumps(request["payload"]), log_fd, chan_fd, led_w, server, request.get("cwd"))
            os.close(led_w)
            os.read(wait_r, 1)  # EOF once the child is its own session (or died trying)
            os.close(wait_r)
            os.close(log_fd)
            os.close(chan_fd)
            children.add(pid)
            last = time.monotonic()
            sock.sendall(json.dumps({"forked": pid}).encode() + b"\n")


def main(argv: list[str]) -> int:
    parent = os.getppid()
    die_with_parent(parent)  # set already by the bootstrap (``launch.python_command``): again for one started by hand
    adopt_orphans()  # what a trial that dies abruptly leaves behind comes here, not to init, and is killed
    sock = socket.socket(fileno=int(argv[1]))
    t0 = time.perf_counter()
    _preload()
    # From now on trials run under this server: when the tuner dies, the server takes each trial's group (its
    # DataLoader workers, ranks still importing torch) and every descendant down with it, then goes.
    children: set[int] = set()
    take_down_with_parent(parent, groups=lambda: list(children))
    sock.sendall(json.dumps({"ready": os.getpid(), "s": round(time.perf_counter() - t0, 3)}).encode() + b"\n")
    serve(sock, children=children)
    os._exit(0)  # no interpreter teardown: with torch loaded it takes seconds, and the tuner waits for this exit


if __name__ == "__main__":
    sys.exit(main(sys.argv))
