"""The parent side of one trial: start a fresh child, watch it, contain it, and turn what happened into a result.

The child (``_worker.py``) measures; the parent only watches: it reads the child's streamed events, reads the
kernel's memory high-water marks of the child and its DataLoader workers (``_Memory``), and kills the whole
process group at the memory cap, at the time limit, or when ``on_window`` asks to stop (pruning). The parent
never times anything itself.
"""

from __future__ import annotations

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

from ._units import format_mb
from .config import MeasureSpec, TrialConfig, TrialResult, Workload, launch_env
from .errors import ConfigError
from .forkserver import ForkServers, default_servers, forkable
from .limits import MIN_MEMORY_CAP_MB, check_min_cap
from .measure import median_or_none

__all__ = ["run_trial", "MIN_MEMORY_CAP_MB", "child_env", "WindowCallback"]

_POLL_S = 0.05
_MEMORY_EVERY_S = 0.1

# on_window(index, samples_per_s) -> True to stop the trial now (pruned)
WindowCallback = Callable[[int, float], bool]


def child_env(config: TrialConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: OpenMP/MKL read their thread counts once, at load, and glibc its malloc
    settings at the first allocation, so they are set here."""
    env = dict(os.environ if base is None else base)
    env.update(launch_env(config))
    env["PYTHONUNBUFFERED"] = "1"
    # The package must be importable by the child even when the parent runs from a source checkout.
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _kb(path: str) -> dict[bytes, int] | None:
    """The ``kB`` fields of a /proc file (status, smaps_rollup) by name; None when the process is gone."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(b":")
        if rest.endswith(b" kB"):
            fields[key] = int(rest.split()[0])
    return fields


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[1])  # the name in parentheses may hold spaces
    except (OSError, IndexError, ValueError):
        return None


