"""The parent side of one trial: start a fresh child, watch it, contain it, and turn what happened into a result.

The child (``worker.py``) measures; the parent only watches: it reads the child's streamed events (the typed
schema of ``events.py``, shared with the child), reads the
kernel's memory high-water marks of the child and its DataLoader workers (``memwatch.MemoryWatch``), and kills the whole
process group at the memory cap, at the time limit, or when ``on_window`` asks to stop (pruning). The parent
never times anything itself.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from autotune.machine.launch import SAFE_PATH_ENV, python_command, with_package_path
from autotune.machine.malloc import PRELOAD_LIBS, install_hint, preload_path
from autotune._units import format_mb
from autotune.config import MeasureSpec, TrialConfig, TrialResult, Workload
from autotune.machine.launch_env import clean_env, launch_env
from autotune.errors import ConfigError
from autotune.trial import events
from autotune.trial.events import Built, Done, Event, Failed, Ranks, Turn, Warmup, Window
from autotune.trial.forkserver import ForkServers, default_servers, forkable
from autotune.machine.limits import MIN_MEMORY_CAP_MB, check_min_cap
from autotune.measure import median_or_none
from autotune.trial.loader_watch import LostBatchWatch
from autotune.trial.lockstep import Gate
from autotune.trial.memwatch import MemoryWatch
from autotune.trial.triallog import CappedLog

__all__ = ["run_trial", "MIN_MEMORY_CAP_MB", "child_env", "WindowCallback"]

_POLL_S = 0.05
_MEMORY_EVERY_S = 0.1

# on_window(index, samples_per_s) -> True to stop the trial now (pruned)
WindowCallback = Callable[[int, float], bool]
# on_event(event) with each event the child sends, as its line's dict (``events.to_dict``; ``events.from_dict`` reads
# it back typed)
EventCallback = Callable[[dict], None]


def child_env(config: TrialConfig, base: dict[str, str] | None = None, *,
              compile_cache_dir: str | Path | None = None, placement: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: a clean room (``launch_env.clean_env``: the shell's thread, allocator and preload
    variables cleared, for the baseline and every candidate alike), then what the config needs from the start
    (OpenMP/MKL read their thread counts once, at load, and glibc its malloc settings at the first allocation).
    ``placement``: what the place the trial runs in bounds, under the config (Ray's GPU trials share a node: one
    thread unless the config says). With ``compile_cache_dir`` (a study's, see ``Tuner.compile_cache_dir``),
    inductor's caches (FX graphs, AOTAutograd, compiled kernels; Triton's on a GPU) live there, so a compile
    config's later trials load what its first one compiled."""
    env = clean_env(os.environ if base is None else base)
    env.update(placement or {})
    env.update(launch_env(config))
    if compile_cache_dir is not None:
        cache = Path(compile_cache_dir).resolve()
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        env["TRITON_CACHE_DIR"] = str(cache / "triton")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(SAFE_PATH_ENV)  # what the child starts does not import from the working folder either (_launch)
    # pytest's name for the test running in the parent changes with every test; a fork server serves only its
    # exact environment, so with it each test under pytest would start one (importing torch) for its trials
    env.pop("PYTEST_CURRENT_TEST", None)
    return with_package_path(env)  # importable even when the parent runs from a source checkout


def _kill_tree(proc: subprocess.Popen, memory: MemoryWatch) -> None:
    """SIGKILL the child's tree: its process group (it and its DataLoader workers) and every descendant the
    memory watch saw, in the group or not (``MemoryWatch.kill``); then reap the child and wait for the rest."""
    import psutil

    stragglers = []
    for pid in memory.kill():
        try:
            stragglers.append(psutil.Process(pid))
        except psutil.Error:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
        pass
    psutil.wait_procs(stragglers, timeout=5)


def _killed(proc, sig: str) -> str:
    """Why a child died by signal ``sig``: its fork server died under it (``ForkedChild.lost_server``: said as
    it happened, not taken for an out-of-memory kill), else the signal, SIGKILL being maybe the OOM killer's."""
    lost = getattr(proc, "lost_server", None)
    if lost:
        return lost
    return f"killed by {sig}" + (" (possibly the kernel's OOM killer)" if sig == "SIGKILL" else "")


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _open_log(path: Path, scan: Callable[[bytes], None] | None = None):
    """The trial's log, appended to under a size cap (``CappedLog``), read by ``scan`` as it comes: a link planted at
    its path is refused (one line), not written through."""
    try:
        return CappedLog(path, scan=scan)
    except OSError as exc:
        raise ConfigError(f"cannot write the trial log {path}: "
                          f"{'it is a symbolic link' if exc.errno == errno.ELOOP else exc.strerror}") from None


