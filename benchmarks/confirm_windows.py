"""How should a confirmation round be measured on a short budget: three windows of 3 s, or three of 1 s?

The claim's interval (``autotune.search.choose.confirm``) is Student's t over its rounds' log ratios, so with two
rounds (one degree of freedom, t = 12.7) it says almost nothing, and on a 4-minute budget a round of 3 windows of 3 s
a config, by turns, took ~45 s (2026-11-29f: two rounds, "no gain shown" at x4.17 and x1.33). A round with windows a
third as long costs about a third; whether that buys a narrower interval in the same time depends on how much more
a round's ratio strays with the shorter windows, which this measures.

For each workload, a pair (PyTorch's defaults at batch 64 against a faster config) in ``--rounds`` rounds by turns
(``trial.lockstep``: both children alive, taking turns of 0.5 s; the order alternating), each child measuring
``9`` windows of 1 s after its settled first window (``MeasureSpec.settle_windows``). From each child's windows:

- ``3x3s``: three windows of 3 s (consecutive triples of 1 s windows, each triple's mean rate), their median: the
  confirmation as it is (``CONFIRM_WINDOWS``, the search's ``window_s``);
- ``3x1s``: the first three 1 s windows, their median: the confirmation with 1 s windows.

Per estimator: the sd of a round's log ratio, the round's cost (the child's start-up and warm-up, plus its windows'
share of its measured wall, both children), and the expected half-width of the 95% interval over the rounds that fit
``--budgets`` seconds (rounds drawn with replacement from those measured, 2000 draws; fewer than 2 rounds: none).

    python benchmarks/confirm_windows.py                       # mobilenet_v3_small and resnet18 at 32 px, 10 rounds
    python benchmarks/confirm_windows.py --from benchmarks/results/confirm-windows-....json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.search.choose.settle import t_quantile  # noqa: E402
from autotune.trial.lockstep import run_round  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402

PAIRS = {
    "mobilenet_v3_small": TrialConfig(batch_size=256, channels_last=True),
    "resnet18": TrialConfig(batch_size=256, channels_last=True),
}
WINDOWS, WINDOW_S = 9, 1.0


def measure_pair(name: str, rounds: int, image_size: int) -> list[dict]:
    workload = Workload(model=name, image_size=image_size, num_classes=10, dataset_size=4096)
    base, fast = TrialConfig(batch_size=64), PAIRS[name]
    spec = MeasureSpec(windows=WINDOWS, window_s=WINDOW_S, min_window_steps=1, timeout_s=600)
    out = []
    for r in range(rounds):
        order = [base, fast] if r % 2 == 0 else [fast, base]
        t0 = time.monotonic()
        res = run_round(order, lambda i, gate: run_trial(workload, order[i], spec, gate=gate))
        wall = time.monotonic() - t0
        by = {("base" if c is base else "fast"): x for c, x in zip(order, res)}
        row = {"round": r, "wall_s": round(wall, 2)}
        for k, x in by.items():
            if x.status != "ok" or len(x.samples_per_s) < WINDOWS:
                raise SystemExit(f"{name} round {r} {k}: {x.status} {x.reason}")
            row[k] = {"windows": list(x.samples_per_s), "startup_s": x.startup_s, "warmup_s": x.warmup_s,
                      "wall_s": x.wall_s}
        out.append(row)
        print(f"  {name} round {r + 1}/{rounds}: {wall:.1f} s; fast/base "
              f"{statistics.median(row['fast']['windows']) / statistics.median(row['base']['windows']):.3f}",
              flush=True)
    return out


def level(windows: list[float], how: str) -> float:
    if how == "3x3s":
        return statistics.median(statistics.fmean(windows[i:i + 3]) for i in range(0, 9, 3))
    return statistics.median(windows[:3])


def analyse(name: str, rows: list[dict], budgets: list[float]) -> list[str]:
    lines = []
    # the fixed part of a round (both children's start-up and warm-up, as if one after the other: the most) and its
    # windows' part, the rest of its wall
    fixed = statistics.median(sum(r[k]["startup_s"] + r[k]["warmup_s"] for k in ("base", "fast")) for r in rows)
    per_window_s = statistics.median((r["wall_s"] - fixed) / WINDOWS for r in rows)  # both children, by turns
    rng = random.Random(0)
    for how, n in (("3x3s", 9), ("3x1s", 3)):
        logs = [math.log(level(r["fast"]["windows"], how) / level(r["base"]["windows"], how)) for r in rows]
        sd = statistics.stdev(logs)
        cost = fixed + n * per_window_s
        widths = []
        for b in budgets:
            k = int(b // cost)
            if k < 2:
                widths.append("-")
                continue
            hw = []
            for _ in range(2000):
                s = [rng.choice(logs) for _ in range(k)]
                hw.append(t_quantile(0.975, k - 1) * statistics.stdev(s) / math.sqrt(k))
            widths.append(f"{k} rounds, +/-{100 * math.expm1(statistics.fmean(hw)):.1f}%")
        lines.append(f"{name:20s} {how}: ratio x{math.exp(statistics.fmean(logs)):.3f}, round sd {100 * sd:.1f}%, "
                     f"round ~{cost:.0f} s; " + "; ".join(f"{b:.0f} s: {w}" for b, w in zip(budgets, widths)))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="mobilenet_v3_small,resnet18")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--budgets", default="60,90,120,240", help="seconds of confirmation to price (comma-separated)")
    p.add_argument("--from", dest="source", default=None, help="an earlier run's JSON: analyse it, measure nothing")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    try:
        budgets = [float(b) for b in a.budgets.split(",")]
    except ValueError:
        p.error(f"--budgets {a.budgets!r}: give seconds, comma-separated, e.g. 60,90,120")
    unknown = [n for n in a.workloads.split(",") if n not in PAIRS]
    if unknown and not a.source:
        p.error(f"--workloads: no pair for {', '.join(unknown)} (pairs: {', '.join(PAIRS)})")
    if a.source:
        data = json.loads(Path(a.source).read_text())
    else:
        hw = detect()
        data = {"machine": hw.to_dict(), "date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(a), "pairs": {}}
        print(f"# {hw.summary_line()}\n# {data['date']}", flush=True)
        out = Path(a.out or ROOT / "benchmarks" / "results" / f"confirm-windows-{time.strftime('%Y%m%d-%H%M%S')}.json")
        for name in a.workloads.split(","):
            data["pairs"][name] = measure_pair(name, a.rounds, a.image_size)
            out.write_text(json.dumps(data, indent=1, default=str))
        print(f"raw: {out}")
    for name, rows in data["pairs"].items():
        for line in analyse(name, rows, budgets):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