class _Memory:
    """The peak host memory of a process tree (the child and its DataLoader workers) as a bound that a peak
    shorter than a sample cannot slip under, and the memory cap's check. Linux: read from /proc.

    A sampler misses any peak shorter than its interval; the kernel's high-water mark of each process (``VmHWM``
    in /proc/PID/status, the most memory it ever had resident) misses none. But forked DataLoader workers map
    the main process's pages copy-on-write, so a plain sum of VmHWM over the tree (``peak_rss_mb``) counts
    those pages once per worker. So each process ``p`` is charged its high-water mark less the part of its
    resident memory that others in the tree are charged for:

        peak_mb = max over samples of  sum over live p of  VmHWM_p - shared_p
        shared_p = (RssAnon_p - Pss_Anon_p) + (RssShmem_p - Pss_Shmem_p) + (RssFile_p, workers only)

    PSS splits a shared page among its sharers. For anonymous pages they are all in the tree (a cold child was
    started afresh with exec, so its anonymous pages are shared only with its forks; a child forked by a fork
    server shares torch's imported heap with the server too, and the server's part is added: ``_lent``), and shared-memory pages
    are the batches workers hand to the main process. File pages (torch's libraries: hundreds of MiB) are
    shared with every process on the machine that loaded them, so PSS would charge a share that moves with
    whatever else runs (up to 400 MiB here); instead the main process is charged its own in full, as when it
    runs alone, and a worker's are taken to be the main process's libraries and not charged again.

    Why it bounds the true peak: memory a process frees after a peak leaves its RSS but not its VmHWM, so a
    step that touches 300 MiB for a few ms adds 300 MiB, and the sum at the next sample is at least what the
    tree held at any instant since the sample before: each process's part then was at most its VmHWM less its
    shared part then, and the shared part hardly grows in between. It grows at a fork, when the new process
    is charged its share of what it now shares; it moves at an exit; both make every process be read again.
    Otherwise it shrinks page by page as copy-on-write breaks, so a PSS reading up to a second old stands in.
    The tree is re-listed at every sample (0.1 s; /proc's pid list costs 0.1 ms, only new pids are read), so a
    worker started since is counted from the next sample on; one that exits stays counted in the samples it
    was alive for, through its last reading.

    Where it can read low: a spike in a worker's last 0.1 s before it exits; a process that starts and ends
    between two samples; a file a worker alone maps. Where it reads high: peaks of different processes at
    different times are added as if they were simultaneous. The cap is checked against the same bound at
    every sample, with every process's PSS read afresh before a kill.
    """

    _PSS_EVERY_S = 1.0

    def __init__(self, pid: int, *, lender: int | None = None) -> None:
        self.root = pid
        self.lender = lender  # a fork server the root was forked from: what it shares with the tree is the tree's
        self._lent_kb = 0
        self.peak_mb = 0.0
        self.peak_rss_mb = 0.0
        self._live: dict[int, list] = {pid: [0, {}, 0, -1e9]}  # pid -> [VmHWM, status, shared (kB), read at]
        self._outside: set[int] = set()  # pids seen that are not in the tree

    def _relist(self) -> bool:
        """Bring the tree up to date; True when a process joined or left it."""
        try:
            pids = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        except OSError:
            return False
        self._outside &= pids  # a pid that ended may come back as someone else: it is looked at afresh
        changed = False
        new = sorted(pids - self._outside - self._live.keys())
        while new:
            joined = [p for p in new if _ppid(p) in self._live]
            for p in joined:
                self._live[p] = [0, {}, 0, -1e9]
            changed = changed or bool(joined)
            if not joined:
                self._outside.update(new)
                break
            new = [p for p in new if p not in self._live]  # children of the newly joined, if any
        return changed

    def _read(self, *, pss: bool) -> float:
        """Read the tree; with ``pss``, every process's shared part afresh. Returns the bound now, in MiB."""
        for pid in list(self._live):
            status = _kb(f"/proc/{pid}/status")
            if not status or b"VmHWM" not in status:  # exited (or a zombie): counted while it lived
                del self._live[pid]
                pss = True  # what it shared is now another process's alone
            else:
                self._live[pid][:2] = status[b"VmHWM"], status
        now = time.monotonic()
        for pid, rec in list(self._live.items()):
            if pss or now - rec[3] >= self._PSS_EVERY_S:
                rollup = _kb(f"/proc/{pid}/smaps_rollup")
                if rollup is None:  # exited since its status was read (or Linux < 4.14): keep what we had
                    continue
                rec[2], rec[3] = self._shared_kb(rec[1], rollup, root=pid == self.root), now
                if pid == self.root and self.lender is not None:
                    self._lent_kb = self._lent(self.lender, rec[1])
        self.peak_rss_mb = max(self.peak_rss_mb, sum(r[0] for r in self._live.values()) / 1024)
        return (sum(max(0, r[0] - r[2]) for r in self._live.values()) + self._lent_kb) / 1024

    @staticmethod
    def _lent(server: int, root_status: dict) -> int:
        """What a fork server holds for the trial it forked: charged to the tree, the peak is what the trial would
        have held cold, having imported torch itself (tiny model here: 685 MiB cold, 418 forked without this).

        Anonymous: a cold child owns torch's imported heap (~0.4 GiB here); a forked one shares it with the
        server, so PSS charges the tree only part of each such page. The server's part is its ``Pss_Anon`` less
        its private pages (``Private_Dirty``: its anonymous pages are dirty, and those the child copied on
        write are the server's alone). Files: a cold child maps every library page the import touched (~0.3
        GiB); a forked one only those it touches itself, so the root is charged at least the server's file
        pages (a lower bound on the pages the import and the trial touch together). ``peak_rss_mb``, the plain
        sum kept as a diagnostic, is not corrected: forked it reads lower than cold (418 vs 685 MiB, tiny)."""
        rollup, status = _kb(f"/proc/{server}/smaps_rollup"), _kb(f"/proc/{server}/status")
        if not rollup or not status or b"Pss_Anon" not in rollup:  # gone, or Linux < 5.8: nothing added
            return 0
        anon = max(0, rollup[b"Pss_Anon"] - rollup.get(b"Private_Dirty", 0))
        return anon + max(0, status.get(b"RssFile", 0) - root_status.get(b"RssFile", 0))

    @staticmethod
    def _shared_kb(status: dict, rollup: dict, *, root: bool) -> int:
        """The part of a process's resident memory charged to others in the tree (see the class docstring)."""
        if b"Pss_Anon" not in rollup:  # before Linux 5.8: PSS over all kinds, file pages split machine-wide
            return max(0, rollup.get(b"Rss", 0) - rollup.get(b"Pss", 0))
        shared = max(0, status.get(b"RssAnon", 0) - rollup[b"Pss_Anon"])
        shared += max(0, status.get(b"RssShmem", 0) - rollup.get(b"Pss_Shmem", 0))
        return shared + (0 if root else status.get(b"RssFile", 0))

    def sample(self, cap_mb: float | None) -> float | None:
        """Update the peak; return the bound when it is over ``cap_mb`` (confirmed with fresh PSS), else None."""
        mb = self._read(pss=self._relist())
        if cap_mb is not None and mb > cap_mb:
            mb = self._read(pss=True)
        self.peak_mb = max(self.peak_mb, mb)
        return mb if cap_mb is not None and mb > cap_mb else None


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it and its DataLoader workers), then reap it."""
    import psutil

    try:
        stragglers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        stragglers = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in stragglers:  # anything that left the group
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
        pass
    psutil.wait_procs(stragglers, timeout=5)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run_trial(
    workload: Workload,
    config: TrialConfig,
    measure: MeasureSpec = MeasureSpec(),
    *,
    on_window: WindowCallback | None = None,
    on_event: Callable[[dict], None] | None = None,
    log_path: str | Path | None = None,
    python: str = sys.executable,
    profile_dir: str | Path | None = None,
    servers: ForkServers | None = None,
) -> TrialResult:
    """Measure one config in a fresh child process and return what happened; never raises for trial failures.

    ``on_window(index, samples_per_s)`` is called for each measured window as it arrives; returning True
    stops the trial at once (status ``pruned``). ``log_path`` keeps the child's stdout/stderr. With
    ``profile_dir``, the child then runs a few more steps under torch.profiler and writes a Chrome trace and
    ``top_ops.json`` there (see ``autotune.profile``); the measured figures are not affected.
    ``servers``: the fork servers that start CPU trials without importing torch each time (default: the
    process's own, ``AUTOTUNE_FORK_SERVER=0`` turns them off; ``ForkServers(enabled=False)``: always cold).

    >>> r = run_trial(Workload(model="resnet18", image_size=32), TrialConfig(batch_size=8),
    ...               MeasureSpec(windows=2, window_s=0.2))   # doctest: +SKIP
    >>> r.status, r.median_samples_per_s > 0                  # doctest: +SKIP
    ('ok', True)
    """
    check_min_cap(measure.memory_cap_mb)
    if workload.device == "cpu" and config.amp == "fp16":
        raise ConfigError("amp=fp16 is not supported on the CPU; use bf16 or off")

    own_log = log_path is None
    if own_log:
        fd, tmp = tempfile.mkstemp(prefix="autotune-trial-", suffix=".log")
        os.close(fd)
        log_path = Path(tmp)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    spawned_at = time.time()
    payload = {"workload": workload.to_dict(), "config": config.to_dict(), "measure": measure.to_dict(),
               "spawned_at": spawned_at}
    if profile_dir is not None:  # after its windows, the child profiles a few steps into this folder
        payload["profile_dir"] = str(Path(profile_dir).resolve())
    rfd, wfd = os.pipe()
    env = child_env(config)
    servers = default_servers() if servers is None else servers
    t0 = time.monotonic()  # before the launch: a trial that starts a fork server pays for it, as a cold one would
    with open(log_path, "ab") as log:
        proc = servers.launch(env, python, payload, log.fileno(), wfd) if forkable(workload.device, python) else None
        if proc is None:  # the cold path: a fresh interpreter
            proc = subprocess.Popen(
                [python, "-m", "autotune._worker", str(wfd), json.dumps(payload)],
                pass_fds=(wfd,), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,  # own process group: one kill reaches the workers
            )
    os.close(wfd)
    memory = _Memory(proc.pid, lender=getattr(proc, "server_pid", None))
    events: list[dict] = []
    windows: list[dict] = []
    buf = b""
    stop: tuple[str, str] | None = None  # (status, reason) when the parent ends the trial
    last_mem = 0.0

    def handle(line: bytes) -> None:
        nonlocal stop
        try:
            ev = json.loads(line)
        except ValueError:
            return
        events.append(ev)
        if on_event is not None:
            on_event(ev)
        if ev.get("event") == "window":
            if stop is not None:  # arrived after the decision to stop (same read, or drained after the kill)
                return
            windows.append(ev)
            if on_window is not None and stop is None and on_window(ev["index"], ev["samples_per_s"]):
                stop = ("pruned", f"stopped after {len(windows)} window(s): cannot beat the best so far")

    try:
        while stop is None:
            ready, _, _ = select.select([rfd], [], [], _POLL_S)
            if ready:
                chunk = os.read(rfd, 65536)
                if not chunk:  # the child closed its end: it is exiting
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    handle(line)
            now = time.monotonic()
            if now - last_mem >= _MEMORY_EVERY_S:
                last_mem = now
                over = memory.sample(measure.memory_cap_mb)
                if over is not None:
                    stop = ("over_memory",
                            f"killed at {format_mb(over)}, over the {format_mb(measure.memory_cap_mb)} cap")
            if stop is None and now - t0 > measure.timeout_s:
                stop = ("timeout", f"killed after {measure.timeout_s:.0f} s (time limit)")
            if stop is None and not ready and proc.poll() is not None:
                break
        memory.sample(None)  # a last reading of the tree (the workers at least) before it goes
        if stop is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop = ("timeout", "the child did not exit after it closed its channel")
        _kill_tree(proc)  # DataLoader workers hold the pipe open; they go before we drain it
        buf += _drain(rfd)
    except BaseException:  # Ctrl-C or SIGTERM in the parent: the child must not outlive it
        _kill_tree(proc)
        raise
    finally:
        os.close(rfd)
    for line in buf.split(b"\n"):
        if line.strip():
            handle(line)

    wall_s = time.monotonic() - t0
    by = {e.get("event"): e for e in events}
    built, warm, done, failed = by.get("built", {}), by.get("warmup", {}), by.get("done"), by.get("failed")
    rc = proc.returncode
    sig = None
    user_error = False
    traceback_text = None
    if stop is not None:
        status, reason = stop
    elif done is not None:
        status, reason = "ok", ""
    elif failed is not None:
        user_error = failed["kind"] == "workload"
        status, reason = ("error" if user_error else failed["kind"]), failed["message"]
        traceback_text = failed.get("traceback")
    elif rc is not None and rc < 0:
        sig = signal.Signals(-rc).name
        status = "crashed"
        reason = f"killed by {sig}" + (" (possibly the kernel's OOM killer)" if sig == "SIGKILL" else "")
        traceback_text = _tail(log_path)
    else:
        status, reason = "crashed", f"exited with code {rc} without a result"
        traceback_text = _tail(log_path)
    if own_log:
        if status != "ok" and not traceback_text:
            traceback_text = _tail(log_path) or None
        log_path.unlink(missing_ok=True)

    done = done or {}
    return TrialResult(
        status=status,
        reason=reason,
        samples_per_s=tuple(w["samples_per_s"] for w in windows),
        window_steps=tuple(w["steps"] for w in windows),
        data_wait_s_per_step=done.get("data_wait_s_per_step") or median_or_none([w["data_wait_s"] for w in windows]),
        compute_s_per_step=done.get("compute_s_per_step") or median_or_none([w["compute_s"] for w in windows]),
        kernel_cpu_share=done.get("kernel_cpu_share"),
        minor_faults_per_step=done.get("minor_faults_per_step"),
        peak_host_mb=round(memory.peak_mb, 1) if memory.peak_mb else None,
        peak_host_rss_mb=round(memory.peak_rss_mb, 1) if memory.peak_rss_mb else None,
        peak_device_mb=done.get("peak_device_mb"),
        startup_s=built.get("startup_s"),
        warmup_s=warm.get("warmup_s"),
        compile_s=warm.get("compile_s"),
        warmup_steps=warm.get("warmup_steps"),
        final_loss=done.get("final_loss"),
        wall_s=round(wall_s, 3),
        signal=sig,
        traceback=traceback_text,
        batch_size=config.batch_size,
        user_error=user_error,
    )


def _drain(fd: int) -> bytes:
    out = b""
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 65536):
            out += chunk
    except OSError:
        pass
    return out
