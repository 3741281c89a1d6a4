"""Each inference step's latency, and its percentiles: what a latency bound (``--latency-p99``) is judged on.

A trial's windows synchronise the device once, at their end, so the host runs ahead as a training loop does;
that measures throughput, not how long one batch takes. For ``--task infer`` the child wraps its step
(``timed``): the clock starts when the batch is in hand and stops once the device has finished it
(``device.synchronize()``: a no-op on the CPU, whose kernels are synchronous; ``torch.cuda.synchronize`` on a
GPU), so a step's latency is what a caller waiting for that batch's answer waits. Only the steps inside the
measured windows count (warm-up and windows re-labelled warm-up do not): ``StepLatency.figures(spans)``.

The percentiles are nearest-rank (no interpolation between two steps: a p99 is a step that happened), in ms:
``{"p50_ms", "p95_ms", "p99_ms", "min_ms", "steps"}``. ``min_ms`` is the floor: no config with this batch
size answers faster.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable

from autotune.errors import ConfigError

__all__ = ["StepLatency", "percentiles", "check_bound", "PERCENTILES"]

PERCENTILES = (50, 95, 99)


def percentiles(seconds: Iterable[float]) -> dict[str, Any] | None:
    """Nearest-rank p50/p95/p99 and the minimum of step latencies in seconds, as ms; None with no step.

    >>> percentiles([0.010] * 98 + [0.020, 0.030])["p99_ms"]
    20.0
    """
    xs = sorted(float(x) for x in seconds)
    if not xs:
        return None
    out: dict[str, Any] = {f"p{p}_ms": round(1000 * xs[max(0, math.ceil(p / 100 * len(xs)) - 1)], 4)
                           for p in PERCENTILES}
    out["min_ms"] = round(1000 * xs[0], 4)
    out["steps"] = len(xs)
    return out


class StepLatency:
    """Records ``(start, seconds)`` for every call of a step it wraps (``timed``)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.steps: list[tuple[float, float]] = []

    def timed(self, step: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``step`` with its latency recorded: from the batch in hand to the device done with it."""
        def run(batch: Any) -> Any:
            t0 = time.perf_counter()
            out = step(batch)
            self.device.synchronize()  # kernels are asynchronous on a GPU: the answer is ready only now
            self.steps.append((t0, time.perf_counter() - t0))
            return out

        run.scaler = getattr(step, "scaler", None)  # type: ignore[attr-defined]
        return run

    def figures(self, spans: Iterable[tuple[float, float]]) -> dict[str, Any] | None:
        """The percentiles of the steps that began inside one of ``spans`` (``(start, end)``, the measured
        windows, by ``time.perf_counter``)."""
        spans = list(spans)
        return percentiles(s for t0, s in self.steps if any(a <= t0 < b for a, b in spans))


def check_bound(task: str, latency_p99_ms: float | None, *, flag: str = "--latency-p99") -> None:
    """A latency bound means something for inference only: one line (a ``ConfigError``) on a training task."""
    if latency_p99_ms is not None and task != "infer":
        raise ConfigError(f"{flag} bounds the latency of inference steps; the task is {task}: use --task infer "
                          f"(task='infer'), or drop {flag}")


def worst_of(seen: dict[str, float] | None, result: Any) -> dict[str, float]:
    """Each percentile's worst over the rounds so far (``seen``) and a ``TrialResult``'s: a finalist's latency
    is what its slowest round measured."""
    now = {k: getattr(result, f"latency_{k}") for k in ("p50_ms", "p95_ms", "p99_ms", "min_ms")}
    if not seen:
        return now
    return {k: max(v, seen[k]) if k != "min_ms" else min(v, seen[k]) for k, v in now.items()}