def run_trial(
    workload: Workload,
    config: TrialConfig,
    measure: MeasureSpec = MeasureSpec(),
    *,
    on_window: WindowCallback | None = None,
    on_event: EventCallback | None = None,
    log_path: str | Path | None = None,
    python: str = sys.executable,
    profile_dir: str | Path | None = None,
    compile_cache_dir: str | Path | None = None,
    servers: ForkServers | None = None,
    placement: dict[str, str] | None = None,
    gate: Gate | None = None,
) -> TrialResult:
    """Measure one config in a fresh child process and return what happened; never raises for trial failures.

    ``on_window(index, samples_per_s)`` is called for each measured window as it arrives; returning True
    stops the trial at once (status ``pruned``); ``on_event`` gets each event's dict (``EventCallback``).
    ``log_path`` keeps the child's stdout/stderr. With ``profile_dir``, the child then profiles a few more steps
    (a Chrome trace and ``top_ops.json`` there, ``autotune.trial.profile``); the measured figures are not affected.
    ``compile_cache_dir``: where inductor caches compiled graphs (``child_env``); default: torch's own.
    ``servers``: the fork servers that start CPU trials without importing torch each time (default: the
    process's own, ``AUTOTUNE_FORK_SERVER=0`` turns them off; ``ForkServers(enabled=False)``: always cold).
    ``placement``: environment the place bounds the trial by, under its config's (``child_env``).
    ``gate``: the child is one of a round's, measuring by turns (``trial.lockstep``; its time stopped between turns is
    off its time limit).

    >>> r = run_trial(Workload(model="resnet18", image_size=32), TrialConfig(batch_size=8),
    ...               MeasureSpec(windows=2, window_s=0.2))   # doctest: +SKIP
    >>> r.status, r.median_samples_per_s > 0                  # doctest: +SKIP
    ('ok', True)
    """
    _check_runnable(workload, config, measure)
    if profile_dir is not None and workload.nproc_per_node > 1:
        raise ConfigError("profiling a trial of several DDP ranks is not supported yet; profile one process")
    own_log = log_path is None
    if own_log:
        fd, tmp = tempfile.mkstemp(prefix="autotune-trial-", suffix=".log")
        os.close(fd)
        log_path = Path(tmp)
    log_path = Path(log_path)
    # a batch a DataLoader worker's queue lost in /dev/shm is seen only in the log (trial.loader_watch)
    lost = LostBatchWatch(config, workload.data, ranks=workload.nproc_per_node)
    if gate is not None:  # its grace runs on the child's own time, not while it stands stopped
        lost.clock = lambda: time.monotonic() - gate.stopped_s()
    log = _open_log(log_path, lost.feed)

    payload = {"workload": workload.to_dict(), "config": config.to_dict(), "measure": measure.to_dict(),
               "spawned_at": time.time()}
    if profile_dir is not None:  # after its windows, the child profiles a few steps into this folder
        payload["profile_dir"] = str(Path(profile_dir).resolve())
    if gate is not None:  # each window at its turn (trial.windows.Turns)
        payload["turns"] = {"path": str(gate.path), "turn_s": gate.turn_s}
    rfd, wfd = os.pipe()
    env = child_env(config, compile_cache_dir=compile_cache_dir, placement=placement)
    servers = default_servers() if servers is None else servers
    t0 = time.monotonic()  # before the launch: a trial that starts a fork server pays for it, as a cold one would
    with log:  # the child's stdout/stderr, under a size cap (autotune.trial.triallog)
        proc = servers.launch(env, python, payload, log.fileno(), wfd) if forkable(workload.device, python) else None
        if proc is None:  # the cold path: a fresh interpreter
            proc = subprocess.Popen(
                python_command(python, "autotune.trial.worker", str(wfd), json.dumps(payload)),
                pass_fds=(wfd,), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,  # own process group: one kill reaches the workers
            )
    os.close(wfd)
    if gate is not None:
        gate.started(proc.pid)
    memory = MemoryWatch(proc.pid, lender=getattr(proc, "server_pid", None))
    channel = _Channel(on_window, on_event, gate)
    try:
        _watch(proc, rfd, channel, memory, measure, t0, lost)
    finally:
        os.close(rfd)
        log.join()  # the tree is gone: the log is complete
    wall_s = time.monotonic() - t0 - (gate.stopped_s() if gate is not None else 0.0)  # its own time, not its turns'
    status, reason, sig, user_error, traceback_text = _verdict(channel, proc, log_path)
    if status in ("ok", "crashed", "timeout") and lost.kind is not None:  # the child did not name it: the log did
        status, reason = "shm", lost.verdict(lost.clock(), _first_batch(channel), ended=True) or reason
    if own_log:
        if status != "ok" and not traceback_text:
            traceback_text = _tail(log_path) or None
        log_path.unlink(missing_ok=True)
    return _result(config, channel, memory, status=status, reason=reason, wall_s=wall_s, sig=sig,
                   traceback_text=traceback_text, user_error=user_error)


