"""A trial of N DDP ranks: the trial child starts them as one process group and answers for them as one trial.

With ``Workload.nproc_per_node`` > 1, the trial child (``worker.main``) measures nothing itself: ``supervise``
starts the ranks with torch's own launcher (``torch.multiprocessing.start_processes``, the ``spawn`` start
method: each rank a fresh interpreter, as ``torchrun`` would start it, so each imports torch and holds its own
memory), relays rank 0's events to the parent as the trial's, and turns the first rank's failure into the
trial's. Everything the runner does for one process holds for N, because the ranks are the trial child's
children: they are in its process group (one kill reaches them and their DataLoader workers), the memory watch
walks the child's tree (host peak = the sum over the ranks and their workers, against the cap), the time limit
kills the tree, and the child adopts their orphans (``machine.proctree``).

Each rank (``rank_main``) joins the group through a file in a private temporary folder (``file://``: no TCP
store listening on a port another local user could reach; gloo binds to the loopback interface unless
``GLOO_SOCKET_IFNAME`` says otherwise), with the trial's time limit as the group's timeout, and runs the trial's
own code with a ``ranks.RankGroup``. On CUDA, rank r drives GPU r with NCCL (``torch.cuda.set_device`` and
``device_id``, so the group is bound to it at once).

One rank fails, the trial fails, and nothing hangs. A rank that raises reports why to the supervisor before it
exits; the supervisor's ``ProcessContext.join`` sees the first exit and kills the rest (those blocked in a
collective included) after a short grace. Which rank's failure is the trial's (``_cause``): an out-of-memory
error on any rank (so the sampler learns the boundary for this world size); else the first rank to exit, unless
what it says is only that a peer left (a collective's error), then a rank that says more. A rank killed by a
signal sends nothing: the trial is ``crashed``, the signal named.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import traceback
from datetime import timedelta
from typing import Any, Callable

from autotune.errors import ConfigError
from autotune.machine.proctree import children_die_with_me, die_with_parent, kill_descendants, take_down_with_parent
from autotune.trial.events import Built, Event, Ranks
from autotune.trial.ranks import RankGroup

__all__ = ["supervise", "rank_main", "check_ranks", "RankFailure", "rank_threads"]

_GRACE_S = 0.5  # after one rank fails, what the others get to exit on their own before SIGTERM, then SIGKILL
_POLL_S = 0.05
# What a rank's collective says when a peer left: the peer's failure is the cause, not this
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
              "DistBackendError", "DistNetworkError", "Socket Timeout", "ProcessGroupGloo")


class RankFailure(Exception):
    """The trial's failure, from one of its ranks: ``trial_kind`` (oom, crashed, workload, error) and that rank's
    traceback; ``worker.main`` reports it as the trial's."""

    def __init__(self, message: str, *, kind: str, rank_traceback: str | None = None) -> None:
        super().__init__(message)
        self.trial_kind, self.rank_traceback = kind, rank_traceback


def check_ranks(workload: Any, *, usable_cores: int, gpus: int, oversubscribe: bool = False) -> None:
    """Refuse, as a ConfigError (one line), a world size this machine cannot run as asked: more ranks than GPUs
    on CUDA (one GPU per rank), more than the usable cores on the CPU unless ``oversubscribe``."""
    n = workload.nproc_per_node
    if n <= 1:
        return
    if workload.device_family == "cuda":
        if workload.device != "cuda":
            raise ConfigError(f"--nproc-per-node {n} with --device {workload.device}: rank r uses GPU r; "
                              "pass --device cuda (choose the GPUs with CUDA_VISIBLE_DEVICES)")
        if n > gpus:
            raise ConfigError(f"--nproc-per-node {n} but {gpus} GPU(s) are visible: one GPU per rank; "
                              f"use --nproc-per-node {max(1, gpus)} or fewer")
    elif n > usable_cores and not oversubscribe:
        raise ConfigError(f"--nproc-per-node {n} but this machine has {usable_cores} usable core(s): ranks would "
                          f"share cores and time each other; use {usable_cores} or fewer, or pass --oversubscribe")


