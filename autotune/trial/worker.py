"""The child side of one trial. Run as ``python -m autotune.trial.worker FD PAYLOAD_JSON`` by ``runner.py``.

It speaks JSON lines on file descriptor FD (stdout and stderr stay free for the user's code and go to the trial
log), the events of ``autotune.trial.events``: ``Started``, ``Built``, ``Warmup``, one ``Window`` per measured window,
then ``Done`` or ``Failed``. Step times come from the device's step timer; the device is synchronised once per
measured window, never per step (warm-up steps are synchronised one by one, to see when they settle). Thread
settings are applied before torch is imported; everything else happens in ``run``.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from autotune.trial.events import Built, Done, Event, Failed, Profiled, Started, Warmup, encode
from autotune.trial.windows import Turns, measure_windows
from autotune.workloads.contract import StepOut, split_batch
from autotune.machine.proctree import (adopt_orphans, children_die_with_me, die_with_parent, kill_descendants,
                                      loader_workers_die_with_me)

__all__ = ["die_with_parent", "apply_threads", "make_step", "compile_seconds", "run", "main"]

Send = Callable[[Event], None]  # hands one event to the parent


def apply_threads(config: dict) -> None:
    """Set torch's intra/inter-op threads from a config dict (``TrialConfig.to_dict()``); unset means default."""
    import torch

    if config.get("intra_op_threads"):
        torch.set_num_threads(int(config["intra_op_threads"]))
    if config.get("inter_op_threads"):
        torch.set_num_interop_threads(int(config["inter_op_threads"]))  # only legal before any parallel work


