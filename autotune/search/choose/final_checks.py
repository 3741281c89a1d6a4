"""What a finalist must pass besides its rounds before it is recommended: the latency bound, and the worst case.

``choose`` wraps ``finalists.choose``, the choice among the finalists that finished every round:

* **latency** (inference under ``--latency-p99``): a finalist whose slowest round's p99 step latency is over the
  bound is out, as one over the memory is (``Evidence.failures``), so the fastest config that meets it wins;
* **the worst case** (item 2 of issue 28): the chosen config then runs, in a child under the trials' caps, on the
  largest batch the workload's data can produce (``autotune.workloads.worst_case``), and its peak must leave the
  memory margin free (``MemoryLimit.fits``: cap x (1 - margin), on a GPU the device cap too). A config that does
  not is out and the next best is chosen and checked, and so on. A workload with fixed shapes needs no child:
  its worst case is a normal batch, which the finalists' rounds ran under the same caps.

The recommendation records both: ``latency_ms`` (the percentiles and the bound) and ``worst_case`` (which batch,
its tensors, its peak against the usable memory). A worst-case batch the model rejects stops the run with a
one-line ``WorkloadError``: every config would meet it in the real run.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotune.search.choose import finalists as fin
from autotune.search.choose.finalist_rounds import run_log
from autotune.config import MeasureSpec, TrialConfig
from autotune.errors import WorkloadError

if TYPE_CHECKING:
    from optuna.study import Study

    from autotune.search.choose.finalists import FinalistContext

__all__ = ["choose", "worst_case_measure", "check_worst_case", "latency_out", "WORST_CASE_WINDOW_S", "workload_data",
           "expected_s"]

# The worst-case run is a memory check, not a measurement: one short window after the first step is enough for
# the kernel's high-water marks (and the device's peak) to hold the batch's peak.
WORST_CASE_WINDOW_S = 0.5


def worst_case_measure(measure: MeasureSpec) -> MeasureSpec:
    """How the worst-case child runs: the trials' caps, margin and time limit, one short window."""
    return measure.replace(windows=1, window_s=min(WORST_CASE_WINDOW_S, measure.window_s), min_window_steps=2,
                           settle_windows=0, warmup_min_steps=1, worst_case=True)


def latency_out(limit: Any, configs: list[TrialConfig], ev: Any) -> None:
    """Put out every finalist whose rounds' p99 latency is over ``limit``'s bound (none without a bound)."""
    if limit.latency_p99_ms is None:
        return
    for c in configs:
        seen = ev.latency.get(c.key())
        if ev.rounds[c.key()] and not limit.meets_latency(seen["p99_ms"] if seen else None):
            ev.failures[c.key()].append(
                f"p99 latency {seen['p99_ms']:.2f} ms over the {limit.latency_p99_ms:g} ms bound" if seen
                else f"no step latency measured, under a {limit.latency_p99_ms:g} ms p99 bound")


def expected_s(study: Study, workload: Any, numerics_s: float) -> float:
    """What the checks after the finalists' rounds are expected to take: the numerics check (``numerics_s``) and,
    for a workload whose data can make a batch larger than its trials drew, the worst-case child (about a short
    trial: the median finished search trial's wall)."""
    from autotune.search.record import trials as keys
    from autotune.workloads.worst_case import needs_child

    walls = sorted(t.user_attrs.get(keys.WALL_S) or 0.0 for t in study.get_trials(deepcopy=False)
                   if t.state.is_finished() and t.user_attrs.get(keys.WALL_S))
    worst = walls[len(walls) // 2] if walls and needs_child(workload_data(workload)) else 0.0
    return numerics_s + worst


def workload_data(workload: Any) -> dict | None:
    """What the workload's first batch showed (``Workload.data``), probed now where the workload was not checked."""
    if workload.data is not None:
        return workload.data
    from autotune.workloads.build import profile

    return profile(workload)


def check_worst_case(ctx: FinalistContext, config: TrialConfig, rec: Any, runner: Any) -> tuple[str | None, dict]:
    """``(why it is out or None, the record for the YAML)``: ``config`` on the largest batch the data can
    produce, in a child (``runner``) under the trials' caps, against the usable memory (``ctx.limit``)."""
    from autotune.workloads.worst_case import needs_child

    limit = ctx.limit
    if not needs_child(workload_data(ctx.workload)):
        return None, {"source": "normal", "what": "a normal batch (fixed shapes)",
                      "checked_by": "the finalists' rounds (each ran such batches under the same caps)",
                      "peak_host_mb": rec.peak_host_mb, "peak_device_allocated_mb": rec.peak_device_allocated_mb,
                      "usable_mb": limit.usable_mb, "fits": True}
    ctx.log(f"checking {config.short()} on the largest batch its data can produce, in a child under the cap")
    res = runner(ctx.workload, config, worst_case_measure(ctx.measure),
                 log_path=run_log(ctx.artifacts_dir, "worst-case", config))
    if res.user_error:  # the model rejects the worst-case batch: the workload's fault, one line
        raise WorkloadError(res.reason.removeprefix("WorkloadError: "))
    fits = res.ok and limit.fits(res.peak_host_mb, res.peak_device_mb, res.peak_device_allocated_mb)
    seen = res.worst_case or {}
    record = {"source": seen.get("source"), "what": seen.get("what"), "batch": seen.get("batch"),
              "lengths": seen.get("lengths"), "checked_by": "a child on this batch, under the trials' caps",
              "status": res.status, "peak_host_mb": res.peak_host_mb,
              "peak_device_allocated_mb": res.peak_device_allocated_mb, "usable_mb": limit.usable_mb,
              "fits": fits}
    if fits:
        return None, record
    from autotune._units import format_mb

    what = seen.get("what") or "its largest batch"
    if res.ok and not limit.fits(res.peak_host_mb):
        why = (f"on {what} its peak {format_mb(res.peak_host_mb)} is over the {format_mb(limit.usable_mb)} the "
               f"{100 * limit.margin:.0f}% margin leaves of the cap")
    elif res.ok:
        why = (f"on {what} its device peak {format_mb(res.peak_device_allocated_mb or res.peak_device_mb)} is "
               f"over {100 * (1 - limit.margin):.0f}% of the {format_mb(limit.device_mb)} device cap")
    else:
        why = f"on {what}: {res.status}" + (f" ({res.reason})" if res.reason else "")
    return f"worst case: {why}", record


def _latency_record(ctx: FinalistContext, ev: Any, config: TrialConfig) -> dict | None:
    seen = ev.latency.get(config.key())
    if seen is None:
        return None
    return {**seen, "bound_p99_ms": ctx.limit.latency_p99_ms}


def choose(ctx: FinalistContext, study: Study, configs: list[TrialConfig], trials: list, ev: Any, base_trial: Any,
           *, runner: Any, check_numerics: bool = True, more: Any = None) -> Any:
    """``finalists.choose`` with the latency bound and the worst-case check (see the module docstring); None when
    no finalist passes them all. ``runner`` runs the worst-case child (here, or on a remote node); ``more`` runs
    extra rounds of two finalists in dispute (``settle.ExtraRounds``)."""
    latency_out(ctx.limit, configs, ev)
    while True:
        rec = fin.choose(ctx, study, configs, trials, ev, base_trial, check_numerics=check_numerics, more=more)
        if rec is None:
            return None
        why, record = check_worst_case(ctx, rec.config, rec, runner)
        if why is None:
            return dataclasses.replace(rec, worst_case=record, latency_ms=_latency_record(ctx, ev, rec.config))
        ctx.log(f"{rec.config.short()} is out: {why}")
        ev.failures[rec.config.key()].append(why)
