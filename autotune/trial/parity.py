"""The numerics guard: does a config's reduced-precision / channels_last / compiled arithmetic still train like
fp32 eager?

bf16/fp16 autocast and ``torch.compile`` change the arithmetic, so a config that differs from fp32 eager in those
knobs (``needs_parity(config)``; channels_last alone only reorders sums, ``LAYOUT_ONLY``) is checked before it is
recommended: ``parity_check`` trains the
workload's model for ``steps`` steps twice in one fresh child process (``autotune.trial.parity_child``), from the same
initial weights on the same seeded batches: once as the *reference* (amp off, no channels_last, no compile) and
once as the *candidate* (the config's numerics knobs). Both use the batch size and threads of the config and
``num_workers=0``; everything else (model on the device, optimizer, grad scaler, autocast) is the trial's own
step (``_worker.make_step``), so the check runs the arithmetic that was measured.

Divergence (train): each loss curve is smoothed by a trailing moving average of ``SMOOTH_STEPS`` steps (single
batches' losses jitter with the batch; the trajectory is what must agree), and at every step the relative
difference ``|cand - ref| / max(|ref|, LOSS_FLOOR)`` is taken; ``max_rel_diff`` is its largest value over the
steps, ``final_rel_diff`` its last. Relative, because loss scales differ between workloads; the floor keeps a
loss near zero from turning noise into a huge ratio.

Training can be chaotic: on resnet18 at 32 px, batch 16, even fp32 channels_last (the same sums in another
order) drifted 15% from fp32 eager within 30 steps. So the child trains a third copy, the *control*: fp32 eager
from the initial weights nudged by a relative 1e-6 (rounding-sized), and its drift from the reference is the
``noise_floor``. The config passes when every candidate loss is finite and
``max_rel_diff <= limit = max(tolerance, FLOOR_FACTOR * noise_floor)``: precision loss is judged against what
fp32 itself does from a nudge, never against an exact replay that unstable training cannot give. The control can
only widen the limit, so the child runs it only when the candidate is over the tolerance (``control_needed``): a
config within it passes whatever fp32 does from a nudge, and its record has no ``noise_floor``; this saves a third
of the check in the common case. Task ``infer`` has no
trajectory: the outputs of each batch are compared, ``||out_cand - out_ref|| / ||out_ref||``, and the same tolerance
applies.

The default tolerance, ``DEFAULT_TOLERANCE = 0.05``, sits with margin above what honest configs showed on a CPU
over 30 steps where training is stable (bf16 + channels_last: 0.0001 on the tiny test net, 0.006 on resnet18 at
64 px batch 32, 0.004 on mobilenet_v3_small at 32 px; infer: 0.006 on resnet18's outputs) and far below what a
broken config does (a NaN, or the test's biased logits: 7.1).

**N DDP ranks** (a training workload with ``nproc_per_node`` N > 1, a study tuned with ``--nproc-per-node N``;
issue 27 item 6): the candidate runs as N real DDP ranks, started by the trial's own launcher (``ddp.supervise``)
in the check's child (``autotune.trial.parity_ranks``), and its loss (each step's mean over the ranks) is compared
with ONE fp32 eager process without DDP at the same global batch (per-rank batch x N x accumulation steps), on the
same samples: rank r's share of each step is a disjoint slice of the reference's batch. The control stays one fp32
eager process from nudged weights. N ranks change the arithmetic by themselves: BatchNorm normalises each rank's
B samples with their own statistics, not the B x N of one process, and the gradients are summed in another order
(DDP's bucketed all-reduce); so an N-rank winner is checked even when it is fp32 eager
(``needs_parity(config, world_size=N)``), and the control and the tolerance judge the difference. The record
says ``world_size``, the per-rank batch, the accumulation steps and the global batch. Inference is not wrapped in
DDP (each rank infers its own shard, as one process would), so an N-rank inference check is the one-process one.

Measured on the CPU (2026-11-26, AMD EPYC, 2 usable cores, torch 2.14.1, gloo, 2 ranks, 30 steps; more in
``docs/distributed.md``, "The numerics check under DDP"): without BatchNorm the ranks follow one process to rounding
(tiny conv net at 32 px, 16 a rank: max_rel_diff 5e-8); with it the per-rank statistics show (the tiny net with
BatchNorm: 0.07%; resnet18 at 32 px, 16 a rank: 1.8% against a control drift of 1.5%, limit 5%; 8 a rank: 2.4%
against 2.8%, limit 8.5%); bf16 + channels_last on 2 ranks, resnet18 at 16 a rank: 3.0%, limit 5%. A model whose
logits are biased only under a process group of 2: 1249%, failed at step 1.

>>> from autotune.config import TrialConfig
>>> needs_parity(TrialConfig(amp="bf16")), needs_parity(TrialConfig(num_workers=4))
(True, False)
>>> needs_parity(TrialConfig(channels_last=True)), needs_parity(TrialConfig(channels_last=True, amp="bf16"))
(False, True)
>>> needs_parity(TrialConfig(), world_size=2)
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from autotune.machine.launch import python_command
from autotune._records import Record, check, is_int, is_num
from autotune.config import DDP_KNOBS, TrialConfig, Workload
from autotune.trial.runner import child_env
from autotune.trial.triallog import CappedLog

__all__ = ["ParityResult", "parity_check", "needs_parity", "LAYOUT_ONLY", "control_needed", "first_passing",
           "reference_config", "divergence", "check_seconds", "compared_with", "DEFAULT_STEPS", "DEFAULT_TOLERANCE",
           "SMOOTH_STEPS", "LOSS_FLOOR", "FLOOR_FACTOR", "world_of"]

DEFAULT_STEPS = 30
DEFAULT_TOLERANCE = 0.05
SMOOTH_STEPS = 5
LOSS_FLOOR = 1e-3
FLOOR_FACTOR = 3.0
DEFAULT_TIMEOUT_S = 600.0
# the reference runs no DDP: its config keeps none of DDP's arguments (they would only name it apart)
_DDP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrialConfig) if f.name in DDP_KNOBS}


# Why channels_last alone is not checked (issue 50): it changes the memory layout, not the dtype or the graph; its
# convolutions sum in another order, as another thread count does. benchmarks/layout_numerics.py measured its loss
# drift from fp32 eager against the check's own control (fp32 eager from weights nudged by 1e-6): within the
# control's drift times FLOOR_FACTOR on every workload and batch measured (docs/budget.md, "channels_last and the
# numerics check": a 2-core Xeon's CPU kernels; a GPU's cuDNN layouts are not measured yet), i.e. what the check
# would pass whatever it saw.
LAYOUT_ONLY = ("channels_last alone changes the memory layout, not the dtype or the graph: its loss drifts from fp32 "
               "eager as a rounding-sized nudge does (benchmarks/layout_numerics.py), so it is not checked")


def needs_parity(config: TrialConfig, *, world_size: int = 1) -> bool:
    """True when ``config`` changes the arithmetic against fp32 eager in one process: autocast, compile, or training
    as ``world_size`` > 1 DDP ranks (per-rank BatchNorm statistics, another order of the gradients' sums).
    channels_last alone does not (``LAYOUT_ONLY``); with autocast or compile it is checked with them."""
    return config.amp != "off" or config.compile_mode != "none" or world_size > 1


CHECK_STARTUP_S = 10.0  # a check's child: start-up and building the model three times, roughly
RANKS_STARTUP_S = 15.0  # N spawned ranks: each imports torch, builds the model and joins the group (2 CPU cores)


def check_seconds(config: TrialConfig, *, samples_per_s: float, fp32_samples_per_s: float,
                  steps: int = DEFAULT_STEPS, workload: Workload | None = None) -> float:
    """What the numerics check of ``config`` is expected to take, in seconds: ``steps`` steps of the candidate
    at its measured rate, and twice ``steps`` of fp32 eager (the reference and the control: the worst case, as the
    control runs only for a candidate over the tolerance) at ``config``'s batch
    size, at fp32 eager's measured rate (the baseline trial's); 0 for a config that needs no check. For a training
    ``workload`` of N ranks a step is an optimizer step of the global batch (batch x N x accumulation steps), the
    rates are the ranks' global ones, and the ranks' start-up is added.

    >>> check_seconds(TrialConfig(batch_size=64, amp="bf16"), samples_per_s=80.0, fp32_samples_per_s=40.0)
    130.0
    >>> check_seconds(TrialConfig(batch_size=16), samples_per_s=80.0, fp32_samples_per_s=80.0, steps=10,
    ...               workload=Workload(nproc_per_node=2))
    37.0
    """
    world = world_of(workload) if workload is not None else 1
    if not needs_parity(config, world_size=world) or steps <= 0:
        return 0.0
    batch = _rank_record(workload, config, world).get("global_batch", config.batch_size)
    startup = CHECK_STARTUP_S + (RANKS_STARTUP_S if world > 1 else 0.0)
    return startup + steps * batch / samples_per_s + 2 * steps * batch / fp32_samples_per_s


def reference_config(config: TrialConfig, *, world_size: int = 1) -> TrialConfig:
    """fp32 eager with ``config``'s batch size and intra-op threads, both times ``world_size`` (one process does the
    ranks' work, on the cores they had), data loaded in the process, DDP's knobs at their defaults (the check's
    reference). Threads change the speed of the check, not what it compares."""
    threads = config.intra_op_threads * world_size if config.intra_op_threads else None
    return config.replace(amp="off", channels_last=False, compile_mode="none", num_workers=0, pin_memory=False,
                          batch_size=config.batch_size * world_size, intra_op_threads=threads, **_DDP_DEFAULTS)


@dataclass(frozen=True)
class ParityResult(Record):
    """The outcome of one parity check; ``reason`` says in one line why it passed or not.

    Losses are floats (NaN where a loss was not finite; a curve stops at its first non-finite loss); ``to_dict``
    writes non-finite values as None so the record is plain JSON. ``compared`` is ``loss`` (train: smoothed loss
    curves) or ``output`` (infer: each batch's outputs); ``rel_diffs`` holds the per-step relative differences.
    """

    _kind: ClassVar[str] = "parity result"

    ok: bool
    steps: int
    losses_reference: tuple = ()
    losses_candidate: tuple = ()
    max_rel_diff: float | None = None
    final_rel_diff: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    reason: str = ""
    compared: str = "loss"
    rel_diffs: tuple = ()
    losses_control: tuple = ()
    noise_floor: float | None = None
    limit: float | None = None
    seconds: float | None = None
    child_pid: int | None = None
    # False when the check could not run for want of memory: no numerics verdict either way
    checked: bool = True
    skipped_steps: tuple = ()  # steps (1-based) fp16's GradScaler skipped, left out of every curve
    world_size: int = 1  # the candidate's DDP ranks; the reference and the control are one process
    per_rank_batch: int | None = None
    accumulation_steps: int | None = None
    global_batch: int | None = None  # samples per optimizer step, for the ranks together and for the reference

    def __post_init__(self) -> None:
        check(isinstance(self.ok, bool), "ok", self.ok, "true or false")
        check(is_int(self.steps) and self.steps >= 0, "steps", self.steps, "a whole number >= 0")
        check(is_num(self.tolerance) and self.tolerance > 0, "tolerance", self.tolerance, "a positive number")
        check(self.compared in ("loss", "output"), "compared", self.compared, "loss or output")
        check(is_int(self.world_size) and self.world_size >= 1, "world_size", self.world_size, "a whole number >= 1")
        for name in ("losses_reference", "losses_candidate", "rel_diffs", "losses_control"):
            object.__setattr__(self, name, tuple(math.nan if v is None else float(v) for v in getattr(self, name)))
        object.__setattr__(self, "skipped_steps", tuple(self.skipped_steps))  # a list, read back from JSON

    def note(self, who: str) -> str:
        """One line for a recommendation's notes: ``who`` (e.g. "b64 bf16 cl (trial 12)") and the verdict."""
        verdict = ("passes the numerics check" if self.ok else "was not checked" if not self.checked
                   else "is not recommended")
        return f"{who} {verdict}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in ("losses_reference", "losses_candidate", "rel_diffs", "losses_control"):
            d[name] = [v if math.isfinite(v) else None for v in d[name]]
        d["skipped_steps"] = list(d["skipped_steps"])
        for name in ("max_rel_diff", "final_rel_diff", "noise_floor", "limit"):
            if d[name] is not None and not math.isfinite(d[name]):
                d[name] = None
        if self.world_size == 1:
            for name in _RANK_FIELDS:
                del d[name]
        return d


_RANK_FIELDS = ("world_size", "per_rank_batch", "accumulation_steps", "global_batch")


def _smooth(xs: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def divergence(reference: list[float], candidate: list[float], *, smooth: int = SMOOTH_STEPS) -> list[float]:
    """Per-step relative difference of the two loss curves after a trailing moving average of ``smooth`` steps.

    >>> [round(d, 3) for d in divergence([2.0, 2.0, 2.0], [2.0, 2.2, 2.4], smooth=1)]
    [0.0, 0.1, 0.2]
    >>> [round(d, 3) for d in divergence([2.0, 2.0, 2.0], [2.0, 2.2, 2.4], smooth=2)]
    [0.0, 0.05, 0.15]
    """
    n = min(len(reference), len(candidate))
    ref, cand = _smooth(list(reference[:n]), smooth), _smooth(list(candidate[:n]), smooth)
    return [abs(c - r) / max(abs(r), LOSS_FLOOR) for r, c in zip(ref, cand)]


def control_needed(reference: Sequence[float | None], candidate: Sequence[float | None], *,
                   tolerance: float) -> bool:
    """Whether the control run can change the verdict: it only widens the limit beyond ``tolerance``, so it is
    needed only when both curves are finite and the candidate's divergence is over the tolerance. A candidate
    within the tolerance passes and a non-finite one fails whatever fp32 does from a nudge: the child skips the
    control then, a third of the check's steps (the largest item of a 160 px run on 2 cores, issue 25)."""
    ref = [math.nan if v is None else float(v) for v in reference]
    cand = [math.nan if v is None else float(v) for v in candidate]
    if not ref or not all(math.isfinite(v) for v in ref + cand):
        return False
    return max(divergence(ref, cand)) > tolerance


def _first_bad(xs: tuple) -> int | None:
    return next((i for i, x in enumerate(xs) if not math.isfinite(x)), None)


def judge(raw: dict, *, steps: int, tolerance: float, label: str, against: str = "fp32 eager",
          **record: Any) -> ParityResult:
    """Turn the child's curves (``raw``: losses_reference, losses_candidate, and for infer output_rel_diffs) into
    a verdict with its reason. ``label`` names the candidate's knobs in the reason, ``against`` the reference;
    ``record``: more fields of the result (the ranks')."""
    ref = tuple(math.nan if v is None else float(v) for v in raw["losses_reference"])
    cand = tuple(math.nan if v is None else float(v) for v in raw["losses_candidate"])
    control = tuple(math.nan if v is None else float(v) for v in raw.get("losses_control") or ())
    compared = raw.get("compared", "loss")
    common = dict(steps=steps, losses_reference=ref, losses_candidate=cand, losses_control=control,
                  tolerance=tolerance,
                  compared=compared, seconds=raw.get("seconds"), child_pid=raw.get("pid"),
                  skipped_steps=tuple(raw.get("skipped_steps") or ()), **record)
    bad_ref = _first_bad(ref) if compared == "loss" else None
    if bad_ref is not None:
        return ParityResult(ok=False, reason=f"the fp32 eager reference's loss became {ref[bad_ref]} at step "
                            f"{bad_ref + 1}: the workload diverges without {label}, so parity cannot be judged",
                            **common)
    bad = _first_bad(cand)
    if bad is not None:
        return ParityResult(ok=False, reason=f"numerics diverge: with {label} the loss became {cand[bad]} at step "
                            f"{bad + 1} of {steps} while {against} stayed finite", **common)
    if compared == "output":
        diffs = [math.nan if v is None else float(v) for v in raw["output_rel_diffs"]]
        what = "the outputs"
    else:
        diffs = divergence(list(ref), list(cand))
        what = f"the loss ({SMOOTH_STEPS}-step moving average)"
    if not diffs:
        return ParityResult(ok=False, reason="the parity check ran no steps", **common)
    if any(not math.isfinite(d) for d in diffs):
        i = _first_bad(tuple(diffs))
        return ParityResult(ok=False, rel_diffs=tuple(diffs), reason=f"numerics diverge: with {label} the outputs "
                            f"became non-finite at batch {i + 1}", **common)
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    floor = None
    if control:  # how far fp32 drifts from a rounding-sized nudge: chaotic training earns a wider limit
        floor = math.inf if _first_bad(control) is not None else max(divergence(list(ref), list(control)))
    limit = tolerance if floor is None else max(tolerance, FLOOR_FACTOR * floor)
    common.update(rel_diffs=tuple(diffs), max_rel_diff=diffs[worst], final_rel_diff=diffs[-1], noise_floor=floor,
                  limit=limit)
    bound = f"tolerance {tolerance:.1%}" + (f", fp32 drifts {floor:.2%} on its own" if floor else "")
    if diffs[worst] > limit:
        return ParityResult(ok=False, reason=f"numerics diverge: with {label} {what} differs from {against} by "
                            f"{diffs[worst]:.1%} at step {worst + 1} of {len(diffs)} (limit {limit:.1%}: {bound})",
                            **common)
    return ParityResult(ok=True, reason=f"{what} with {label} stays within {diffs[worst]:.2%} of {against} over "
                        f"{len(diffs)} steps (limit {limit:.1%}: {bound})", **common)


def _label(config: TrialConfig, world_size: int = 1) -> str:
    parts = [f"amp={config.amp}"] if config.amp != "off" else []
    parts += ["channels_last"] if config.channels_last else []
    parts += [f"compile={config.compile_mode}"] if config.compile_mode != "none" else []
    ranks = f" on {world_size} DDP ranks" if world_size > 1 else ""
    return (" + ".join(parts) or "fp32 eager") + ranks


def parity_check(workload: Workload, config: TrialConfig, *, steps: int = DEFAULT_STEPS, seed: int = 0,
                 tolerance: float = DEFAULT_TOLERANCE, timeout_s: float = DEFAULT_TIMEOUT_S,
                 log_path: str | os.PathLike | None = None, memory_cap_mb: float | None = None) -> ParityResult:
    """Check that ``config``'s numerics knobs train ``workload`` like fp32 eager; never raises for a bad config.

    Runs in a fresh child (its own process group, killed whole at ``timeout_s``); the child's stdout and stderr
    go to ``log_path`` (a temporary file, removed afterwards, when None). A config without numerics knobs passes
    at once without a child. A child that crashes or times out gives ``ok=False`` with the reason; the numerics
    of a config that cannot even be checked are not vouched for. With ``memory_cap_mb`` (the trials' cap) the
    child's tree is watched as a trial's is (``memwatch.MemoryWatch``: it holds three copies of the model) and
    killed over the cap, which fails the check with the reason.

    With N DDP ranks (``workload.nproc_per_node`` > 1, training) the child is ``parity_ranks``: the candidate as N
    ranks against one fp32 eager process at the global batch (see the module docstring). The ranks are the
    child's children, so the memory cap counts them all and the time limit kills them with it; a rank that fails
    fails the check with its reason ("rank 1: ..."), the others stopped by the launcher.

    Example (about 3 s on 2 CPU cores; about 25 s with ``nproc_per_node=2``)::

        parity_check(Workload(model="tests.workloads_fixtures:tiny", image_size=16),
                     TrialConfig(batch_size=8, amp="bf16", channels_last=True), steps=10)
    """
    check(is_int(steps) and steps >= 1, "steps", steps, "a whole number >= 1", "try 30")
    check(is_num(tolerance) and tolerance > 0, "tolerance", tolerance, "a positive number", "try 0.05")
    check(is_num(timeout_s) and timeout_s > 0, "timeout_s", timeout_s, "a positive number of seconds")
    world = world_of(workload)
    label = _label(config, world)
    record = _rank_record(workload, config, world)
    if not needs_parity(config, world_size=world):
        return ParityResult(ok=True, steps=0, tolerance=tolerance,
                            reason=LAYOUT_ONLY if config.channels_last
                            else "fp32 eager: the arithmetic is the reference's, nothing to check")
    with tempfile.TemporaryDirectory(prefix="autotune-parity-") as tmp:  # 0700: rank 0's initial weights too
        result_path = Path(tmp) / "result.json"
        log = Path(log_path) if log_path is not None else Path(tmp) / "parity.log"
        spec = {"workload": workload.to_dict(), "candidate": config.replace(num_workers=0).to_dict(),
                "reference": reference_config(config, world_size=world).to_dict(), "steps": steps, "seed": seed,
                "result_path": str(result_path), "timeout_s": timeout_s, "tolerance": tolerance,
                "accumulation": record.get("accumulation_steps", 1)}
        module = "autotune.trial.parity_ranks" if world > 1 else "autotune.trial.parity_child"
        start = time.perf_counter()
        with CappedLog(log) as out:  # the user's code prints here: under a trial log's cap (autotune.trial.triallog)
            proc = subprocess.Popen(python_command(sys.executable, module), stdin=subprocess.PIPE, stdout=out,
                                    stderr=out, env=child_env(config), start_new_session=True)
        stopped = _watch(proc, json.dumps(spec).encode(), timeout_s=timeout_s, memory_cap_mb=memory_cap_mb)
        out.join()
        common = dict(steps=steps, tolerance=tolerance, child_pid=proc.pid, seconds=time.perf_counter() - start,
                      **record)
        raw = json.loads(result_path.read_text()) if result_path.exists() and not stopped else None
        failed = _failed(proc, raw, stopped, log, label, common)
    if failed is not None:
        return failed
    raw["seconds"] = common["seconds"]
    against = f"one fp32 eager process at the global batch {record['global_batch']}" if world > 1 else "fp32 eager"
    return judge(raw, steps=steps, tolerance=tolerance, label=label, against=against, **record)


def world_of(workload: Workload) -> int:
    """The candidate's DDP ranks: the workload's for training; 1 for inference, which is not wrapped in DDP."""
    return workload.nproc_per_node if workload.task == "train" else 1


def compared_with(workload: Workload) -> str:
    """How a check of ``workload`` compares, for a log line.

    >>> compared_with(Workload(nproc_per_node=2))
    'as 2 DDP ranks against one fp32 eager process at the global batch'
    """
    n = world_of(workload)
    return f"as {n} DDP ranks against one fp32 eager process at the global batch" if n > 1 else "against fp32 eager"


def _rank_record(workload: Workload, config: TrialConfig, world: int) -> dict[str, Any]:
    """The result's fields for an N-rank check (none for one process)."""
    if world <= 1:
        return {}
    from autotune.workloads.global_batch import accumulation_steps

    accumulation = accumulation_steps(workload.global_batch, config.batch_size, world_size=world)
    return {"world_size": world, "per_rank_batch": config.batch_size, "accumulation_steps": accumulation,
            "global_batch": config.batch_size * world * accumulation}


def _failed(proc: subprocess.Popen, raw: dict | None, stopped: str | None, log: Path, label: str,
            common: dict) -> ParityResult | None:
    """The result of a check child that gave no curves (stopped, failed, out of memory, or a workload the check
    cannot lay out), else None."""
    if stopped:
        return ParityResult(ok=False, reason=f"the parity check of {label} {stopped}", **common)
    if raw is not None and raw.get("oom"):
        return ParityResult(ok=False, checked=False, reason=f"not checked: out of memory in the numerics check of "
                            f"{label} ({raw.get('error')}); its numerics are not vouched for", **common)
    if raw is not None and raw.get("unchecked"):
        return ParityResult(ok=False, checked=False, reason=f"not checked: {raw['unchecked']}", **common)
    if proc.returncode != 0 or raw is None or "error" in raw:
        why = (raw or {}).get("error") or _tail(log) or f"exit code {proc.returncode}"
        return ParityResult(ok=False, reason=f"the parity check of {label} failed: {why}", **common)
    return None


def first_passing(ranked: Sequence[TrialConfig], workload: Workload, *,
                  check: Callable[..., ParityResult] | None = None,
                  **kwargs: Any) -> tuple[int | None, list[tuple[TrialConfig, ParityResult]]]:
    """Check ``ranked`` configs (best first) in turn until one passes, or could not be checked (``checked=False``:
    out of memory, or N ranks whose samples cannot be laid out as one process's: no verdict, so it is not passed
    over as if it had failed); return its index (None if none did) and every config checked with its result. fp32
    eager configs of one process pass without a child. ``kwargs`` go to ``check`` (``parity_check`` unless a test
    passes another)."""
    run = check or parity_check
    checked: list[tuple[TrialConfig, ParityResult]] = []
    for i, config in enumerate(ranked):
        result = run(workload, config, **kwargs)
        checked.append((config, result))
        if result.ok or not result.checked:
            return i, checked
    return None, checked


def _watch(proc: subprocess.Popen, spec: bytes, *, timeout_s: float, memory_cap_mb: float | None) -> str | None:
    """Feed the check's child its spec and watch it to its end as the runner watches a trial: its tree's memory
    against the cap every 0.1 s, the time limit; its whole tree is killed at the end (compile workers, anything
    that left its group). Returns why it was stopped, or None when it ended by itself."""
    from autotune._units import format_mb
    from autotune.trial.memwatch import MemoryWatch

    memory = MemoryWatch(proc.pid)
    stopped = None
    try:
        with contextlib.suppress(BrokenPipeError):  # a child that died at once: its exit code tells
            proc.stdin.write(spec)
            proc.stdin.close()
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            over = memory.sample(memory_cap_mb)
            if over is not None:
                stopped = f"was killed at {format_mb(over)}, over the {format_mb(memory_cap_mb)} memory cap"
                break
            if time.monotonic() > deadline:
                stopped = f"did not finish in {timeout_s:g} s"
                break
            time.sleep(0.1)
    finally:
        memory.kill()
        proc.wait()
    return stopped


def _tail(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