def make_step(model: Any, loss_fn: Any, config: Any, dev: Any, *, train: bool,
              parts: Any = None, accumulation_steps: int = 1,
              wrap: Callable[[Any], Any] | None = None) -> Callable[[Any], StepOut]:
    """Put ``model`` on the device as ``config`` asks (channels_last, compile) with the trial's optimizer and
    grad scaler, and return ``step(batch) -> StepOut``: one training step (or one inference forward) under the
    config's autocast. autotune's step never synchronises; fp16's ``GradScaler.step`` does, once a step (it
    reads the found-inf flag), as in any fp16 loop, so that wait is measured as part of fp16's cost. Shared by
    the worker and the parity check (the same arithmetic); ``.scaler`` on the result is its GradScaler or None.

    ``parts`` (a ``workloads.Built``) brings the user's own optimizer, step and count (``autotune.workloads.contract``);
    without them this is autotune's step: SGD with momentum, ``loss_fn(model(x), y)``, ``len(x)`` samples.
    With ``accumulation_steps`` > 1 (a global batch) each call is one micro-batch and the optimizer steps on
    every ``accumulation_steps``-th (``autotune.workloads.global_batch.default_step`` for autotune's own step).
    ``wrap`` (a DDP rank's, ``autotune.trial.ranks``) wraps the model on its device, before it is compiled.
    """
    import torch

    from autotune.workloads.contract import StepContext, count_batch, default_count, make_optimizer, move, user_step
    from autotune.machine.device import channels_last_model

    model = model.to(dev.torch_device())
    if config.channels_last:
        model = channels_last_model(model)  # lazy modules too
    model.train(train)
    ddp = None
    if wrap is not None:
        model = ddp = wrap(model)
    optimizer = make_optimizer(getattr(parts, "optimizer", None), model) if train else None
    scaler = dev.grad_scaler(config.amp) if train else None
    step_model = model if config.compile_mode == "none" else torch.compile(model, mode=config.compile_mode)
    count = getattr(parts, "count", None)
    own_step = getattr(parts, "step", None)
    if own_step is not None or accumulation_steps > 1:
        from autotune.workloads.global_batch import default_step

        ctx = StepContext(config, dev, scaler, loss_fn=loss_fn, train=train, accumulation_steps=accumulation_steps,
                          ddp=ddp)
        stepper = user_step(own_step or default_step, count, step_model, optimizer, ctx)
        stepper.scaler = scaler  # type: ignore[attr-defined]
        return stepper

    def step(batch: Any) -> StepOut:
        counted = count_batch(count, batch) if count is not None else None  # on the host, as loaded
        x, y = split_batch(batch)
        non_blocking = config.pin_memory
        x = move(x, dev, non_blocking=non_blocking, channels_last=config.channels_last)
        if y is not None:
            y = move(y, dev, non_blocking=non_blocking)
        n = counted or (default_count(batch), None)
        if train:
            optimizer.zero_grad(set_to_none=True)
            with dev.autocast(config.amp):
                out = step_model(x)
                loss = loss_fn(out, y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            return StepOut(loss.detach(), out.detach(), *n)
        with torch.inference_mode(), dev.autocast(config.amp):
            out = step_model(x)
            loss = loss_fn(out, y).detach() if (loss_fn and y is not None) else None
        return StepOut(loss, out, *n)

    step.scaler = scaler  # type: ignore[attr-defined]
    return step


def compile_seconds() -> float | None:
    """Wall seconds torch.compile has spent compiling in this process so far, from dynamo's own counters
    (``calculate_time_spent``: every frame compiled, plus the backward graphs compiled lazily at the first
    backward); None where this torch does not keep them. Loading a graph from inductor's cache counts too,
    at what the load cost."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        return float(calculate_time_spent()["total_wall_time"])
    except (ImportError, AttributeError, KeyError, TypeError):
        return None


def run(payload: dict, send: Send, *, device: Any = None, ranks: Any = None) -> dict:
    """Build the workload, warm up, measure the windows; return the ``done`` event's fields.

    ``device`` stands in for ``get_device(workload.device)`` (tests pass a fake one to count synchronisations).
    ``ranks``: this process is one DDP rank (``autotune.trial.ranks.RankGroup``: its model wrapped, its shard of
    the data, its steps led by rank 0); a follower returns its own figures only.
    """
    from autotune.config import MeasureSpec, TrialConfig, Workload

    workload = Workload.from_dict(payload["workload"])
    config = TrialConfig.from_dict(payload["config"])
    spec = MeasureSpec.from_dict(payload["measure"])

    import torch

    apply_threads(payload["config"])
    torch.manual_seed(spec.seed)

    from autotune.machine.device import get_device
    from autotune.workloads.build import build

    dev = device if device is not None else get_device(workload.device)
    dev.prepare(config, memory_cap_mb=spec.device_memory_cap_mb)  # on CUDA the allocator enforces the cap
    built = build(workload, seed=spec.seed, config=config)
    train = workload.task == "train"
    from autotune.workloads.global_batch import accumulation_steps

    accumulation = accumulation_steps(workload.global_batch, config.batch_size,  # 1 without a global batch
                                      world_size=workload.nproc_per_node)
    train_step = make_step(built.model, built.loss_fn, config, dev, train=train, parts=built,
                           accumulation_steps=accumulation,
                           wrap=ranks.wrapper(config) if ranks is not None and train else None)
    from autotune.trial.loader_watch import LoaderWatch
    from autotune.workloads.contract import loader_kwargs, steps_per_epoch

    kw = loader_kwargs(built, config, spec.seed)
    if config.num_workers:  # whatever the start method (spawn, forkserver: no fork hook runs in the worker)
        kw["worker_init_fn"] = loader_workers_die_with_me(kw.get("worker_init_fn"))
    loader = torch.utils.data.DataLoader(built.dataset, **(kw if ranks is None else ranks.shard(kw, built.dataset)))
    # the first batch's bytes; a loader out of memory named; a batch no probe sized, collated before the workers
    watch = LoaderWatch(config, workload.data, ranks=workload.nproc_per_node, built=built)
    watch.check_full_batch(None if spec.worst_case else loader)
    loader, train_step, latency, worst = _measured_step(built, config, spec, dev, train, train_step, loader)
    if spec.part != "full":  # one ceiling alone: the model on a batch on the device, or the data path alone
        from autotune.trial.parts import alone

        loader, train_step = alone(spec.part, built, loader, train_step, config, dev)
    per_epoch = steps_per_epoch(loader)
    if per_epoch == 0:
        raise ValueError(f"the dataset has {len(built.dataset)} samples, fewer than one batch of {config.batch_size}")
    send(Built(startup_s=time.time() - payload["spawned_at"], steps_per_epoch=per_epoch,
               accumulation_steps=accumulation, user_parts=tuple(built.user_parts),
               device_memory_cap_mb=getattr(dev, "memory_cap_mb", None),
               worst_case=worst))  # said now: a kill over the cap still names the worst-case batch

    from autotune.trial.parts import tree_cpu_s

    with watch:
        stepper = _Stepper(loader, train_step, accumulation, dev.step_timer(), config.amp, watch=watch)
        if ranks is not None:  # the followers take rank 0's steps; rank 0 measures them all
            if ranks.rank != 0:
                return ranks.follow(stepper)
            stepper = ranks.lead(stepper)
        warm = _warm_up(stepper, dev, spec, compiling=config.compile_mode != "none", watch=watch)
        # a round measured by turns (trial.lockstep): each window at its turn, the waits off the clock
        turns = (Turns(payload["turns"]["path"], send, payload["turns"]["turn_s"])
                 if payload.get("turns") and ranks is None else None)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)  # all of this process's threads, not its DataLoader workers
        tree0 = tree_cpu_s(whole_trial=ranks is not None)  # N ranks: rank 0 reads the trial's whole tree
        totals = measure_windows(stepper, spec, warm, send, turns)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    tree1 = tree_cpu_s(whole_trial=ranks is not None)
    waited = turns.waited_s if turns is not None else 0.0  # stopped by the parent: no CPU, no wall of its own
    user, kernel = ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime
    out = {
        # time the kernel spent for the training process (page faults, zeroing pages, syscalls) as a share of its
        # CPU time while measuring: high when the allocator hands memory back and faults it in again every step
        "kernel_cpu_share": kernel / (user + kernel) if user + kernel > 0 else None,
        "minor_faults_per_step": (ru1.ru_minflt - ru0.ru_minflt) / max(1, totals["all_steps"]),
        "final_loss": stepper.check_loss(),
        "data_wait_s_per_step": statistics.median(totals["waits"]),
        "compute_s_per_step": statistics.median(totals["comps"]),
        "peak_device_mb": dev.peak_memory_mb(),
        "peak_device_allocated_mb": dev.peak_allocated_mb(),
        "samples_per_step": totals["samples"] / max(1, totals["steps"]),
        # the cores the trial's processes (its ranks) and their DataLoader workers kept busy while measuring
        # (CPU s / wall s)
        "cpu_cores_used": ((tree1[0] - tree0[0]) / (tree1[1] - tree0[1] - waited)
                           if tree0 is not None and tree1 is not None and tree1[1] - tree0[1] > waited else None),
        **({"latency": latency.figures(totals["spans"])} if latency is not None else {}),
    }
    if payload.get("profile_dir"):  # after the windows, so profiling never touches the measured figures
        from autotune.trial.profile import PROFILE_STEPS, profile_steps

        out["profile"] = profile_steps(stepper.step, payload["profile_dir"], PROFILE_STEPS,
                                       workload.device, payload["config"])
        send(Profiled(**out["profile"]))
    return out if ranks is None else ranks.finish(out)


def _measured_step(built: Any, config: Any, spec: Any, dev: Any, train: bool, train_step: Callable[[Any], StepOut],
                   loader: Any) -> tuple[Any, Callable[[Any], StepOut], Any, dict | None]:
    """``(loader, step, latency recorder or None, worst-case batch description or None)``: on the worst-case
    batch (``MeasureSpec.worst_case``) the loader repeats it and a batch the model rejects is the workload's
    fault (``workloads.worst_case``); for inference each step's latency is recorded, synchronised
    (``trial.latency``)."""
    from autotune.trial.latency import StepLatency

    worst = None
    if spec.worst_case:
        from autotune.workloads.worst_case import Repeat, guarded, make_batch

        batch, worst = make_batch(built, config.batch_size)
        loader, train_step = Repeat(batch), guarded(train_step, worst["what"])
    latency = None if train else StepLatency(dev)
    if latency is not None:
        train_step = latency.timed(train_step)
    return loader, train_step, latency, worst


class _Stepper:
    """The trial's steps over its loader: one optimizer step is ``accumulation`` micro-batches; the device's
    step timer is told when each batch is in hand and when its work is issued (the step never synchronises);
    the last loss and the tokens the workload's count gave are kept for the checks and the figures."""

    def __init__(self, loader: Any, train_step: Callable[[Any], StepOut], accumulation: int, timer: Any,
                 amp: str, *, watch: Any = None) -> None:
        self.loader, self.it, self.watch = loader, iter(loader), watch
        self.train_step, self.accumulation, self.timer, self.amp = train_step, accumulation, timer, amp
        self.last_loss: Any = None
        self.tokens = 0
        self.counts_tokens = False  # the workload's count gives tokens

    def step(self, timer: Any = None) -> int:
        """One optimizer step (``accumulation`` micro-batches with a global batch); returns its samples."""
        return sum(self.micro_step(timer) for _ in range(self.accumulation))

    def micro_step(self, timer: Any = None) -> int:
        """One batch; returns its samples."""
        from autotune.errors import WorkloadError

        try:
            batch = next(self.it)
        except StopIteration:  # an epoch ended: a new iterator (and, without persistent workers, new workers)
            self.it = iter(self.loader)
            batch = next(self.it, None)
            if batch is None:
                raise WorkloadError("the workload's dataset yielded no batch (an empty IterableDataset?)") from None
        if timer is not None:
            timer.fetched()
        if self.watch is not None:
            self.watch.seen(batch)  # the first batch's bytes (trial.loader_watch)
        result = self.train_step(batch)
        self.last_loss = result.loss
        if result.tokens is not None:
            self.tokens += result.tokens
            self.counts_tokens = True
        if timer is not None:
            timer.done()
        return result.samples

    def timed_step(self) -> float:
        """One step, synchronised at its end: its whole time (warm-up only; a window synchronises once)."""
        self.timer.start()
        self.step(self.timer)
        return sum(self.timer.finish())

    def check_loss(self) -> float | None:
        if self.last_loss is None:
            return None
        value = float(self.last_loss.float().item())
        if not math.isfinite(value):
            raise FloatingPointError(
                f"loss became {value} with amp={self.amp}: this config breaks the numerics of training"
            )
        return value

    def window(self, spec: Any, turns: Any = None) -> dict:
        """One measured window of at least ``spec.window_s`` seconds and ``spec.min_window_steps`` steps: the
        device is synchronised once, at its end, so the host runs ahead as a real training loop does. With
        ``turns`` (``trial.windows.Turns``, a round by turns) the child waits for its next turn whenever its turn is
        over, between two steps, and runs one untimed step once its turn comes (``_untimed_step``); the window's time
        is its own, the waits and the untimed steps left out (its ``spans``)."""
        samples = steps = untimed = 0
        tokens0 = self.tokens
        waited0 = turns.waited_s if turns is not None else 0.0
        self.timer.start()
        spans: list[tuple[float, float]] = []
        mark, before = time.perf_counter(), 0.0  # this turn's start; the window's time in its turns before it
        while steps < spec.min_window_steps or before + time.perf_counter() - mark < spec.window_s:
            if turns is not None and turns.over():
                spans.append((mark, time.perf_counter()))
                before += spans[-1][1] - mark
                turns.wait()
            if turns is not None and turns.fresh:  # a turn begins (the first too): its first step off the clock
                tokens0 += self._untimed_step()  # the caches back to this process's own; its tokens off the window
                untimed += 1
                turns.begin()  # the turn's time starts after it
                self.timer.resume()  # neither data wait nor compute
                mark = time.perf_counter()
            samples += self.step(self.timer)
            steps += 1
        w_wait, w_comp = self.timer.finish()
        spans.append((mark, time.perf_counter()))
        elapsed = sum(b - a for a, b in spans)
        counted = {"tokens_per_s": (self.tokens - tokens0) / elapsed} if self.counts_tokens else {}
        return {"samples_per_s": samples / elapsed, "steps": steps, "data_wait_s": w_wait / steps,
                "compute_s": w_comp / steps, "started": spans[0][0], "elapsed": elapsed, "samples": samples,
                "spans": spans, "waited_before": waited0, "untimed_steps": untimed, **counted}

    def _untimed_step(self) -> int:
        """One step outside any window's time, as the first of a turn after a wait (``window``): the other children
        ran meanwhile and the caches hold their data, so this step would run slower than the same step in the
        user's own run (2-10% of it: ``benchmarks/turn_first_step.py``). Returns the tokens it counted."""
        tokens = self.tokens
        self.step()
        return self.tokens - tokens


@dataclass
class _WarmUp:
    """What the warm-up saw: when it began and when the first step ended (``t_warm``, ``t_settle``), the first
    step's time, the per-step times after it, and dynamo's compile clock before the first step."""

    t_warm: float
    first_s: float
    t_settle: float
    times: list[float]
    k: int
    compiling: bool
    compiled_before: float | None
    batch: dict  # the first batch's bytes and tensors (``LoaderWatch.figures``)

    def event(self, first: dict, unsettled: list[dict], confirmed: bool | None) -> Warmup:
        """The ``Warmup`` event: it ends where ``first``, the first window kept as measured, began.
        ``confirmed``: True when later windows confirmed it, False when the trial gave up waiting for them
        (MAX_UNSETTLED_WINDOWS or warmup_max_s), None when it was not checked (one window, or settle_windows 0)."""
        steady = statistics.median(self.times[-self.k:]) if self.times else first["elapsed"] / first["steps"]
        # Measured: dynamo's own clock over every compile of the warm-up (forward, the lazily compiled backward,
        # any recompile); only a torch without it falls back to the first step's excess over a settled step.
        compiled_after = compile_seconds() if self.compiling else None
        if self.compiled_before is not None and compiled_after is not None:
            compile_s: float | None = compiled_after - self.compiled_before
        else:
            compile_s = max(0.0, self.first_s - steady) if self.compiling else None
            if self.compiling:
                print("autotune: this torch keeps no compile-time counters; compile_s inferred from the first step",
                      flush=True)
        return Warmup(warmup_s=first["started"] - self.t_warm - first.get("waited_before", 0.0),  # not its turns
                      warmup_steps=1 + len(self.times) + sum(w["steps"] for w in unsettled), compile_s=compile_s,
                      step_s=steady, first_step_s=self.first_s,
                      warmup_windows=tuple(w["samples_per_s"] for w in unsettled), settled=confirmed,
                      **self.batch)


def _warm_up(stepper: _Stepper, dev: Any, spec: Any, *, compiling: bool, watch: Any = None) -> _WarmUp:
    """The first step, then (when asked) per-step until step times settle.

    The first step pays for compiling, lazy initialisation and the allocator's first requests: it is timed on
    its own (compile_s is measured by dynamo's clock, ``compile_seconds``), and the warm-up's clock, for
    warmup_min_s and the warmup_max_s limit, starts after it, so a slow first step cannot end the warm-up.
    With warmup_min_steps > 1: settled = the median of the last k step times is within tolerance of the k
    before them. The limit ends a warm-up that never settles, but only after 2k steps beyond the first, so
    "settled" has a meaning. By default (1) no step beyond the first is spent here: the windows settle it."""
    dev.reset_peak_memory()
    compiled_before = compile_seconds() if compiling else None
    t_warm = time.perf_counter()
    first_s = stepper.timed_step()
    stepper.check_loss()  # a config that breaks the numerics fails now, not after the whole warm-up
    t_settle = time.perf_counter()
    times: list[float] = []
    k = max(1, min(3, spec.warmup_min_steps // 2))
    while spec.warmup_min_steps > 1:
        times.append(stepper.timed_step())
        stepper.check_loss()
        n = len(times)
        if n < 2 * k:
            continue
        since = time.perf_counter() - t_settle
        if since > spec.warmup_max_s:
            break
        if since >= spec.warmup_min_s and 1 + n >= spec.warmup_min_steps:
            recent, before = statistics.median(times[-k:]), statistics.median(times[-2 * k:-k])
            if abs(recent - before) <= spec.settle_tolerance * before:
                break
    return _WarmUp(t_warm, first_s, t_settle, times, k, compiling, compiled_before,
                   watch.figures() if watch is not None else {})


def main(argv: list[str]) -> int:
    die_with_parent()  # set already before any import (``launch.python_command``; forked: ``worker_forkserver``)
    children_die_with_me()  # DataLoader workers too: forked from this main thread, they die with it
    adopt_orphans()  # a descendant that calls setsid and loses its parent stays in this tree (machine.proctree)
    fd = int(argv[1])
    payload = json.loads(argv[2])
    chan = os.fdopen(fd, "w", buffering=1)

    def send(event: Event) -> None:
        chan.write(encode(event).decode())
        chan.flush()

    # Threads for OpenMP/MKL are read once when the libraries load: the parent sets them in our environment,
    # this is a second guard for anyone starting the worker by hand.
    threads = payload["config"].get("intra_op_threads")
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(var, str(threads))
    send(Started(pid=os.getpid()))
    try:
        if payload["workload"].get("nproc_per_node", 1) > 1:  # N ranks, one trial (autotune.trial.ddp)
            from autotune.trial.ddp import supervise

            result = supervise(payload, send, run)
        else:
            result = run(payload, send)
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent, then we exit non-zero
        from autotune.errors import WorkloadError
        from autotune.machine.gpu_check import cuda_in_forked_worker
        from autotune.machine.oom import is_oom

        forked_cuda = cuda_in_forked_worker(exc)
        kind = "oom" if is_oom(exc) else "workload" if isinstance(exc, WorkloadError) or forked_cuda else "error"
        kind = getattr(exc, "trial_kind", None) or kind  # a DDP rank's failure, classified in the rank
        tb = getattr(exc, "rank_traceback", None) or traceback.format_exc()
        sys.stderr.write(tb)  # the trial's log keeps it too, where the one-line reason points
        sys.stderr.flush()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500] if str(exc) else type(exc).__name__
        message = str(exc) if hasattr(exc, "trial_kind") else message
        send(Failed(kind=kind, message=forked_cuda or message, traceback=tb[-8000:]))
        chan.close()
        kill_descendants()  # nothing the trial started outlives it, in its group or not
        os._exit(1)  # skip interpreter teardown: DataLoader workers and compile threads can hang it
    send(Done(**result))
    chan.close()
    kill_descendants()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