def _check_runnable(workload: Workload, config: TrialConfig, measure: MeasureSpec) -> None:
    """Refuse, as a ConfigError, what no child could run: a cap below a start, fp16 on the CPU, a missing
    preloaded allocator."""
    check_min_cap(measure.memory_cap_mb, workload.device)
    if workload.device == "cpu" and config.amp == "fp16":
        raise ConfigError("amp=fp16 is not supported on the CPU; use bf16 or off")
    if config.malloc in PRELOAD_LIBS and preload_path(config.malloc) is None:
        # the loader would skip the missing preload with a warning and the trial would measure glibc's malloc
        raise ConfigError(f"malloc={config.malloc}: {' or '.join(PRELOAD_LIBS[config.malloc])} is not installed "
                          f"here: install it ({install_hint(config.malloc)}) or pick another --malloc")


class _Channel:
    """The child's events as they arrive (JSON lines of ``events``), the measured windows, and the parent's decision
    to stop (``stop``: (status, reason)), which ``on_window`` may make."""

    def __init__(self, on_window: WindowCallback | None, on_event: EventCallback | None, gate: Gate | None = None
                 ) -> None:
        self.on_window, self.on_event, self.gate = on_window, on_event, gate
        self.events: list[Event] = []
        self.windows: list[Window] = []
        self.stop: tuple[str, str] | None = None
        self.buf = b""

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.handle(line)

    def flush(self) -> None:
        for line in self.buf.split(b"\n"):
            if line.strip():
                self.handle(line)
        self.buf = b""

    def handle(self, line: bytes) -> None:
        try:
            ev = events.decode(line)  # EventError (JSON, but not the schema: a bug) goes up, killing the child
        except (json.JSONDecodeError, UnicodeDecodeError):
            return  # not an event: a write the kill cut short
        self.events.append(ev)
        if self.on_event is not None:
            self.on_event(events.to_dict(ev))
        if isinstance(ev, Turn) and self.gate is not None and self.stop is None:
            self.gate.at_gate()
        if isinstance(ev, Window):
            if self.stop is not None:  # arrived after the decision to stop (same read, or drained after the kill)
                return
            self.windows.append(ev)
            if self.on_window is not None and self.on_window(ev.index, ev.samples_per_s):
                self.stop = ("pruned", f"stopped after {len(self.windows)} window(s): cannot beat the best so far")

    def last(self, kind: type[Event]):
        """The last event of ``kind`` the child sent, or None."""
        return next((e for e in reversed(self.events) if isinstance(e, kind)), None)


def _watch(proc, rfd: int, channel: _Channel, memory: MemoryWatch, measure: MeasureSpec, t0: float,
           lost: LostBatchWatch) -> None:
    """Read the child's events, sample its memory and the clock until it ends or the parent ends it (over the
    cap, past the time limit, pruned, a batch lost in /dev/shm: ``lost``); then kill whatever is left of its tree and
    drain the channel."""
    last_mem = 0.0
    try:
        while channel.stop is None:
            ready, _, _ = select.select([rfd], [], [], _POLL_S)
            if ready:
                chunk = os.read(rfd, 65536)
                if not chunk:  # the child closed its end: it is exiting
                    break
                channel.feed(chunk)
            now = time.monotonic()
            if now - last_mem >= _MEMORY_EVERY_S:
                last_mem = now
                over = memory.sample(measure.memory_cap_mb)
                if over is not None:
                    channel.stop = ("over_memory",
                                    f"killed at {format_mb(over)}, over the {format_mb(measure.memory_cap_mb)} cap")
            if channel.stop is None and (why := lost.verdict(lost.clock(), _first_batch(channel))) is not None:
                channel.stop = ("shm", why)
            stopped_s = channel.gate.stopped_s() if channel.gate is not None else 0.0  # a round's turns
            if channel.stop is None and now - t0 - stopped_s > measure.timeout_s:
                channel.stop = ("timeout", f"killed after {measure.timeout_s:.0f} s (time limit)")
            if channel.stop is None and not ready and proc.poll() is not None:
                break
        memory.sample(None)  # a last reading of the tree (the workers at least) before it goes
        if channel.stop is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                channel.stop = ("timeout", "the child did not exit after it closed its channel")
        _kill_tree(proc, memory)  # DataLoader workers hold the pipe open; they go before we drain it
        channel.feed(_drain(rfd))
    except BaseException:  # Ctrl-C or SIGTERM in the parent: the child must not outlive it
        _kill_tree(proc, memory)
        raise
    channel.flush()


def _first_batch(channel: _Channel) -> tuple[float, int] | None:
    """The first batch's bytes and tensors as the child measured them (its ``Warmup``), else None."""
    warm = channel.last(Warmup)
    return (warm.batch_bytes, warm.batch_tensors or 1) if warm is not None and warm.batch_bytes else None