def rank_threads(intra_op_threads: int | None, world_size: int, usable_cores: int) -> int:
    """A rank's intra-op threads: the config's, else the cores shared out (torch would give each rank them all)."""
    return intra_op_threads or max(1, usable_cores // world_size)


def supervise(payload: dict, send: Callable[[Event], None], run: Callable[..., dict]) -> dict:
    """Start the payload's ranks, relay rank 0's events through ``send``, return its ``done`` fields (with
    ``world_size`` and each rank's figures); raise ``RankFailure`` when a rank fails. ``run`` is the trial's own
    code (``worker.run``), given to each rank."""
    import multiprocessing

    import torch.multiprocessing as tmp

    world = int(payload["workload"]["nproc_per_node"])
    # a rank sets its own parent-death signal only once it has imported torch: until then, this process takes the
    # ranks (its process group, its descendants) down with it when its parent dies
    take_down_with_parent(os.getppid(), groups=lambda: [os.getpgrp()])
    _share_threads(payload["config"].get("intra_op_threads"), world)
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    with tempfile.TemporaryDirectory(prefix="autotune-ddp-") as folder:  # 0700: the rendezvous is ours alone
        procs = tmp.start_processes(rank_main, args=(world, payload, [w for _, w in pipes],
                                                     f"file://{folder}/rendezvous", run),
                                    nprocs=world, join=False, start_method="spawn")
        for _, w in pipes:
            w.close()
        send(Ranks(world_size=world, pids=tuple(p.pid for p in procs.processes)))
        readers = {r: i for i, (r, _) in enumerate(pipes)}
        messages: dict[int, dict] = {}
        failed_first = _follow(procs, readers, messages, send, world)
    if failed_first is None and "done" in messages.get(0, {}):
        return messages[0]["done"]
    raise _cause(failed_first, messages, procs)


def _share_threads(threads: int | None, world: int) -> None:
    """Each rank's thread count, in the environment the ranks start with (torch reads OMP_NUM_THREADS when it
    loads, before a rank runs any of our code): the config's, else the usable cores shared out."""
    if threads:
        return  # the trial's environment has it already (launch_env)
    from autotune.machine.hardware import detect
    from autotune.machine.launch_env import THREAD_ENV_VARS

    n = rank_threads(None, world, detect(with_torch=False).usable_cores)
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(n)


def _follow(procs: Any, readers: dict, messages: dict[int, dict], send: Callable[[Event], None], world: int
            ) -> int | None:
    """Relay the ranks' messages until all have exited; returns the first rank that failed (None: none)."""
    from multiprocessing.connection import wait

    import torch.multiprocessing as tmp

    failed = None
    while True:
        for conn in wait(list(readers), timeout=_POLL_S):
            _receive(conn, readers, messages, send, world)
        try:
            if procs.join(timeout=0, grace_period=_GRACE_S):
                break
        except (tmp.ProcessRaisedException, tmp.ProcessExitedException) as exc:  # one exited non-zero: join
            # killed the others
            failed = exc.error_index
            break
    for conn in list(readers):  # what was sent before the exits
        while conn in readers and conn.poll():
            _receive(conn, readers, messages, send, world)
    kill_descendants()  # the ranks' DataLoader workers, orphaned by the kill, were adopted here
    return failed


def _receive(conn: Any, readers: dict, messages: dict[int, dict], send: Callable[[Event], None], world: int) -> None:
    rank = readers[conn]
    try:
        kind, what = conn.recv()
    except (EOFError, OSError):
        del readers[conn]
        return
    if kind != "event":  # a rank's "done" or "failed": the supervisor's to judge (done is main's to send)
        messages.setdefault(rank, {})[kind] = what
    elif rank == 0:  # the trial's events are rank 0's
        send(dataclasses.replace(what, world_size=world) if isinstance(what, Built) else what)


def _cause(first: int | None, messages: dict[int, dict], procs: Any) -> RankFailure:
    """The trial's failure from its ranks' (see the module docstring)."""
    failures = {r: m["failed"] for r, m in messages.items() if "failed" in m}
    for r, f in sorted(failures.items()):
        if f["kind"] in ("oom", "shm"):  # out of memory, or a loader out of shared memory (trial.loader_watch)
            return RankFailure(f"rank {r}: {f['message']}", kind=f["kind"], rank_traceback=f.get("traceback"))
    order = ([first] if first is not None else []) + [r for r in sorted(failures) if r != first]
    said = [r for r in order if r in failures and not failures[r].get("peer_gone")]
    if first is not None and first not in failures:  # it said nothing: killed, or exited on its own
        code = procs.processes[first].exitcode
        if code is not None and code < 0:
            import signal

            sig = signal.Signals(-code).name
            why = f"killed by {sig}" + (" (possibly the kernel's OOM killer)" if sig == "SIGKILL" else "")
        else:
            why = f"exited with code {code} without a result"
        return RankFailure(f"rank {first} {why}; the trial's other ranks were stopped", kind="crashed")
    r = (said or order or [None])[0]
    if r is None:
        return RankFailure("the ranks exited without a result", kind="crashed")
    f = failures[r]
    where = "" if f["kind"] == "workload" else f"rank {r}: "  # the workload's fault is every rank's: said as is
    return RankFailure(f"{where}{f['message']}", kind=f["kind"], rank_traceback=f.get("traceback"))


# --- in each rank ---------------------------------------------------------------------------------------------

def rank_main(rank: int, world: int, payload: dict, writers: list, init_method: str,
              run: Callable[..., dict]) -> None:
    """One rank (started by ``supervise``): join the group, run the trial's code, report to the supervisor."""
    import multiprocessing

    # torch's spawn asks for SIGINT, which a rank in a collective may never handle; a supervisor gone while this
    # rank imported torch left it orphaned already (it goes now)
    supervisor = multiprocessing.parent_process()
    die_with_parent(supervisor.pid if supervisor is not None else None)
    children_die_with_me()  # its DataLoader workers
    conn = writers[rank]
    for i, w in enumerate(writers):
        if i != rank:
            w.close()

    def send(event: Event) -> None:  # the trial's own events (``trial.events``); rank 0's are relayed
        conn.send(("event", event))

    try:
        out = _run_rank(rank, world, payload, init_method, run, send)
        if rank == 0:
            conn.send(("done", out))
        code = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, which decides for the trial
        conn.send(("failed", _failure(exc)))
        code = 1
    conn.close()
    kill_descendants()
    os._exit(code)  # no interpreter teardown: DataLoader workers and the group's threads can hang it


def _run_rank(rank: int, world: int, payload: dict, init_method: str, run: Callable[..., dict],
              send: Callable[[Event], None]) -> dict:
    import torch
    import torch.distributed as dist

    from autotune.machine.device import get_device

    workload, spec = payload["workload"], payload["measure"]
    cuda = workload.get("device", "cpu") != "cpu"
    if not cuda and "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # one node: nothing of the group reachable from elsewhere
    dev = get_device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(spec.get("timeout_s", 600.0))),
                            device_id=torch.device("cuda", rank) if cuda else None)
    group = RankGroup(rank, world, dev, seed=int(spec.get("seed", 0)),
                      collective_device=torch.device("cuda", rank) if cuda else "cpu",
                      device_ids=[rank] if cuda else None, measured=int(spec.get("windows", 1)))
    out = run(payload, send, device=dev, ranks=group)
    dist.destroy_process_group()  # not on a failure: a peer may be gone, and the rank exits at once anyway
    return out


def _failure(exc: BaseException) -> dict:
    """The ``failed`` fields of a rank's exception, as ``worker.main`` classifies one process's."""
    from autotune.errors import WorkloadError
    from autotune.machine.oom import is_oom

    text = f"{type(exc).__name__}: {exc}"
    kind = "oom" if is_oom(exc) else "workload" if isinstance(exc, WorkloadError) else "error"
    kind = getattr(exc, "trial_kind", None) or kind  # a loader out of shared memory (trial.loader_watch)
    tb = traceback.format_exc()
    print(tb, flush=True)  # the trial's log keeps every rank's
    return {"kind": kind, "message": text.splitlines()[0][:500], "traceback": tb[-8000:],
            "peer_gone": any(m in text or m in type(exc).__name__ for m in _PEER_GONE)}
