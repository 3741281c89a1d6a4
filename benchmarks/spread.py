#!/usr/bin/env python
"""How reproducible is one measurement? Run the same config N times, each in a fresh process, and report the
spread of the medians.

Each run goes through ``autotune.trial.runner.run_trial`` exactly as a tuning trial does (fresh child, warm-up, measured
windows). The spread of the run medians is the noise floor: configs closer than it cannot be told apart on this
machine. Raw window samples of every run are written to a JSON file.

    python benchmarks/spread.py                                  # resnet18, 128 px, train, batch 64, 5 runs
    python benchmarks/spread.py --runs 10 --threads 2 --amp bf16 --channels-last
    python benchmarks/spread.py --malloc default retain hugepages   # three allocators, runs interleaved

With several ``--malloc`` modes the runs are interleaved in rotating order (A B C, B C A, ...), so a slow
stretch of the shared machine falls on every mode alike, and each mode's spread and median are printed.
Each run also prints its page faults per step and the kernel's share of CPU time: with glibc's default
allocator, how many pages a fresh process faults in per step depends on its own heap history, and that, more
than the measuring, is what makes two fresh processes of one config differ.
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

from autotune.machine.malloc import MALLOC_MODES  # noqa: E402
from autotune.config import AMP_MODES, MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.errors import AutotuneError  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.measure import summarize  # noqa: E402
from autotune._atomic import atomic_write  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402
from autotune.workloads.build import check  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    default = MeasureSpec()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18",
                   help="torchvision model or package.module:callable (default: %(default)s)")
    p.add_argument("--task", choices=("train", "infer"), default="train")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--runs", type=int, default=5, help="fresh processes to run (default: %(default)s)")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    p.add_argument("--amp", choices=AMP_MODES, default="off")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--malloc", choices=MALLOC_MODES, nargs="+", default=["default"], metavar="MODE",
                   help="one or more of: %(choices)s. retain: glibc keeps freed memory; hugepages: retain + "
                        "PyTorch's transparent huge pages (see autotune/machine/malloc.py). Several: runs interleaved")
    p.add_argument("--device", default="cpu")
    p.add_argument("--windows", type=int, default=default.windows, help="default: the runner's, %(default)s")
    p.add_argument("--window-seconds", type=float, default=default.window_s, help="default: the runner's, %(default)s")
    p.add_argument("--timeout", type=float, default=default.timeout_s, help="per-run time limit in seconds")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON file for the raw samples (default: benchmarks/results/spread-<timestamp>.json)")
    p.add_argument("--target", type=float, default=0.05,
                   help="the spread the runner's defaults should keep, as a fraction (default: %(default)s)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    args.malloc = list(dict.fromkeys(args.malloc))  # each mode once, in the order given
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


def common_drift(medians_by_config: dict[str, list[float | None]]) -> dict[str, list[float]] | None:
    """For each config, the machine's own speed in each interleaved round as the *other* configs saw it: the mean
    over the other configs of (that round's run median / that config's median of medians). Something that slows
    every config in the same round (a busy neighbour on the VM) shows here; dividing a config's run medians by
    it leaves that config's own spread. The config itself is left out: a drift estimate that contained its own
    run would divide out part of its own noise and understate its spread (by ~18% with three configs). The
    estimate still carries the other configs' noise, so the spread left is, if anything, a little high.
    None with fewer than two configs (one config cannot tell the machine's drift from its own) or a failed run.

    >>> d = common_drift({"a": [9.0, 10.0, 11.0], "b": [18.0, 20.0, 22.0], "c": [5.0, 5.0, 5.0]})
    >>> [round(x, 3) for x in d["a"]], [round(x, 3) for x in d["c"]]
    ([0.95, 1.0, 1.05], [0.9, 1.0, 1.1])
    """
    if len(medians_by_config) < 2 or any(m is None for ms in medians_by_config.values() for m in ms):
        return None
    rel = {name: [m / statistics.median(ms) for m in ms] for name, ms in medians_by_config.items()}
    rounds = len(next(iter(rel.values())))
    return {name: [statistics.mean(rel[o][i] for o in rel if o != name) for i in range(rounds)] for name in rel}


def run_line(r) -> str:
    """One run: its median and in-run spread, and the page faults and kernel share behind them."""
    if not r.ok:
        return f"{r.status} ({r.reason})"
    s = r.summary
    kernel = "" if r.kernel_cpu_share is None else f"  kernel {100 * r.kernel_cpu_share:4.1f}%"
    faults = "" if r.minor_faults_per_step is None else f"  faults/step {r.minor_faults_per_step:9,.0f}"
    return (f"median {s.median:9.2f} samples/s  IQR {100 * s.rel_iqr:4.1f}%  windows {len(r.samples_per_s)}"
            f"{kernel}{faults}  wall {r.wall_s:.1f} s")


def main(argv=None) -> int:
    args = parse_args(argv)
    hw = detect()
    print(f"machine: {hw.summary_line()} [fingerprint {hw.fingerprint}]", flush=True)
    try:
        workload = Workload(model=args.model, task=args.task, image_size=args.image_size, device=args.device)
        configs = [TrialConfig(batch_size=args.batch_size, num_workers=args.num_workers, amp=args.amp,
                               channels_last=args.channels_last, intra_op_threads=args.threads, malloc=m)
                   for m in args.malloc]
        measure = MeasureSpec().replace(windows=args.windows, window_s=args.window_seconds, timeout_s=args.timeout)
        check(workload)
    except AutotuneError as exc:
        print(f"spread.py: error: {exc}", file=sys.stderr)
        return 2
    for c in configs:
        print(f"config:  {workload.label()} {c.short()}", flush=True)
    print(f"measure: {measure.windows} windows x {measure.window_s:g} s, {args.runs} fresh processes per config"
          + (", interleaved" if len(configs) > 1 else ""), flush=True)

    out = Path(args.out or HERE / "results" / f"spread-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"raw samples: {out} (rewritten after every run)", flush=True)
    runs: dict[str, list] = {c.malloc: [] for c in configs}
    spreads: dict[str, dict | None] = {c.malloc: None for c in configs}
    drift = None

    def save(complete: bool) -> None:
        """The raw runs so far, rewritten after every run: a killed benchmark keeps what it measured."""
        atomic_write(out, json.dumps({
            "created": created,
            "complete": complete,
            "machine": hw.to_dict(),
            "workload": workload.to_dict(),
            "measure": measure.to_dict(),
            "configs": {c.malloc: {"config": c.to_dict(), "runs": [r.to_dict() for r in runs[c.malloc]],
                                   "medians": [r.median_samples_per_s for r in runs[c.malloc] if r.ok],
                                   "spread": spreads[c.malloc]} for c in configs},
            "target": args.target,
            "common_drift": drift,
        }, indent=2))

    for i in range(args.runs):
        k = i % len(configs)
        for c in configs[k:] + configs[:k]:  # rotate who goes first: no config always gets the fresher machine
            r = run_trial(workload, c, measure)
            runs[c.malloc].append(r)
            label = f"malloc={c.malloc:<9} " if len(configs) > 1 else ""
            save(complete=False)  # before the line: a run shown is a run on disk
            print(f"run {i + 1}/{args.runs} {label}{run_line(r)}", flush=True)

    drift = common_drift({m: [r.median_samples_per_s if r.ok else None for r in rs] for m, rs in runs.items()})
    verdicts = []
    for c in configs:
        medians = [r.median_samples_per_s for r in runs[c.malloc] if r.ok]
        spread = spreads[c.malloc] = spread_of(medians) if medians else None
        label = f"malloc={c.malloc}: " if len(configs) > 1 else ""
        if spread is None:
            print(f"{label}no run finished; nothing to compare")
            continue
        within = spread["range_rel"] <= args.target
        verdicts.append(within)
        print(f"{label}spread of {len(medians)} run medians: (max-min)/median {100 * spread['range_rel']:.1f}%, "
              f"IQR/median {100 * spread['iqr_rel']:.1f}% (median of medians {spread['median_of_medians']:.2f} "
              f"samples/s; range {spread['min']:.2f}-{spread['max']:.2f}): "
              f"{'within' if within else 'NOT within'} the {100 * args.target:g}% target")
        if drift is not None:
            adjusted = [r.median_samples_per_s / d for r, d in zip(runs[c.malloc], drift[c.malloc])]
            spread["without_common_drift"] = spread_of(adjusted)
            print(f"{label}  without the drift the other configs saw in the same rounds: (max-min)/median "
                  f"{100 * spread['without_common_drift']['range_rel']:.1f}%, IQR/median "
                  f"{100 * spread['without_common_drift']['iqr_rel']:.1f}%")
    if drift is not None:
        speed = [statistics.mean(ds[i] for ds in drift.values()) for i in range(args.runs)]
        print("the machine's own speed per round (all configs): " + ", ".join(f"{x:.3f}" for x in speed)
              + f"; range {100 * (max(speed) - min(speed)):.1f}%")

    save(complete=True)
    print(f"raw samples written to {out}")
    return 0 if verdicts else 1


if __name__ == "__main__":
    sys.exit(main())