def _verdict(channel: _Channel, proc, log_path: Path) -> tuple[str, str, str | None, bool, str | None]:
    """(status, reason, signal name, the workload's own fault, traceback) from how the trial ended."""
    done, failed, rc = channel.last(Done), channel.last(Failed), proc.returncode
    if channel.stop is not None:
        return (*channel.stop, None, False, None)
    if done is not None:
        return "ok", "", None, False, None
    if failed is not None:
        user_error = failed.kind == "workload"
        return ("error" if user_error else failed.kind), failed.message, None, user_error, failed.traceback
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name
        return "crashed", _killed(proc, sig), sig, False, _tail(log_path)
    return "crashed", f"exited with code {rc} without a result", None, False, _tail(log_path)


def _result(config: TrialConfig, channel: _Channel, memory: MemoryWatch, *, status: str, reason: str,
            wall_s: float, sig: str | None, traceback_text: str | None, user_error: bool) -> TrialResult:
    windows = channel.windows
    return TrialResult(
        status=status,
        reason=reason,
        samples_per_s=tuple(w.samples_per_s for w in windows),
        window_steps=tuple(w.steps for w in windows),
        peak_host_mb=round(memory.peak_mb, 1) if memory.peak_mb else None,
        peak_host_rss_mb=round(memory.peak_rss_mb, 1) if memory.peak_rss_mb else None,
        wall_s=round(wall_s, 3),
        signal=sig,
        traceback=traceback_text,
        batch_size=config.batch_size,
        user_error=user_error,
        tokens_per_s=tuple(w.tokens_per_s for w in windows if w.tokens_per_s is not None),
        **_built_figures(channel.last(Built)),
        **_warmup_figures(channel.last(Warmup)),
        **_done_figures(channel.last(Done), windows),
        **_rank_figures(channel.last(Ranks), channel.last(Done)),
        **_latency_fields(channel.last(Done)),
    )


def _built_figures(built: Built | None) -> dict:
    if built is None:
        return {"device_memory_cap_mb": None, "startup_s": None, "user_parts": (), "worst_case": None}
    return {"device_memory_cap_mb": built.device_memory_cap_mb, "startup_s": built.startup_s,
            "user_parts": tuple(built.user_parts), "worst_case": built.worst_case}


def _latency_fields(done: Done | None) -> dict:
    """The TrialResult fields of the child's step latencies (``trial.latency.percentiles``); none without."""
    if done is None or not done.latency:
        return {}
    return {f"latency_{k}": done.latency[k] for k in ("p50_ms", "p95_ms", "p99_ms", "min_ms")}


def _rank_figures(ranks: Ranks | None, done: Done | None) -> dict:
    """DDP (``trial.ddp``): the world size the child started, each rank's figures when it finished."""
    return {"world_size": ranks.world_size if ranks is not None else 1, "ranks": tuple(done.ranks) if done else ()}


def _warmup_figures(warm: Warmup | None) -> dict:
    if warm is None:
        return {"warmup_s": None, "compile_s": None, "warmup_steps": None, "warmup_windows": (), "settled": None}
    return {"warmup_s": warm.warmup_s, "compile_s": warm.compile_s, "warmup_steps": warm.warmup_steps,
            "warmup_windows": tuple(warm.warmup_windows), "settled": warm.settled, "batch_bytes": warm.batch_bytes,
            "batch_tensors": warm.batch_tensors}


def _done_figures(done: Done | None, windows: list[Window]) -> dict:
    """The figures of the ``Done`` event; without one (a trial that failed or was stopped) the step-time split
    from the windows it measured."""
    waits = median_or_none([w.data_wait_s for w in windows])
    computes = median_or_none([w.compute_s for w in windows])
    if done is None:
        return {"data_wait_s_per_step": waits, "compute_s_per_step": computes, "kernel_cpu_share": None,
                "minor_faults_per_step": None, "peak_device_mb": None, "peak_device_allocated_mb": None,
                "final_loss": None, "samples_per_step": None, "cpu_cores_used": None}
    return {"data_wait_s_per_step": done.data_wait_s_per_step or waits,
            "compute_s_per_step": done.compute_s_per_step or computes,
            "kernel_cpu_share": done.kernel_cpu_share, "minor_faults_per_step": done.minor_faults_per_step,
            "peak_device_mb": done.peak_device_mb, "peak_device_allocated_mb": done.peak_device_allocated_mb,
            "final_loss": done.final_loss, "samples_per_step": done.samples_per_step,
            "cpu_cores_used": done.cpu_cores_used}


def _drain(fd: int) -> bytes:
    out = b""
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 65536):
            out += chunk
    except OSError:
        pass
    return out
