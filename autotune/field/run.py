"""``FieldRun``: the hooks that time the user's run, thin enough to leave it as it was.

Steps end at torch's global optimizer step post hook (``steps="optimizer"``: ``rec.apply()``) or where a
framework's batch hook says (``steps="callback"``: Lightning, Hugging Face). A batch arrives when the loop hands it
to ``prepare_input`` (or a framework's batch-start hook); its samples are its leading dimension, else the
recommendation's batch x accumulation steps. The data wait is the time from a step's end to the next batch's
arrival. With autograd off (``torch.inference_mode()``, ``no_grad``) batches are inference: their own windows,
and, inside a training run, the loop's own work outside the step (evaluation), not the data wait.

What a hook does in the training thread is a clock read and a few additions (a window's close adds the watch's
arithmetic; the first step notes which CUDA device the loop runs on, once CUDA is initialised); the host's state
(and the GPU's, through NVML) is sampled and the record written in the run's own daemon thread. Anything that
raises inside turns the field run off with one line and leaves the training alone.

Under DDP each rank measures itself and keeps its own record, tagged with the launch's ``group``; at the end rank 0
reads the other ranks' records of its group from the study (``peers``) and logs one line of the ranks' figures
(``judge.ranks_line``). No collective: a rank that died or never reports is waited for ``FieldSpec.peer_wait_s``
at most, then named as missing.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import datetime as _dt
from dataclasses import dataclass
from typing import Any, Callable

from autotune.errors import ConfigError
from autotune.field.judge import Claim, ranks_line, reasons, verdict
from autotune.field.watch import DriftWatch
from autotune.field.windows import Windows

__all__ = ["FieldSpec", "FieldRun", "batch_samples", "MIN_JUDGED_WINDOWS", "KEPT_WINDOWS", "PEER_START_S"]

MIN_JUDGED_WINDOWS = 3  # settled windows before the run is compared with the trials
KEPT_WINDOWS = 240      # the record keeps the first and the last windows, at most this many in all
PEER_START_S = 600.0    # a rank's record counts for rank 0's line only if it started within this of rank 0's


@dataclass(frozen=True)
class FieldSpec:
    """How the user's run is measured: windows of ``window_s`` seconds (and ``min_steps`` steps), the record kept
    every ``keep_every_s`` seconds, the host sampled every ``host_every_s``, the drift watch on or off; under DDP
    rank 0 waits up to ``peer_wait_s`` at the end for the other ranks' records."""

    window_s: float = 10.0
    min_steps: int = 2
    keep_every_s: float = 60.0
    host_every_s: float = 2.0
    watch: bool = True
    sustained: int = 3
    peer_wait_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("window_s", "keep_every_s", "host_every_s", "peer_wait_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"FieldSpec {name}={v!r}: a positive number of seconds")
        for name in ("min_steps", "sustained"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"FieldSpec {name}={v!r}: a whole number >= 1")


def batch_samples(x: Any) -> int | None:
    """The leading dimension of the first tensor in a batch of any structure; None when it has none."""
    if hasattr(x, "shape"):
        return int(x.shape[0]) if len(x.shape) else None
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        for item in x:
            n = batch_samples(item)
            if n is not None:
                return n
    return None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class FieldRun:
    """One measured run of the user's training. ``start()``, then the hooks; ``line()`` at any time; ``stop()``."""

    def __init__(self, claim: Claim, *, spec: FieldSpec | None = None, sink: Callable[[dict], None] | None = None,
                 log: Callable[[str], None] = _stderr, source: str = "apply", steps: str = "optimizer",
                 rank: int = 0, world_size: int = 1, accumulation: int = 1, fingerprint: str | None = None,
                 trial_wait: Callable[[], float | None] | None = None,
                 on_end: Callable[[dict], None] | None = None, group: str | None = None,
                 peers: Callable[[], list[dict]] | None = None) -> None:
        if steps not in ("optimizer", "callback"):
            raise ConfigError(f"FieldRun steps={steps!r}: 'optimizer' (torch's step hook) or 'callback'")
        self.claim, self.spec = claim, spec or FieldSpec()
        self.source, self.steps_from, self.rank, self.world_size = source, steps, rank, world_size
        self._sink, self._log, self._fingerprint = sink, log, fingerprint
        self._on_end = on_end  # given the last record in the thread that ends the run (MLflow's active run)
        self._trial_wait = trial_wait  # reads the trials' data wait (the study), in the run's own thread
        self._accum = max(1, int(accumulation))  # micro-batches per step: a batch seen is one micro-batch
        self.group, self._peers = group, peers  # the launch's ranks share a group; peers() reads the kept records
        self._cuda_index: int | None = None  # the CUDA device the loop runs on, noted at the first step
        self.train = Windows(self.spec.window_s, self.spec.min_steps)
        self.infer = Windows(self.spec.window_s, self.spec.min_steps)
        self.watch = DriftWatch(sustained=self.spec.sustained, started_wall=time.time()) if self.spec.watch else None
        self.off: str | None = None   # why the field run stopped measuring, if it did
        self.kept: str | None = None  # why the record is not kept, if it is not
        self.steps = 0        # optimizer steps (or a framework's training batches)
        self.infer_steps = 0  # inference batches (autograd off)
        self.thread_cpu_s = 0.0  # the CPU time the run's own thread took (set-up, host figures, writing the record)
        self.state = "new"
        self.paused = False  # ``pause``d: the hooks do nothing until ``resume``
        self.run_id = (f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{socket.gethostname()}"
                       f"-{os.getpid()}-r{rank}")
        self._host: dict = {}
        self._t0, self._wall0 = time.perf_counter(), time.time()  # set again by start()
        self._hook = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reset_step()
        self._last_end: float | None = None
        self._infer_sig: tuple | None = None
        self._infer_last: float | None = None
        self._infer_samples = 0

    # --- the hooks (training thread) -------------------------------------------------------------------------
    def _reset_step(self) -> None:
        self._arrived: float | None = None
        self._samples: int | None = None
        self._eval_from: float | None = None

    def batch(self, x: Any) -> None:
        """A batch reached the loop (``prepare_input``): its arrival and samples; under no autograd, inference."""
        if self.off is not None or self.paused:
            return
        try:
            import torch

            now = time.perf_counter()
            if not torch.is_grad_enabled():
                self._infer_batch(x, now)
            elif self._arrived is None:
                self._arrived, self._samples = now, batch_samples(x)
        except Exception as exc:  # noqa: BLE001 - nothing in the field run may stop the training
            self._fail(exc)

    def _infer_batch(self, x: Any, now: float) -> None:
        # an inference step starts at each batch shaped as the first one (the inputs, not the targets after them)
        first = x[0] if isinstance(x, (list, tuple)) and x else x
        sig = (type(first).__name__, len(getattr(first, "shape", ())))
        if self._infer_sig is None:
            self._infer_sig = sig
        if sig != self._infer_sig:
            return
        if self._last_end is not None and self._arrived is None and self._eval_from is None:
            self._eval_from = now  # evaluation between two training steps: the loop's own work
        self.infer_steps += 1
        if self._infer_last is not None:
            self.infer.add(period_s=now - self._infer_last, samples=self._infer_samples, wait_s=0.0, outside_s=0.0,
                           now_s=now - self._t0, host=self._host)
        self._infer_last, self._infer_samples = now, batch_samples(x) or self.claim.samples_per_step

    def step_end(self, *_: Any) -> None:
        """An optimizer step (or a framework's batch) ended."""
        if self.off is not None or self.paused:
            return
        try:
            now = time.perf_counter()
            self.steps += 1
            if self.steps == 1:
                self._note_device()
            self._infer_last = None  # an inference step does not span a training step
            if self._last_end is not None:
                arrived = self._arrived if self._arrived is not None else self._last_end
                cut = self._eval_from if self._eval_from is not None else arrived
                samples = (self._samples * self._accumulation() if self._samples else self.claim.samples_per_step)
                w = self.train.add(period_s=now - self._last_end, samples=samples,
                                   wait_s=max(0.0, cut - self._last_end), outside_s=arrived - cut,
                                   now_s=now - self._t0, host=self._host)
                if w is not None and self.watch is not None:
                    self._watch(w)
            self._last_end = now
            self._reset_step()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _note_device(self) -> None:
        """The CUDA device this thread runs on (the current device is per thread: the field run's own thread would
        see device 0), where CUDA is initialised; never initialises it."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            self._cuda_index = torch.cuda.current_device()

    def _watch(self, w) -> None:
        """The drift watch on a closed window; a failure in it turns the watch off alone, with one line."""
        try:
            line = self.watch.on_window(w, len(self.train.closed) - 1)
        except Exception as exc:  # noqa: BLE001
            self.watch = None
            self._log(f"autotune field: the watch stopped ({type(exc).__name__}: {exc}); the run is still measured")
            return
        if line and self.rank == 0:
            self._log(line)

    def batch_start(self, batch: Any = None) -> None:
        """A framework's batch-start hook: a training batch arrived (``batch``: None where the framework shows none:
        its samples are then the recommendation's)."""
        if self.off is not None or self.paused or self._arrived is not None:
            return
        try:
            self._arrived, self._samples = time.perf_counter(), None if batch is None else batch_samples(batch)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def evaluating(self) -> None:
        """A framework's evaluation batch: between two training steps it is the loop's own work, not the data wait."""
        if self.off is None and self._last_end is not None and self._arrived is None and self._eval_from is None:
            self._eval_from = time.perf_counter()

    def _accumulation(self) -> int:
        return self._accum

    def _fail(self, exc: BaseException) -> None:
        if self.off is None:
            self.off = f"{type(exc).__name__}: {exc}"
            self._remove_hook()
            self._log(f"autotune field: measuring stopped ({self.off}); your training goes on unmeasured")

    # --- start, stop, the run's own thread ---------------------------------------------------------------------
    def start(self) -> "FieldRun":
        """Registers the step hook (``steps="optimizer"``) and starts the run's thread; never raises."""
        self._t0, self._wall0 = time.perf_counter(), time.time()
        self.state = "running"
        try:
            if self.steps_from == "optimizer":
                from torch.optim.optimizer import register_optimizer_step_post_hook

                self._hook = register_optimizer_step_post_hook(self.step_end)
            self._thread = threading.Thread(target=self._loop, name="autotune-field", daemon=True)
            self._thread.start()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        return self

    def pause(self) -> None:
        """Measures nothing until ``resume``: torch's step hook removed, batches and framework hooks ignored, the
        run's thread reading no host figure and keeping nothing (what ``benchmarks/field.py`` times its 'off' blocks
        against: everything the field run does is in the 'on' blocks alone). Never raises."""
        self.paused = True
        self._remove_hook()

    def resume(self) -> None:
        """Measures again after ``pause``: the pause is no step and no data wait, so the next step only starts the
        count again (as the first step of the run does). Never raises."""
        if self.state != "running" or self.off is not None or not self.paused:
            return
        self._last_end = None
        self._reset_step()
        self.paused = False
        try:
            if self.steps_from == "optimizer" and self._hook is None:
                from torch.optim.optimizer import register_optimizer_step_post_hook

                self._hook = register_optimizer_step_post_hook(self.step_end)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _remove_hook(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()

    def _loop(self) -> None:
        """Samples the host and keeps the record at intervals, until ``stop``; each part turns itself off alone."""
        sampler = None
        try:
            from autotune.field.host import HostSampler

            sampler = HostSampler()
            if self._fingerprint is None:
                from autotune.machine.hardware import detect

                self._fingerprint = detect(with_torch=False).fingerprint
        except Exception as exc:  # noqa: BLE001 - no host figures, the run is still measured
            self._log(f"autotune field: host figures off ({type(exc).__name__}: {exc})")
        try:
            if self._trial_wait is not None and self.claim.data_wait_share is None:
                import dataclasses

                self.claim = dataclasses.replace(self.claim, data_wait_share=self._trial_wait())
        except Exception:  # noqa: BLE001, S110 - the study unreadable: the line says the trials' wait is not known
            pass
        kept_at = time.monotonic()
        device: Any = None  # the GPU's sampler, once the first step said which CUDA device; False: off
        while not self._stop.is_set() and self.off is None:
            if self.paused:  # measuring nothing: no host figure is read, nothing new to keep
                self._stop.wait(self.spec.host_every_s)
                continue
            host: dict = {}
            if sampler is not None:
                try:
                    host = sampler.sample()
                except Exception as exc:  # noqa: BLE001
                    sampler = None
                    self._log(f"autotune field: host figures off ({type(exc).__name__}: {exc})")
            if device is None and self._cuda_index is not None:
                device = self._device_sampler()
            if device:
                try:
                    host.update(device.sample())
                except Exception as exc:  # noqa: BLE001
                    device = False
                    self._log(f"autotune field: GPU figures off ({type(exc).__name__}: {exc})")
            self._host = host
            if time.monotonic() - kept_at >= self.spec.keep_every_s:
                self._keep()
                kept_at = time.monotonic()
            self.thread_cpu_s = time.thread_time()  # this thread's CPU since it started, its set-up included
            self._stop.wait(self.spec.host_every_s)

    def _device_sampler(self) -> Any:
        """NVML's view of the loop's CUDA device (``host.DeviceSampler``); False, said in one line, where NVML cannot
        be read (no driver library in the container, say): the run is still measured."""
        try:
            from autotune.field.host import DeviceSampler

            return DeviceSampler.of_cuda(self._cuda_index)
        except Exception as exc:  # noqa: BLE001
            self._log(f"autotune field: GPU figures off ({type(exc).__name__}: {exc})")
            return False

    def _keep(self) -> None:
        """Writes the record (the sink: the study); a failure stops the writes, with one line, not the run."""
        if self._sink is None or self.kept is not None:
            return
        try:
            self._sink(self.to_dict())
        except Exception as exc:  # noqa: BLE001
            self.kept = f"{type(exc).__name__}: {exc}"
            self._log(f"autotune field: this run's figures are not kept ({self.kept})")

    def stop(self, *, log: bool = True) -> str:
        """Ends the run: the hook removed, the record written a last time (waiting 10 s at most), the line logged
        (rank 0) and returned. Never raises."""
        if self.state != "running":
            return self.line()
        self.state = "ended"
        try:
            self._remove_hook()
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=5)
            writer = threading.Thread(target=self._keep, name="autotune-field-keep", daemon=True)
            writer.start()
            writer.join(timeout=10)
            if writer.is_alive():
                self._log("autotune field: the last write of this run's figures is still waiting for the study "
                          "after 10 s; left to finish as the process exits")
            line = self.line()
            if self._on_end is not None:
                self._on_end(self.to_dict())
        except Exception as exc:  # noqa: BLE001
            line = f"autotune field: could not end the measurement ({type(exc).__name__}: {exc})"
        if log and self.rank == 0:
            self._log(line)
            if self.world_size > 1:
                self._log(self.ranks())
        return line

    def ranks(self) -> str:
        """Rank 0's line of every rank's figures (``judge.ranks_line``), from the records the ranks of this launch
        (``group``) kept, waiting ``FieldSpec.peer_wait_s`` at most for those not kept yet. Never raises."""
        if self._peers is None or not self.group:
            return (f"autotune field: the other {self.world_size - 1} rank(s)' figures are not known here: no study "
                    "holds their records")
        deadline = time.monotonic() + self.spec.peer_wait_s
        mine = self.to_dict()
        while True:
            try:
                others = self._peer_records()
            except Exception as exc:  # noqa: BLE001
                return f"autotune field: the other ranks' records could not be read ({type(exc).__name__}: {exc})"
            if len(others) >= self.world_size - 1 or time.monotonic() >= deadline:
                return ranks_line({0: mine, **others}, self.world_size, waited_s=self.spec.peer_wait_s)
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _peer_records(self) -> dict[int, dict]:
        """The other ranks' ended records of this launch: per rank, the one that started nearest this run (an
        earlier launch on the same address and port has the same group; it started before this one ended)."""
        out: dict[int, tuple[float, dict]] = {}
        for r in self._peers():
            rank = r.get("rank")
            if (r.get("group") != self.group or not isinstance(rank, int) or not 0 < rank < self.world_size
                    or r.get("state") not in ("ended", "off")):
                continue
            try:
                gap = abs(_dt.datetime.fromisoformat(str(r.get("started"))).timestamp() - self._wall0)
            except ValueError:
                continue
            if rank not in out or gap < out[rank][0]:
                out[rank] = (gap, r)
        return {rank: r for rank, (gap, r) in out.items() if gap <= PEER_START_S}

    # --- what it says -------------------------------------------------------------------------------------------
    def _judged_windows(self) -> Windows:
        return self.infer if self.claim.task == "infer" else self.train

    def other_hardware(self) -> bool:
        return bool(self._fingerprint and self.claim.fingerprint and self._fingerprint != self.claim.fingerprint)

    def verdict(self) -> str | None:
        ws = self._judged_windows()
        s = ws.summary()
        if s is None or s.n < MIN_JUDGED_WINDOWS or self.other_hardware():
            return None
        return verdict(s.median, self.claim.range())

    def line(self) -> str:
        """The run against the trials in one line (``run.field()``)."""
        ws = self._judged_windows()
        s, c = ws.summary(), self.claim
        off = f" (measuring stopped: {self.off})" if self.off else ""
        if s is None or s.n < MIN_JUDGED_WINDOWS:
            steps = self.infer_steps if ws is self.infer else self.steps
            return (f"autotune field: too short to judge{off}: {steps} steps, {len(ws.closed)} windows of "
                    f"{self.spec.window_s:g} s ({MIN_JUDGED_WINDOWS} settled windows needed after up to "
                    "2 of warm-up)")
        settled = ws.settled()
        wait = sorted(w.wait_share for w in settled)[len(settled) // 2]
        head = (f"autotune field: your run {s.median:.1f} samples/s (median of {s.n} settled {self.spec.window_s:g} s "
                f"windows, IQR {100 * s.rel_iqr:.1f}%){off}")
        if self.other_hardware():
            return (f"{head}; on other hardware than the trials (this machine {self._fingerprint}, the trials' "
                    f"{c.fingerprint}): not counted as evidence for this recommendation")
        if c.median_samples_per_s is None:
            return f"{head}; the trials stated no samples/s for this config (its confirmation failed): not compared"
        rng = c.range()
        v = verdict(s.median, rng)
        gap = f"{100 * (s.median / c.median_samples_per_s - 1):+.0f}%"
        if v is None:
            judged = ("not judged: the trials kept no spread of fresh processes (fewer than 2 confirmation rounds)")
        elif v == "within":
            judged = f"within the spread of fresh processes of this config (95% range {rng[0]:.1f} to {rng[1]:.1f})"
        else:
            judged = f"{v} the trials' 95% range for a fresh process ({rng[0]:.1f} to {rng[1]:.1f})"
        tw = c.data_wait_share
        out = (f"{head} vs the trials' {c.median_samples_per_s:.1f} ({gap}): {judged}; data wait "
               f"{100 * wait:.0f}% of a step (the trials: {'not known' if tw is None else f'{100 * tw:.0f}%'})")
        if v == "below":
            why = reasons(settled, ref_wait=tw, ref_rate=c.median_samples_per_s, ref_rss_mb=c.peak_host_mb)
            out += "; likely: " + "; ".join(why) if why else "; no cause measured (data wait, memory and the cores " \
                "other processes took are as in the trials)"
        return out

    def to_dict(self) -> dict:
        """The record kept in the study: what ran where, the figures, the verdict, the episodes, the windows."""
        ws = self._judged_windows()
        s = ws.summary()
        settled = ws.settled()
        closed = ws.closed
        kept = closed if len(closed) <= KEPT_WINDOWS else closed[:KEPT_WINDOWS // 4] + closed[-3 * KEPT_WINDOWS // 4:]
        return {
            "run_id": self.run_id, "source": self.source, "rank": self.rank, "world_size": self.world_size,
            "group": self.group,
            "host": socket.gethostname(), "pid": os.getpid(), "fingerprint": self._fingerprint,
            "other_hardware": self.other_hardware(),
            "started": _dt.datetime.fromtimestamp(self._wall0, _dt.timezone.utc).replace(microsecond=0).isoformat(),
            "updated": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "state": "off" if self.off else self.state, "off": self.off, "task": self.claim.task,
            "steps": self.steps, "window_s": self.spec.window_s, "windows": len(closed),
            # what measuring took of the machine beside the hooks: the run's thread's CPU seconds since it started
            "field_thread_cpu_s": round(self.thread_cpu_s, 4),
            "settled_windows": len(settled),
            "median_samples_per_s": None if s is None else round(s.median, 3),
            "iqr_samples_per_s": None if s is None else round(s.iqr, 3),
            "data_wait_share": (round(sorted(w.wait_share for w in settled)[len(settled) // 2], 4)
                                if settled else None),
            "verdict": self.verdict(), "line": self.line(), "claim": self.claim.to_dict(),
            "episodes": self.watch.to_dict() if self.watch else [],
            "window_list": [w.to_dict() for w in kept], "windows_dropped": len(closed) - len(kept),
        }
