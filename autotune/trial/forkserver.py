"""Trials that do not pay for importing torch: fork servers, one per launch environment (the parent's side).

A cold trial child spends ~2.5-6 s of this project's machines importing torch and torchvision before it builds
anything. A fork server (``_worker_forkserver.py``) is started once with a trial's exact environment, imports
them, and forks a child per trial. What the runner relies on stays true of a forked child:

- **one process group per trial**: the child is a session leader before the server says it exists, so the
  runner's kill-by-group reaches it and its DataLoader workers, never the server;
- **the memory watch**: the runner watches the child's pid and its descendants, not the server; the pages the
  child shares with the server are charged to the trial as if it had imported torch itself
  (``memwatch.MemoryWatch``'s ``lender``), and the child's VmHWM starts at its own resident size at the fork;
- **the time limit** and the cap kill the child's group as before; the server reaps it and reports its exit
  code (negative = the signal), as ``subprocess`` would;
- **a clean thread and allocator state**: the server runs no torch code, so OpenMP/MKL have started no pool
  and read their thread counts from the server's environment, which is the trial's (``launch_env``: thread
  counts, glibc malloc settings, torch's huge-page switch, all read at load or first allocation). So a server
  serves only trials whose environment is exactly its own; another environment gets another server.

CUDA trials are forked too (a CUDA context must never cross a fork, and none does: the server never initialises
CUDA, and checks that before each fork; each child initialises its own). Not forked: children run by another
interpreter (``python=``). ``AUTOTUNE_FORK_SERVER=0`` turns servers off (every trial cold); a server
that fails to start or dies sends its trial (and that environment's later ones) down the cold path.
A server dies with the tuner (parent-death signal, and EOF on its socket), when its pool is closed (the
tuner's run closes the default pool), and by itself after 15 idle minutes.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

from autotune.machine.launch import python_command

__all__ = ["ForkServers", "ForkServer", "ForkedChild", "ForkServerError", "default_servers", "closing_default",
           "ENV_SWITCH", "forkable"]

ENV_SWITCH = "AUTOTUNE_FORK_SERVER"
START_TIMEOUT_S = 180.0  # importing torch on a loaded machine


class ForkServerError(RuntimeError):
    """A server did not start, or stopped answering: the trial takes the cold path."""


def forkable(device: str, python: str) -> bool:
    """Whether a trial may be forked: this interpreter, on the CPU or a GPU. A CUDA context must never cross a
    fork, and none does: the server imports torch and never initialises CUDA (``worker_forkserver`` checks it before
    every fork); each forked child initialises its own, as a cold one would."""
    return python == sys.executable and (device == "cpu" or device.startswith("cuda"))


class ForkedChild:
    """A trial child forked by a server, with the part of ``subprocess.Popen`` the runner uses."""

    def __init__(self, server: "ForkServer", pid: int) -> None:
        self.pid = pid
        self.server_pid = server.pid
        self.returncode: int | None = None
        self.lost_server: str | None = None  # how its server died under it, when it did (it died with it)
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"forked trial {self.pid}", timeout)
            self._server.pump(left)
        return self.returncode


class ForkServer:
    """One server process: started with ``env``, ready once it has imported torch."""

    def __init__(self, python: str, env: dict[str, str], *, start_timeout_s: float = START_TIMEOUT_S) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.proc = subprocess.Popen(
            python_command(python, "autotune.trial.worker_forkserver", str(theirs.fileno())),
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True,  # Ctrl-C in the terminal reaches the tuner, which ends the trial itself
        )
        theirs.close()
        self.pid = self.proc.pid
        self.dead = False
        self._buf = b""
        self._inbox: list[dict] = []
        self._children: dict[int, ForkedChild] = {}
        try:
            self.import_s = self._expect("ready", start_timeout_s)["s"]
        except ForkServerError:
            self.close()
            raise

    @property
    def busy(self) -> bool:
        return any(c.returncode is None for c in self._children.values())

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def pump(self, timeout: float) -> None:
        """Read what the server said within ``timeout``; exits go to their children, the rest to the inbox."""
        if self.dead:
            return
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:  # the server is gone, and its children with it (their parent-death signal)
            self.dead = True
            how = self._death()
            for child in self._children.values():
                if child.returncode is None:
                    child.returncode = -signal.SIGKILL
                    child.lost_server = f"the fork server (pid {self.pid}) that started this trial died ({how}), " \
                                        "and the trial with it"
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            if "exited" in msg:
                child = self._children.pop(msg["exited"], None)
                if child is not None:
                    child.returncode = msg["rc"]
            else:
                self._inbox.append(msg)

    def _death(self) -> str:
        """How the server ended, from its exit status: "killed by SIGTERM", "exited with code 1"."""
        try:
            rc = self.proc.wait(timeout=5)  # its socket closed: it has exited, or is exiting
        except subprocess.TimeoutExpired:
            return "it closed its socket and did not exit"
        if rc < 0:
            return f"killed by {signal.Signals(-rc).name}"
        return f"exited with code {rc}"

    def _expect(self, key: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for i, msg in enumerate(self._inbox):
                if key in msg:
                    return self._inbox.pop(i)
            left = deadline - time.monotonic()
            if self.dead or left <= 0 or self.proc.poll() is not None:
                raise ForkServerError(f"fork server {self.pid}: no {key!r} (exit code {self.proc.poll()})")
            self.pump(min(0.2, left))

    def launch(self, payload: dict, log_fd: int, chan_fd: int) -> ForkedChild:
        """Fork a trial child running ``_worker.main`` on ``payload``, its output to ``log_fd``, its events
        to ``chan_fd`` (both are the caller's to close), in the caller's working folder now (as a cold child would
        be: a Ray actor moves to each trial's folder, the server stays where it started). Returns once the child is
        its own process group."""
        request = {"payload": payload, "cwd": os.getcwd()}
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode() + b"\n"], [log_fd, chan_fd])
        except OSError as exc:
            self.dead = True
            raise ForkServerError(f"fork server {self.pid}: {exc}") from exc
        pid = self._expect("forked", 60.0)["forked"]
        child = self._children[pid] = ForkedChild(self, pid)
        return child

    def hang_up(self) -> None:
        """Close the server's socket: it kills any child it still has and exits, without being waited for."""
        self.dead = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def close(self) -> None:
        """End the server (it kills any child it still has when its socket closes) and reap it."""
        self.hang_up()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Keeper:
    """The one thread that starts a pool's servers. A server's parent-death signal fires when the *thread* that
    started it ends (``machine.proctree``), so a server started by a trial's thread (Ray runs each trial in a
    thread of its own) went with that thread: no later trial could use it, and a thread that got the ended one's
    recycled id could still find it "alive" while it died. This thread lives as long as the pool: until ``stop``
    (the pool's ``close``) or the process's end."""

    def __init__(self) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], "ForkServer"]) -> "ForkServer":
        """``fn()`` run in the keeper's thread (started on first use); its result or its exception."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="autotune fork servers", daemon=True)
            self._thread.start()
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((fn, done))
        return done.result()

    def _loop(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, done = item
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - the caller's to handle, in its own thread
                done.set_exception(exc)

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._calls.put(None)
            self._thread.join(timeout=5)
        self._thread = None


class ForkServers:
    """Fork servers keyed by (interpreter, exact environment); at most ``max_servers`` live.

    Each idle server holds torch's imported state (~0.4 GiB private, ~0.7 GiB resident here), so the least
    recently used idle one is closed to make room. Any thread may launch trials: the servers are started by the
    pool's own thread (``_Keeper``), so they outlive the threads whose trials they serve. A server runs one trial at
    a time; a trial whose environment's servers are all busy (a concurrent one) gets another server.

    >>> with ForkServers() as servers:                                         # doctest: +SKIP
    ...     run_trial(workload, config, spec, servers=servers)
    """

    def __init__(self, *, enabled: bool = True, max_servers: int = 2, start=ForkServer) -> None:
        self.enabled = enabled
        self.max_servers = max(1, max_servers)
        self._start = start
        self._servers: list[tuple[tuple, ForkServer]] = []  # least recently used first
        self._failed: set[tuple] = set()
        self._launching: set[int] = set()  # ids of servers handed to a launch not yet returned
        self._keeper = _Keeper()
        self._lock = threading.Lock()

    def launch(self, env: dict[str, str], python: str, payload: dict, log_fd: int,
               chan_fd: int) -> ForkedChild | None:
        """A forked trial child, or None when this trial must take the cold path (the reason does not matter
        to the trial: the cold path measures the same thing, only slower to start)."""
        if not self.enabled:
            return None
        key = (python, tuple(sorted(env.items())))
        server = self._take(key)
        if server is None:
            return None
        try:
            return server.launch(payload, log_fd, chan_fd)
        except ForkServerError:
            with self._lock:
                self._drop(server)
            return None
        finally:
            with self._lock:
                self._launching.discard(id(server))

    def _take(self, key: tuple) -> ForkServer | None:
        """An idle server of ``key``'s environment, started if none is, and held for this launch (``_launching``)
        until it returns; None: the cold path. The lock is never held while a server starts (seconds): another
        thread's trial would wait on it meanwhile, unwatched."""
        with self._lock:
            if key in self._failed:
                return None
            for _, dead in [(k, s) for k, s in self._servers if not s.alive()]:
                self._drop(dead)
            free = [s for k, s in self._servers if k == key and not self._busy(s)]
            if free:
                return self._hold(key, free[-1])
            idle = [s for _, s in self._servers if not self._busy(s)]
            while len(self._servers) >= self.max_servers and idle:
                self._drop(idle.pop(0))
        try:
            server = self._keeper.call(lambda: self._start(key[0], dict(key[1])))
        except (ForkServerError, OSError):
            with self._lock:
                self._failed.add(key)
            return None
        with self._lock:
            return self._hold(key, server)

    def _hold(self, key: tuple, server: ForkServer) -> ForkServer:
        """``server``, marked most recently used and taken by a launch (under the lock)."""
        self._servers = [(k, s) for k, s in self._servers if s is not server] + [(key, server)]
        self._launching.add(id(server))
        return server

    def _busy(self, server: ForkServer) -> bool:
        return server.busy or id(server) in self._launching

    def trim(self) -> None:
        """Close idle servers, least recently used first, down to ``max_servers`` (a round by turns, ``trial.lockstep``,
        had one busy server per child at once)."""
        with self._lock:
            idle = [s for _, s in self._servers if not self._busy(s)]
            while len(self._servers) > self.max_servers and idle:
                self._drop(idle.pop(0))

    def pids(self) -> list[int]:
        """The live servers' pids (tests and diagnostics)."""
        return [s.pid for _, s in self._servers if s.alive()]

    def _drop(self, server: ForkServer) -> None:
        self._servers = [(k, s) for k, s in self._servers if s is not server]
        server.close()

    def close(self) -> None:
        with self._lock:
            for _, server in self._servers:  # all at once: each exits as soon as it reads the EOF
                server.hang_up()
            for _, server in list(self._servers):
                self._drop(server)
            self._keeper.stop()  # after its servers: its end would signal them

    def __enter__(self) -> "ForkServers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_default: ForkServers | None = None


def default_servers() -> ForkServers:
    """The process's pool (closed at exit); off when ``AUTOTUNE_FORK_SERVER`` is 0/false/no/off."""
    global _default
    on = os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")
    if _default is None:
        _default = ForkServers()
        atexit.register(_default.close)
    _default.enabled = on
    return _default


@contextlib.contextmanager
def closing_default() -> Iterator[None]:
    """Close the default pool's servers when the block ends (a tuner's run: its servers go with it)."""
    try:
        yield
    finally:
        if _default is not None:
            _default.close()
