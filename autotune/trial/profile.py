"""One short torch.profiler run of a config, in a fresh child process like every trial.

The child warms up, measures one short window (so the profiled steps are steady-state: compile and warm-up are
excluded), then runs 5 more steps under ``torch.profiler`` and writes, into ``out_dir``:

* ``trace.pt.trace.json``: a Chrome trace (open it at ui.perfetto.dev or chrome://tracing, or point
  TensorBoard's profiler plugin at the folder);
* ``top_ops.json``: the operators that took the most self time over those steps.

>>> p = profile_config(Workload(model="resnet18", image_size=64), TrialConfig(batch_size=16),
...                    "trials/my-study/profile")                           # doctest: +SKIP
>>> p.trace_path, p.top_ops[0]["name"]                                      # doctest: +SKIP
(PosixPath('trials/my-study/profile/trace.pt.trace.json'), 'aten::convolution_backward')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autotune.config import MeasureSpec, TrialConfig, TrialResult, Workload

__all__ = ["Profile", "profile_config", "profile_steps", "PROFILE_STEPS", "TRACE_NAME", "TOP_OPS_NAME"]

TRACE_NAME = "trace.pt.trace.json"
TOP_OPS_NAME = "top_ops.json"


@dataclass(frozen=True)
class Profile:
    """What a profiler run produced. ``ok`` False means no trace: ``reason`` says why (the trial's status)."""

    config: TrialConfig
    result: TrialResult
    out_dir: Path
    trace_path: Path | None = None
    top_ops: tuple[dict[str, Any], ...] = ()
    sort_by: str = "self_cpu_ms"
    steps: int = 0

    @property
    def ok(self) -> bool:
        return self.trace_path is not None

    @property
    def reason(self) -> str:
        if self.ok:
            return ""
        return f"{self.result.status}: {self.result.reason}" if self.result.reason else self.result.status


def profile_config(workload: Workload, config: TrialConfig, out_dir: str | Path, *,
                   memory_cap_mb: float | None = None, timeout_s: float = 600.0,
                   log_path: str | Path | None = None) -> Profile:
    """Profile a few steady-state steps of ``config`` in a fresh child process; never raises for a failed run.

    The trial machinery is reused as is (thread settings before torch starts, the memory cap, the time limit);
    a run that fails (out of memory, timeout...) returns a ``Profile`` with ``ok`` False and the reason.
    """
    from autotune.trial.runner import run_trial

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / TRACE_NAME, out / TOP_OPS_NAME):  # never report an older run's trace as this one
        stale.unlink(missing_ok=True)
    # one window, so nothing confirms where the warm-up ended: a per-step warm-up of 6+ steps and 1+ s settles it
    measure = MeasureSpec(windows=1, window_s=0.5, warmup_min_steps=6, warmup_min_s=1.0, warmup_max_s=60.0,
                          timeout_s=timeout_s,
                          memory_cap_mb=memory_cap_mb)
    result = run_trial(workload, config, measure, log_path=log_path or out / "profile.log", profile_dir=out)
    top = out / TOP_OPS_NAME
    trace = out / TRACE_NAME
    if not (result.ok and top.exists() and trace.exists()):
        return Profile(config=config, result=result, out_dir=out)
    doc = json.loads(top.read_text())
    return Profile(config=config, result=result, out_dir=out, trace_path=trace, top_ops=tuple(doc["ops"]),
                   sort_by=doc.get("sort_by", "self_cpu_ms"), steps=int(doc.get("steps", 0)))


PROFILE_STEPS = 5  # enough to see a steady step's operators; a trace of many steps is slow to open


def profile_steps(step: Callable[[], Any], profile_dir: str, steps: int, device: str, config: dict) -> dict:
    """In the trial's child: run ``steps`` more steps under torch.profiler; write a Chrome trace and the top
    operators as JSON.

    The trace is named ``*.pt.trace.json`` so TensorBoard's profiler plugin finds it; Perfetto opens it as is.
    """
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, record_function

    out = Path(profile_dir)
    out.mkdir(parents=True, exist_ok=True)
    on_device = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"autotune.step#{i}"):
                step()
    trace = out / "trace.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in prof.key_averages() if not e.key.startswith("autotune.step")]
    total_cpu = sum(e.self_cpu_time_total for e in events) or 1.0
    key = (lambda e: -e.self_device_time_total) if on_device else (lambda e: -e.self_cpu_time_total)
    ops = [{"name": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1000, 3),
            "self_cpu_share": round(e.self_cpu_time_total / total_cpu, 4),
            "cpu_total_ms": round(e.cpu_time_total / 1000, 3),
            **({"self_device_ms": round(e.self_device_time_total / 1000, 3)} if on_device else {})}
           for e in sorted(events, key=key)[:25]]
    top = out / "top_ops.json"
    top.write_text(json.dumps({"steps": steps, "device": device, "config": config,
                               "sort_by": "self_device_ms" if on_device else "self_cpu_ms", "ops": ops}, indent=1))
    return {"trace": str(trace), "top_ops": str(top), "steps": steps}
