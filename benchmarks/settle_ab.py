"""Does the settled warm-up (issue 15) measure the same throughput as the rule before it, for less fixed cost?

Interleaved A/B through the real runner: for each config, in each round, one trial with the rule before
(3+ per-step warm-up steps and 2+ s after the first, the first window not checked: ``settle_windows=0``) and one
with today's default (the first step, then the first window kept only if the two after it confirm it), in
alternating order. Per config: the median over rounds of the after/before ratio of the trials' medians, its
range, and each rule's median fixed share (start-up + warm-up) / wall. A ratio near 1 says the shorter warm-up
measures what the longer one did; below 1 would say it measures warm-up as steady state.

    python benchmarks/settle_ab.py                          # 4 configs of the quality grid, 3 rounds
    python benchmarks/settle_ab.py --rounds 5 --out benchmarks/results/settle-ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402

CONFIGS = [TrialConfig(batch_size=64, intra_op_threads=2, inter_op_threads=1),
           TrialConfig(batch_size=128, amp="bf16", channels_last=True, intra_op_threads=2, inter_op_threads=1),
           TrialConfig(batch_size=64, num_workers=2, prefetch_factor=2, amp="bf16", channels_last=True,
                       intra_op_threads=2, inter_op_threads=1),
           TrialConfig(batch_size=32, num_workers=1, prefetch_factor=2, intra_op_threads=1, inter_op_threads=1)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=2.0)
    p.add_argument("--out", default=None, help="JSON of every trial (default: print only)")
    a = p.parse_args(argv)
    workload = Workload(model=a.model, image_size=a.image_size)
    base = MeasureSpec(windows=a.windows, window_s=a.window_seconds, min_window_steps=1, timeout_s=600)
    rules = {"before": base.replace(warmup_min_steps=3, warmup_min_s=2.0, settle_windows=0), "settled": base}
    print(f"# {detect().summary_line()}\n# {time.strftime('%Y-%m-%d %H:%M')}  {workload.label()}, "
          f"{a.rounds} rounds, {a.windows} windows of {a.window_seconds:g} s", flush=True)
    runs: list[dict] = []
    for r in range(a.rounds):
        for i, config in enumerate(CONFIGS):
            order = list(rules) if (r + i) % 2 == 0 else list(rules)[::-1]
            for name in order:
                res = run_trial(workload, config, rules[name])
                fixed = (res.startup_s or 0) + (res.warmup_s or 0)
                runs.append({"round": r, "config": config.short(), "rule": name, "status": res.status,
                             "median": res.median_samples_per_s, "samples": list(res.samples_per_s),
                             "warmup_windows": list(res.warmup_windows), "fixed_share": fixed / res.wall_s,
                             "warmup_s": res.warmup_s, "wall_s": res.wall_s})
                print(f"round {r + 1} {config.short():<32} {name:<8} {res.status:<6} "
                      f"{(res.median_samples_per_s or 0):7.1f}/s  fixed {fixed / res.wall_s:4.0%}", flush=True)
                if a.out:  # written as it goes: a killed run keeps its trials
                    Path(a.out).write_text(json.dumps({"workload": workload.to_dict(), "runs": runs}, indent=1))
    print("\n| config | settled / before (median of rounds) | range | fixed share before | settled |")
    print("| --- | --- | --- | --- | --- |")
    all_ratios = []
    for config in CONFIGS:
        mine = [x for x in runs if x["config"] == config.short() and x["status"] == "ok"]
        by_round = {}
        for x in mine:
            by_round.setdefault(x["round"], {})[x["rule"]] = x
        ratios = sorted(d["settled"]["median"] / d["before"]["median"] for d in by_round.values() if len(d) == 2)
        all_ratios += ratios
        share = {n: statistics.median(x["fixed_share"] for x in mine if x["rule"] == n) for n in rules}
        print(f"| {config.short()} | {statistics.median(ratios):.3f} | {ratios[0]:.3f}-{ratios[-1]:.3f} | "
              f"{share['before']:.0%} | {share['settled']:.0%} |" if ratios else f"| {config.short()} | n/a |")
    if all_ratios:
        print(f"\nall pairs: settled / before median {statistics.median(all_ratios):.3f} "
              f"({min(all_ratios):.3f}-{max(all_ratios):.3f}, {len(all_ratios)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
