"""Does one inter-op thread pay on this machine? Each workload's recommendation from a quality run (its JSON: the
longest budget's pick), measured beside the same config with one inter-op thread instead of its own count, in
interleaved rounds by turns (both children alive at once, taking turns of half a second: ``trial.lockstep``), each
config first in every other round; per workload the paired ratio over the rounds with its 95% interval
(``settle.ratio_interval``) and each round's ratio.

Why: the quality benchmark's grid fixes one inter-op thread, and on the AMX Xeon of 2026-11-30 the grid's config
with one measured 1-5% ahead of a recommendation that differed from it only there (transformer_tiny, 4 of 4 rounds);
a search's single trials do not resolve 2% in 5% of noise, so whether the likely winners of a CPU kind should have
it is a question for a paired measurement like this one.

    python benchmarks/inter_op.py benchmarks/results/quality-budget-2026-11-30d-xeon-amx-all.json --rounds 6 \
        --out benchmarks/results/inter-op-2026-11-30-xeon-amx.json

Prints one line per round and a table; the raw windows go to ``--out``. Run it alone: the machine is the measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.search.choose.settle import ratio_interval  # noqa: E402
from benchmarks.quality import interleaved, paired  # noqa: E402


def picks(quality: dict) -> list[tuple[Workload, TrialConfig]]:
    """Each workload's pick at the longest budget of a quality run's JSON."""
    out: dict[str, tuple[float, Workload, TrialConfig]] = {}
    for w in quality["workloads"]:
        names = [n for n in w["contender_configs"] if n.startswith("recommendation")]
        mine = next((n for n in names if n.endswith(w["budget"])), names[0] if len(names) == 1 else None)
        if mine is None:
            continue
        if w["label"] not in out or w["budget_s"] > out[w["label"]][0]:
            out[w["label"]] = (w["budget_s"], Workload(**w["workload"]),
                               TrialConfig.from_dict(w["contender_configs"][mine]))
    return [(wl, c) for _, wl, c in out.values()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("quality_json", help="a benchmarks/quality.py --out JSON")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds per workload (default 6)")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window-seconds", type=float, default=2.0)
    ap.add_argument("--out", type=Path, help="where the raw windows go (JSON)")
    a = ap.parse_args(argv)
    hw = detect(with_torch=False)
    machine = f"{hw.cpu_model} ({hw.usable_cores} usable cores), cpu kind {hw.cpu_kind}"
    print(f"# {machine}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    measure = MeasureSpec(windows=a.windows, window_s=a.window_seconds, min_window_steps=1, timeout_s=600)
    rows, raw = [], []
    try:
        chosen = picks(json.loads(Path(a.quality_json).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"inter_op.py: {a.quality_json} is not a benchmarks/quality.py --out JSON ({type(exc).__name__}: "
                 f"{exc})")
    for workload, config in chosen:
        if config.inter_op_threads == 1:
            print(f"## {workload.label()}: its pick has one inter-op thread already; skipped", flush=True)
            continue
        print(f"## {workload.label()}: {config.short()} against one inter-op thread", flush=True)
        contenders = {"own": config, "one inter-op": dataclasses.replace(config, inter_op_threads=1)}
        xs = interleaved(workload, contenders, measure, a.rounds, by_turns=True)
        ratio, lo, hi = ratio_interval(xs["one inter-op"], xs["own"])
        per_round = (paired(xs, "one inter-op", "own") or {"rounds": []})["rounds"]  # each round's ratio of medians
        rows.append((workload.label(), config.short(), ratio, lo, hi, per_round))
        raw.append({"workload": workload.label(), "config": config.to_dict(), "windows": xs,
                    "one_over_own": {"ratio": ratio, "low": lo, "high": hi, "rounds": per_round}})
    print(f"\n{machine}; {a.rounds} rounds by turns of "
          f"{a.windows} windows of {a.window_seconds:g} s\n")
    print("| workload | pick | one inter-op thread / its own, paired 95% interval | each round |")
    print("| --- | --- | --- | --- |")
    for label, short, ratio, lo, hi, per_round in rows:
        print(f"| {label} | {short} | x{ratio:.3f} (x{lo:.3f}-x{hi:.3f}) | "
              f"{', '.join(f'{r:.3f}' for r in per_round)} |")
    if a.out:
        a.out.write_text(json.dumps({"machine": {"cpu": hw.cpu_model, "cores": hw.usable_cores, "kind": hw.cpu_kind},
                                     "date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(a) | {"out": str(a.out)},
                                     "workloads": raw}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
