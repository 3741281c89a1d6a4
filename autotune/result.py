"""What one trial measured: ``TrialResult``, with its status, raw window throughputs and derived figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from autotune._records import Record, check
from autotune.measure import Summary, summarize

__all__ = ["TrialResult", "STATUSES", "MEMORY_STATUSES"]

# ok: measured. oom: an out-of-memory exception. over_memory: killed by the parent at the memory cap.
# timeout: killed at the time limit. crashed: died by a signal or exited without a result. error: raised.
# pruned: stopped by the tuner because it could not beat the best. skipped: not run (known infeasible).
# shm: the DataLoader ran out of shared memory (/dev/shm) or of the descriptors that pass it (trial.loader_watch).
STATUSES = ("ok", "oom", "over_memory", "timeout", "crashed", "error", "pruned", "skipped", "shm")
MEMORY_STATUSES = ("oom", "over_memory", "shm")


@dataclass(frozen=True)
class TrialResult(Record):
    """What one trial measured. Raw window throughputs are kept; median and IQR are derived from them.

    Times are per step and in seconds; memory in MiB. ``reason`` is one line a person can read
    ("killed at 1.9 GiB, over the 1.5 GiB cap"); ``traceback`` keeps the child's traceback for errors.
    """

    _kind: ClassVar[str] = "result"

    status: str
    reason: str = ""
    samples_per_s: tuple[float, ...] = ()
    window_steps: tuple[int, ...] = ()
    data_wait_s_per_step: float | None = None
    compute_s_per_step: float | None = None
    kernel_cpu_share: float | None = None  # of the training process's CPU time while measuring
    cpu_cores_used: float | None = None  # CPU seconds of the process and its DataLoader workers per wall second
    minor_faults_per_step: float | None = None
    peak_host_mb: float | None = None
    peak_host_rss_mb: float | None = None
    peak_device_mb: float | None = None  # reserved by the caching allocator (its cache included), on CUDA
    peak_device_allocated_mb: float | None = None  # the most the trial's tensors held at once, on CUDA
    device_memory_cap_mb: float | None = None  # the cap the allocator enforced in the trial, on CUDA
    startup_s: float | None = None
    warmup_s: float | None = None
    compile_s: float | None = None
    warmup_steps: int | None = None
    warmup_windows: tuple[float, ...] = ()  # windows measured, then re-labelled warm-up (measure.window_settled)
    settled: bool | None = None  # later windows confirmed the first kept one; None: one window, nothing to check
    final_loss: float | None = None
    wall_s: float | None = None
    signal: str | None = None
    traceback: str | None = None
    batch_size: int | None = None
    user_error: bool = False  # the workload itself is wrong (e.g. a callable returning the wrong things)
    samples_per_step: float | None = None  # as the workload counts them (autotune.workloads.contract), over the windows
    tokens_per_s: tuple[float, ...] = ()  # per window, when the workload's count gives tokens
    user_parts: tuple[str, ...] = ()  # the workload's own parts the trial ran (optimizer, step, count...)
    world_size: int = 1  # DDP ranks the trial ran (autotune.trial.ddp); throughput is then global, all ranks'
    ranks: tuple[dict, ...] = ()  # per rank: its median samples/s, data-wait share, threads, device peak...
    # inference: each measured step's latency, synchronised (autotune.trial.latency), nearest-rank percentiles
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_min_ms: float | None = None  # the fastest step: the floor at this batch size
    # what the trial ran when measured on the worst-case batch (MeasureSpec.worst_case): how the batch was made
    # and its tensors (autotune.workloads.worst_case); None for a search trial
    worst_case: dict | None = None
    # the first batch as a DataLoader worker shares it: its tensors' bytes and their count (trial.loader_watch);
    # what the loader's memory rule multiplies (machine.loader_memory)
    batch_bytes: int | None = None
    batch_tensors: int | None = None

    def __post_init__(self) -> None:
        check(self.status in STATUSES, "status", self.status, f"one of {', '.join(STATUSES)}")
        object.__setattr__(self, "samples_per_s", tuple(float(x) for x in self.samples_per_s))
        object.__setattr__(self, "window_steps", tuple(int(x) for x in self.window_steps))
        object.__setattr__(self, "tokens_per_s", tuple(float(x) for x in self.tokens_per_s))
        object.__setattr__(self, "warmup_windows", tuple(float(x) for x in self.warmup_windows))
        object.__setattr__(self, "user_parts", tuple(str(x) for x in self.user_parts))
        object.__setattr__(self, "ranks", tuple(dict(x) for x in self.ranks))

    # --- derived figures -------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_memory_failure(self) -> bool:
        return self.status in MEMORY_STATUSES

    @property
    def summary(self) -> Summary:
        return summarize(self.samples_per_s)

    @property
    def median_samples_per_s(self) -> float | None:
        return self.summary.median if self.samples_per_s else None

    @property
    def iqr_samples_per_s(self) -> float | None:
        return self.summary.iqr if self.samples_per_s else None

    @property
    def data_wait_share(self) -> float | None:
        """Share of step time spent waiting for the next batch (0 = never waits, 1 = only waits)."""
        if self.data_wait_s_per_step is None or self.compute_s_per_step is None:
            return None
        total = self.data_wait_s_per_step + self.compute_s_per_step
        return self.data_wait_s_per_step / total if total > 0 else None

    @property
    def straggler(self) -> int | None:
        """The rank with the lowest median throughput: in DDP every step waits for it (None: one process)."""
        rated = [r for r in self.ranks if r.get("median_samples_per_s") is not None]
        return min(rated, key=lambda r: r["median_samples_per_s"])["rank"] if rated else None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["samples_per_s"] = list(self.samples_per_s)
        d["window_steps"] = list(self.window_steps)
        d["tokens_per_s"] = list(self.tokens_per_s)
        d["user_parts"] = list(self.user_parts)
        d["ranks"] = list(self.ranks)
        return d

    def figures(self) -> dict[str, Any]:
        """Flat, JSON-friendly figures for storage as Optuna user attributes and for tables."""
        s = self.summary if self.samples_per_s else None
        out = {
            "status": self.status,
            "reason": self.reason,
            "median_samples_per_s": None if s is None else round(s.median, 3),
            "iqr_samples_per_s": None if s is None else round(s.iqr, 3),
            "rel_iqr": None if s is None else round(s.rel_iqr, 4),
            "samples_per_s": [round(x, 3) for x in self.samples_per_s],
            "data_wait_share": None if self.data_wait_share is None else round(self.data_wait_share, 4),
            "data_wait_s_per_step": self.data_wait_s_per_step,
            "compute_s_per_step": self.compute_s_per_step,
            "kernel_cpu_share": None if self.kernel_cpu_share is None else round(self.kernel_cpu_share, 4),
            "cpu_cores_used": None if self.cpu_cores_used is None else round(self.cpu_cores_used, 3),
            "minor_faults_per_step": None if self.minor_faults_per_step is None else round(self.minor_faults_per_step),
            "peak_host_mb": self.peak_host_mb,
            "peak_device_mb": self.peak_device_mb,
            "peak_device_allocated_mb": self.peak_device_allocated_mb,
            "device_memory_cap_mb": self.device_memory_cap_mb,
            "startup_s": self.startup_s,
            "warmup_s": self.warmup_s,
            "compile_s": self.compile_s,
            "warmup_windows": [round(x, 3) for x in self.warmup_windows],
            "settled": self.settled,
            "wall_s": self.wall_s,
            "final_loss": self.final_loss,
            "samples_per_step": self.samples_per_step,
            "user_parts": list(self.user_parts),
            "batch_bytes": self.batch_bytes,
            "batch_tensors": self.batch_tensors,
        }
        if self.latency_p99_ms is not None:  # inference: what a latency bound is judged on (trials.MemoryLimit)
            out.update(latency_p50_ms=self.latency_p50_ms, latency_p95_ms=self.latency_p95_ms,
                       latency_p99_ms=self.latency_p99_ms, latency_min_ms=self.latency_min_ms)
        if self.tokens_per_s:
            out["tokens_per_s"] = [round(x, 3) for x in self.tokens_per_s]
        if self.world_size > 1:
            out.update(world_size=self.world_size, ranks=list(self.ranks), straggler=self.straggler)
        if s is not None and s.warnings:
            out["warnings"] = list(s.warnings)
        return out

    def describe(self) -> str:
        """Multi-line text a person reads after ``autotune trial``."""
        from autotune._units import format_mb

        lines = [f"status        {self.status}" + (f"  ({self.reason})" if self.reason else "")]
        if self.samples_per_s:
            s = self.summary
            lines.append(f"throughput    {s.median:.1f} samples/s median, IQR {s.iqr:.1f} "
                         f"({100 * s.rel_iqr:.1f}%), {s.n} windows")
            lines.append("windows       " + ", ".join(f"{x:.1f}" for x in self.samples_per_s))
            if self.tokens_per_s:
                lines.append(f"tokens        {summarize(self.tokens_per_s).median:.1f} tokens/s median")
            for w in s.warnings:
                lines.append(f"warning       {w}")
        if self.latency_p99_ms is not None:
            lines.append(f"latency       p50 {self.latency_p50_ms:.2f} ms, p95 {self.latency_p95_ms:.2f} ms, "
                         f"p99 {self.latency_p99_ms:.2f} ms per step (fastest {self.latency_min_ms:.2f} ms)")
        if self.data_wait_share is not None:
            lines.append(f"step time     {1000 * (self.data_wait_s_per_step or 0):.1f} ms waiting for data + "
                         f"{1000 * (self.compute_s_per_step or 0):.1f} ms computing "
                         f"({100 * self.data_wait_share:.0f}% waiting)")
        if self.kernel_cpu_share is not None:
            lines.append(f"kernel time   {100 * self.kernel_cpu_share:.0f}% of the training process's CPU time, "
                         f"{self.minor_faults_per_step or 0:,.0f} page faults per step")
        mem = f"peak memory   host {format_mb(self.peak_host_mb)}"
        if self.peak_device_mb is not None:
            mem += (f", device {format_mb(self.peak_device_allocated_mb)} in tensors, "
                    f"{format_mb(self.peak_device_mb)} reserved")
            if self.device_memory_cap_mb is not None:
                mem += f" (cap {format_mb(self.device_memory_cap_mb)})"
        lines.append(mem)
        if self.batch_bytes is not None:
            lines.append(f"first batch   {format_mb(self.batch_bytes / 2**20)} in {self.batch_tensors} tensor(s), "
                         "handed over in shared memory by each DataLoader worker")
        if self.startup_s is not None:
            t = f"fixed cost    start-up {self.startup_s:.1f} s"
            if self.warmup_s is not None:
                t += f", warm-up {self.warmup_s:.1f} s ({self.warmup_steps} steps)"
            if self.compile_s:
                t += f", of which compile {self.compile_s:.1f} s"
            lines.append(t)
            if self.warmup_windows:
                rates = ", ".join(f"{x:.1f}" for x in self.warmup_windows)
                lines.append(f"warm-up tail  {len(self.warmup_windows)} window(s) ({rates} samples/s) outside the "
                             "later windows' range: counted as warm-up, not measured")
            if self.settled is False:
                lines.append("warning       the first windows never settled within the warm-up limit: "
                             "the windows are kept as measured")
        lines.extend(self._rank_lines())
        if self.user_parts:
            lines.append(f"user's parts  {', '.join(self.user_parts)} "
                         "(the rest is autotune's; see autotune.workloads.contract)")
        if self.final_loss is not None:
            lines.append(f"final loss    {self.final_loss:.4f}")
        if self.wall_s is not None:
            lines.append(f"wall time     {self.wall_s:.1f} s")
        if self.traceback and self.status == "error":
            lines.append("traceback (last lines):")
            lines.extend("  " + ln for ln in self.traceback.strip().splitlines()[-6:])
        return "\n".join(lines)

    def _rank_lines(self) -> list[str]:
        """One line per DDP rank, the straggler marked (nothing for one process)."""
        if self.world_size <= 1:
            return []
        lines = [f"ranks         {self.world_size} in one process group; throughput above is all ranks' samples "
                 "over the slowest rank's window"]
        for r in self.ranks:
            share = r.get("data_wait_share")
            lines.append(f"  rank {r['rank']}      {r.get('median_samples_per_s') or 0:.1f} samples/s median"
                         + (f", {100 * share:.0f}% waiting for data" if share is not None else "")
                         + (f", {r['threads']} threads" if r.get("threads") else "")
                         + ("  (straggler)" if r["rank"] == self.straggler else ""))
        return lines
