#!/usr/bin/env python
"""How reproducible is one measurement? Run the same config N times, each in a fresh process, and report the
spread of the medians.

Each run goes through ``autotune.runner.run_trial`` exactly as a tuning trial does (fresh child, warm-up, measured
windows). The spread of the run medians is the noise floor: configs closer than it cannot be told apart on this
machine. Raw window samples of every run are written to a JSON file.

    python benchmarks/spread.py                                  # resnet18, 128 px, train, batch 64, 5 runs
    python benchmarks/spread.py --runs 10 --threads 2 --amp bf16 --channels-last
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a source checkout without installing

from autotune.config import AMP_MODES, MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.errors import AutotuneError  # noqa: E402
from autotune.hardware import detect  # noqa: E402
from autotune.measure import summarize  # noqa: E402
from autotune.runner import run_trial  # noqa: E402
from autotune.workloads import check  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    default = MeasureSpec()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18", help="torchvision model or package.module:callable (default: %(default)s)")
    p.add_argument("--task", choices=("train", "infer"), default="train")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--runs", type=int, default=5, help="fresh processes to run (default: %(default)s)")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    p.add_argument("--amp", choices=AMP_MODES, default="off")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--malloc", choices=("default", "retain"), default="default",
                   help="retain: glibc keeps freed memory (fewer page faults, see autotune/_malloc.py)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--windows", type=int, default=default.windows, help="default: the runner's, %(default)s")
    p.add_argument("--window-seconds", type=float, default=default.window_s, help="default: the runner's, %(default)s")
    p.add_argument("--timeout", type=float, default=default.timeout_s, help="per-run time limit in seconds")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON file for the raw samples (default: benchmarks/results/spread-<timestamp>.json)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    return args


def spread_of(medians: list[float]) -> dict:
    """(max - min) / median and IQR / median of the run medians."""
    s = summarize(medians)
    return {
        "runs_ok": len(medians),
        "median_of_medians": s.median,
        "min": s.min,
        "max": s.max,
        "range_rel": (s.max - s.min) / s.median if s.median else float("inf"),
        "iqr_rel": s.rel_iqr,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    hw = detect()
    print(f"machine: {hw.summary_line()} [fingerprint {hw.fingerprint}]", flush=True)
    try:
        workload = Workload(model=args.model, task=args.task, image_size=args.image_size, device=args.device)
        config = TrialConfig(batch_size=args.batch_size, num_workers=args.num_workers, amp=args.amp,
                             channels_last=args.channels_last, intra_op_threads=args.threads,
                             malloc=args.malloc)
        measure = MeasureSpec().replace(windows=args.windows, window_s=args.window_seconds, timeout_s=args.timeout)
        check(workload)
    except AutotuneError as exc:
        print(f"spread.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"config:  {workload.label()} {config.short()}; {measure.windows} windows x {measure.window_s:g} s, "
          f"{args.runs} runs", flush=True)

    runs = []
    for i in range(args.runs):
        r = run_trial(workload, config, measure)
        runs.append(r)
        if r.ok:
            s = r.summary
            print(f"run {i + 1}/{args.runs}: median {s.median:10.2f} samples/s  IQR {s.iqr:8.2f} "
                  f"({100 * s.rel_iqr:5.1f}%)  windows {len(r.samples_per_s)}  wall {r.wall_s:.1f} s", flush=True)
        else:
            print(f"run {i + 1}/{args.runs}: {r.status} ({r.reason})", flush=True)

    medians = [r.median_samples_per_s for r in runs if r.ok]
    spread = spread_of(medians) if medians else None
    if spread is None:
        print("spread: no run finished; nothing to compare")
    else:
        print(f"spread of {len(medians)} run medians: (max-min)/median {100 * spread['range_rel']:.1f}%, "
              f"IQR/median {100 * spread['iqr_rel']:.1f}% (median of medians {spread['median_of_medians']:.2f} "
              "samples/s)")

    out = args.out or HERE / "results" / f"spread-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": hw.to_dict(),
        "workload": workload.to_dict(),
        "config": config.to_dict(),
        "measure": measure.to_dict(),
        "runs": [r.to_dict() for r in runs],
        "medians": medians,
        "spread": spread,
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"raw samples written to {out}")
    return 0 if medians else 1


if __name__ == "__main__":
    sys.exit(main())
