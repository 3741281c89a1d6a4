"""What a trial's fixed cost is, cold (a fresh interpreter imports torch) vs forked from a fork server.

Interleaved trials of one config (cold, forked, cold, forked, ...) through the real runner; per trial: wall
(the parent's clock from launch to result, which is fine for a fixed cost: no throughput is timed here),
start-up (launch -> workload built, dataloader ready), warm-up (first step and the settle rule), the measured
windows, and the fixed share (start-up + warm-up) / wall, which ``benchmarks/quality_grid.py`` reports per grid.
The first forked trial also starts the server (one torch import): it is shown apart, not in the medians.
The workload is checked first, as ``autotune run`` checks it (its ``data`` then travels to each trial, which need not
check it again); ``--recheck`` adds forked trials of the unchecked workload, interleaved, whose child checks it itself
(what every trial paid before 2026-11-27).

    python benchmarks/startup.py                       # resnet18, 64 px, batch 32, 2 threads, 4 trials a mode
    python benchmarks/startup.py --trials 6 --image-size 128
    python benchmarks/startup.py --batch-size 64 --threads 1 --amp bf16 --channels-last
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.trial.forkserver import ForkServers  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402


def row(r) -> dict:
    windows_s = sum(steps * r.batch_size / sps for steps, sps in zip(r.window_steps, r.samples_per_s))
    fixed = (r.startup_s or 0) + (r.warmup_s or 0)
    return {"wall": r.wall_s, "startup": r.startup_s or 0, "warmup": r.warmup_s or 0, "windows": windows_s,
            "fixed_share": fixed / r.wall_s, "peak_mb": r.peak_host_mb or 0, "sps": r.median_samples_per_s or 0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--amp", default="off", choices=("off", "bf16"))
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--trials", type=int, default=4, help="per mode (default %(default)s)")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=2.0)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--recheck", action="store_true",
                   help="also forked trials of the unchecked workload (the child checks it), interleaved")
    a = p.parse_args(argv)
    # quality_grid.py's spec: the same trial the grid runs
    spec = MeasureSpec(windows=a.windows, window_s=a.window_seconds, min_window_steps=1,
                       warmup_min_steps=a.warmup_steps, timeout_s=600)
    from autotune.workloads.build import check

    unchecked = Workload(model=a.model, image_size=a.image_size, dataset_size=2048)
    workload = check(unchecked)  # as autotune run does: the trials get what it found
    config = TrialConfig(batch_size=a.batch_size, intra_op_threads=a.threads, inter_op_threads=1, amp=a.amp,
                         channels_last=a.channels_last)
    load = Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") else "?"
    print(f"# {workload.label()} {config.short()}  loadavg at start {' '.join(load)}")
    rows: dict[str, list[dict]] = {"cold": [], "fork": [], **({"fork-recheck": []} if a.recheck else {})}
    first = None
    with ForkServers() as servers:
        cold = ForkServers(enabled=False)
        for i in range(a.trials + 1):  # one more forked trial: the first starts the server
            modes = [("fork", servers, workload), ("cold", cold, workload)]
            modes += [("fork-recheck", servers, unchecked)] if a.recheck else []
            for mode, pool, w in modes:
                if mode != "fork" and i == a.trials:
                    continue
                r = run_trial(w, config, spec, servers=pool)
                if not r.ok:
                    print(f"{mode} trial failed: {r.status} {r.reason}")
                    continue
                x = row(r)
                if mode == "fork" and i == 0:
                    first = x
                else:
                    rows[mode].append(x)
                print(f"{mode} {i}: " + "  ".join(f"{k} {v:.2f}" for k, v in x.items()), flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") else "?"
    print(f"\n# loadavg at end {' '.join(load)}\n")
    print("| mode | trials | wall s | start-up s | warm-up s | windows s | fixed share | peak MiB | samples/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, xs in rows.items():
        if not xs:
            continue
        cells = []
        for k in ("wall", "startup", "warmup", "windows", "fixed_share", "peak_mb", "sps"):
            v = [x[k] for x in xs]
            fmt = "{:.0%}" if k == "fixed_share" else "{:.0f}" if k in ("peak_mb", "sps") else "{:.2f}"
            cells.append(f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})")
        print(f"| {mode} | {len(xs)} | " + " | ".join(cells) + " |")
    if first:
        print(f"\nfirst forked trial (starts the server): wall {first['wall']:.2f} s, "
              f"start-up {first['startup']:.2f} s")
    print("\nmedian (min-max) per mode; the machine's other load moves every figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
