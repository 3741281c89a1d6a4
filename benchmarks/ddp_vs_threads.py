#!/usr/bin/env python
"""N DDP ranks x T threads against one process x N*T threads, at the same global batch, on this machine.

Each run is one trial as the tuner runs it (``autotune.trial.runner.run_trial``: a fresh child, warm-up,
measured windows; with ranks, the trial child starts them as one gloo process group, ``autotune.trial.ddp``).
The two configs alternate in rotating order, round after round, so a slow stretch of the shared machine falls on
both; each run's window rates are kept raw in a JSON file, and the ratio of the medians comes with a 95%
paired interval over the rounds (``search.choose.settle.ratio_interval``: Student's t over the rounds' log ratios,
the finalists' own rule).

    python benchmarks/ddp_vs_threads.py                        # resnet18, 64 px, global batch 32, 3 rounds
    python benchmarks/ddp_vs_threads.py --ranks 2 --rounds 5 --global-batch 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing

from autotune._atomic import atomic_write  # noqa: E402
from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.search.choose.settle import ratio_interval  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402


def contenders(a) -> dict[str, tuple[Workload, TrialConfig]]:
    per_rank = a.global_batch // a.ranks
    return {
        f"{a.ranks} ranks x {a.threads} thread(s), batch {per_rank} each": (
            Workload(model=a.model, image_size=a.image_size, nproc_per_node=a.ranks),
            TrialConfig(batch_size=per_rank, intra_op_threads=a.threads)),
        f"1 process x {a.ranks * a.threads} threads, batch {a.global_batch}": (
            Workload(model=a.model, image_size=a.image_size),
            TrialConfig(batch_size=a.global_batch, intra_op_threads=a.ranks * a.threads)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--window-seconds", type=float, default=2.0)
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/ddp-vs-threads-<time>.json)")
    a = p.parse_args(argv)
    if a.global_batch % a.ranks:
        p.error(f"--global-batch {a.global_batch} does not split into {a.ranks} equal per-rank batches")
    hw = detect()
    measure = MeasureSpec(windows=a.windows, window_s=a.window_seconds, timeout_s=900)
    runs = contenders(a)
    names = list(runs)
    raw: dict[str, list[list[float]]] = {n: [] for n in names}
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {hw.summary_line()}", flush=True)
    for r in range(a.rounds):
        for n in names[r % 2:] + names[: r % 2]:
            wl, cfg = runs[n]
            res = run_trial(wl, cfg, measure)
            if res.ok:
                raw[n].append(list(res.samples_per_s))
            print(f"  round {r + 1}/{a.rounds} {n:<40} {res.status:<6} "
                  + (f"{res.median_samples_per_s:7.1f} samples/s (global)" if res.ok else res.reason), flush=True)
    print()
    for n in names:
        meds = [statistics.median(x) for x in raw[n]]
        if meds:
            print(f"{n:<40} median of run medians {statistics.median(meds):7.1f} samples/s, runs {min(meds):.1f}"
                  f"-{max(meds):.1f} ({len(meds)} runs)")
    if all(raw[n] for n in names) and len(raw[names[0]]) == len(raw[names[1]]):
        ratio, lo, hi = ratio_interval(raw[names[0]], raw[names[1]])
        verdict = ("within the noise" if lo <= 1 <= hi else
                   f"{'ranks' if ratio > 1 else 'one process'} faster")
        print(f"ranks / one process: {ratio:.3f} (95% interval {lo:.3f}-{hi:.3f}): {verdict}")
    out = Path(a.out) if a.out else HERE / "results" / f"ddp-vs-threads-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps({"args": vars(a), "machine": hw.summary_line(), "windows": raw}, indent=1))
    print(f"raw windows: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
