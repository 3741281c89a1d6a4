"""What changed on the machine while the run trained: this process's memory with its DataLoader workers, the share
of the machine's memory free, and the cores other processes took (psutil). Sampled in the field run's own thread,
never in the training step.
"""

from __future__ import annotations

import os
import time

__all__ = ["HostSampler"]


class HostSampler:
    """``sample()``: ``rss_mb`` (this process and its children), ``avail_share`` (of the machine's memory),
    ``others_cores`` (cores busy with other processes since the last sample: the machine's busy time less this
    process tree's CPU time, over the wall time between samples). Raises only what psutil raises."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process(os.getpid())
        self._last: tuple[float, float, float] | None = None  # wall, machine busy s, our tree's CPU s

    def _tree(self) -> list:
        try:
            return [self._me, *self._me.children(recursive=True)]
        except self._psutil.Error:
            return [self._me]

    def sample(self) -> dict:
        ps = self._psutil
        rss = ours = 0.0
        for p in self._tree():
            try:
                rss += p.memory_info().rss
                t = p.cpu_times()
                ours += t.user + t.system
            except ps.Error:  # a worker that just exited
                continue
        ct = ps.cpu_times()
        busy = sum(ct) - ct.idle - getattr(ct, "iowait", 0.0)
        now = time.monotonic()
        out = {"rss_mb": round(rss / 2**20, 1), "avail_share": round(ps.virtual_memory().available
                                                                     / ps.virtual_memory().total, 4)}
        if self._last is not None and now - self._last[0] > 0.05:
            wall = now - self._last[0]
            # clamped at 0: a worker that exited took its CPU time with it
            out["others_cores"] = round(max(0.0, (busy - self._last[1]) - (ours - self._last[2])) / wall, 2)
        self._last = (now, busy, ours)
        return out
