"""When do step times settle? Record every step's time in a fresh process, then replay warm-up rules on them.

Each config runs in its own fresh process (never timed here): N steps of the trial's own step (``_worker.make_step``),
each synchronised, times kept. Replayed on each series: the worker's rule (the first step apart, then at
least ``2k`` steps and ``warmup_min_s`` seconds, until the median of the last k is within ``tol`` of the k
before) with today's ``warmup_min_s`` and with 0, and for each the warm-up seconds it spends and the bias it
would leave: the mean of the steps right after it ends (a window's worth) over the settled tail's median.

    python benchmarks/warmup.py                        # resnet18 at 64 and 128 px, 12 steps each
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from autotune.config import TrialConfig, Workload
from autotune.trial.worker import apply_threads, make_step
from autotune.machine.device import get_device
from autotune.workloads.build import build
import torch
w = Workload.from_dict(json.loads(sys.argv[2])); c = TrialConfig.from_dict(json.loads(sys.argv[3]))
n = int(sys.argv[4])
apply_threads(c.to_dict()); torch.manual_seed(0)
dev = get_device("cpu"); dev.prepare(c)
b = build(w, seed=0)
step = make_step(b.model, b.loss_fn, c, dev, train=True)
loader = torch.utils.data.DataLoader(b.dataset, shuffle=True, drop_last=True, **c.dataloader_kwargs())
it = iter(loader); times = []
for _ in range(n):
    try: batch = next(it)
    except StopIteration: it = iter(loader); batch = next(it)
    t = time.perf_counter(); step(batch); times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def rule(times: list[float], *, k: int, min_s: float, tol: float = 0.10, min_steps: int = 3,
         one_sided: bool = False) -> int:
    """How many steps (the first included) the worker's settle rule runs on this series. ``one_sided``: only
    steps still getting faster (by more than ``tol``) keep the warm-up going; a slower one is the machine's noise."""
    rest = times[1:]
    for n in range(2 * k, len(rest) + 1):
        since = sum(rest[:n])
        if since >= min_s and 1 + n >= min_steps:
            recent, before = statistics.median(rest[n - k:n]), statistics.median(rest[n - 2 * k:n - k])
            if (recent >= (1 - tol) * before) if one_sided else abs(recent - before) <= tol * before:
                return 1 + n
    return len(times)


def main(argv=None) -> int:
    from autotune.config import TrialConfig, Workload

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--after", type=int, default=3, help="steps after the warm-up its bias is judged on")
    a = p.parse_args(argv)
    cases = [(64, TrialConfig(batch_size=32, intra_op_threads=2, inter_op_threads=1)),
             (64, TrialConfig(batch_size=64, intra_op_threads=1, inter_op_threads=1, amp="bf16", channels_last=True)),
             (128, TrialConfig(batch_size=32, intra_op_threads=2, inter_op_threads=1))]
    print("| config | steps s (first, then each) | rule | warm-up steps | warm-up s | next steps / settled |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size, c in cases:
        w = Workload(model="resnet18", image_size=size, dataset_size=4096)
        out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), json.dumps(w.to_dict()),
                              json.dumps(c.to_dict()), str(a.steps)], capture_output=True, text=True, timeout=1800)
        if out.returncode:
            print(out.stderr[-2000:])
            continue
        times = json.loads(out.stdout.strip().splitlines()[-1])
        settled = statistics.median(times[len(times) // 2:])
        series = " ".join(f"{t:.2f}" for t in times)
        for name, k, min_s, one in (("today (k=1, 2 s)", 1, 2.0, False), ("k=1, 0 s", 1, 0.0, False),
                                    ("k=1, 2 s, one-sided", 1, 2.0, True), ("today (k=3, 2 s)", 3, 2.0, False),
                                    ("k=3, 0 s", 3, 0.0, False), ("k=3, 2 s, one-sided", 3, 2.0, True)):
            n = rule(times, k=k, min_s=min_s, min_steps=2 * k + 1, one_sided=one)
            nxt = times[n:n + a.after]
            bias = f"{statistics.mean(nxt) / settled:.3f}" if nxt else "n/a"
            print(f"| {size}px {c.short()} | {series} | {name} | {n} | {sum(times[:n]):.2f} | {bias} |", flush=True)
            series = "(same)"
    return 0


if __name__ == "__main__":
    sys.exit(main())
