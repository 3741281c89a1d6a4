"""Rounds one after the other, or by turns: how far one round's ratio of two configs strays, each way.

A round of the finalists or the confirmation compares configs, each in a fresh child process. Run one after the
other (the way every round ran until 2026-11-29), each child meets another moment of the machine's drift; run by
turns (``autotune.trial.lockstep``: all alive, in turns of half a second, each stopped while another measures), the
drift is shared. This script runs both, interleaved round by round on the same configs (the order of the two ways
alternates, and so does the order of the configs within a round), and prints for each way the rounds' log ratios:
their mean, their standard deviation (what one round's ratio strays by: an interval over n rounds is about 2 x sd /
sqrt(n) wide) with a 95% interval for it (chi-square), and the wall time a round took. An A/A pair (one config
twice: the true ratio is 1) shows the noise alone; an A/B pair shows that both ways find the same ratio (``bs``:
batch 32 against 128, whose steps differ 3-4x in length, so one takes more steps a turn than the other: where the
first step of a turn were charged, the two ways would part).

    python benchmarks/lockstep.py --window-s 3 --rounds 8           # ~13 min: A/A and A/B, as the product measures
    python benchmarks/lockstep.py --rounds 4 --pairs aa             # a quick look

Raw windows and per-round figures go to ``--out`` (JSON). The figures are this machine's, at this hour: the VM's
noise moves between sessions, so the file names the CPU and the time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.trial.lockstep import run_round  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402
from autotune.trial.windows import TURN_S  # noqa: E402

# chi-square quantiles (2.5%, 97.5%) by degrees of freedom, for the sd's 95% interval
_CHI2 = {1: (0.000982, 5.024), 2: (0.0506, 7.378), 3: (0.216, 9.348), 4: (0.484, 11.14), 5: (0.831, 12.83),
         6: (1.237, 14.45), 7: (1.690, 16.01), 8: (2.180, 17.53), 9: (2.700, 19.02), 10: (3.247, 20.48),
         11: (3.816, 21.92), 12: (4.404, 23.34), 13: (5.009, 24.74), 14: (5.629, 26.12), 15: (6.262, 27.49),
         19: (8.907, 32.85), 24: (12.40, 39.36), 29: (16.05, 45.72)}


def sd_interval(logs: list[float]) -> tuple[float, float, float]:
    """The sample sd of ``logs`` and its 95% interval (normal draws; df = n - 1, the nearest tabled below)."""
    n = len(logs)
    sd = statistics.stdev(logs)
    df = max(k for k in _CHI2 if k <= n - 1)
    lo_q, hi_q = _CHI2[df]
    return sd, sd * math.sqrt((n - 1) / hi_q), sd * math.sqrt((n - 1) / lo_q)


def one_round(way: str, workload: Workload, configs: list[TrialConfig], measure: MeasureSpec,
              turn_s: float = TURN_S) -> tuple[list, float]:
    """The results of ``configs`` run one after the other ("after") or by turns ("turns"), and the round's wall."""
    t0 = time.monotonic()
    if way == "turns":
        results = run_round(configs, lambda i, g: run_trial(workload, configs[i], measure, gate=g), turn_s=turn_s)
    else:
        results = [run_trial(workload, c, measure) for c in configs]
    return results, time.monotonic() - t0


def pair(name: str, workload: Workload, a: TrialConfig, b: TrialConfig, measure: MeasureSpec, rounds: int,
         log, turn_s: float = TURN_S) -> dict:
    rows: list[dict] = []
    for r in range(rounds):
        ways = ("after", "turns") if r % 2 == 0 else ("turns", "after")
        for way in ways:
            order = [a, b] if (r // 2) % 2 == 0 else [b, a]
            results, wall = one_round(way, workload, order, measure, turn_s)
            got = {("a" if c is a else "b"): res for c, res in zip(order, results)}
            if not all(res.ok for res in got.values()):
                log(f"  {name} round {r + 1} {way}: " + "; ".join(f"{k} {v.status} {v.reason}" for k, v in got.items()))
                continue
            ra, rb = (statistics.median(got[k].samples_per_s) for k in ("a", "b"))
            rows.append({"round": r, "way": way, "first": "a" if order[0] is a else "b", "wall_s": round(wall, 2),
                         "a": list(got["a"].samples_per_s), "b": list(got["b"].samples_per_s),
                         "log_ratio": math.log(rb / ra)})
            log(f"  {name} round {r + 1:>2} {way:<5} a {ra:8.1f}/s  b {rb:8.1f}/s  b/a {rb / ra:.3f}  ({wall:.0f} s)")
    out = {"pair": name, "a": a.short(), "b": b.short(), "rounds": rows, "ways": {}}
    for way in ("after", "turns"):
        logs = [x["log_ratio"] for x in rows if x["way"] == way]
        if len(logs) < 2:
            continue
        sd, lo, hi = sd_interval(logs)
        out["ways"][way] = {"n": len(logs), "ratio": math.exp(statistics.mean(logs)), "sd": sd, "sd_low": lo,
                            "sd_high": hi, "round_s": statistics.median(x["wall_s"] for x in rows if x["way"] == way)}
    return out


def table(results: list[dict]) -> str:
    lines = ["| pair | way | rounds | mean ratio | sd of one round's log ratio (95%) | round wall |",
             "| --- | --- | --- | --- | --- | --- |"]
    for res in results:
        for way, w in res["ways"].items():
            label = "one after the other" if way == "after" else "by turns"
            lines.append(f"| {res['pair']}: {res['b']} / {res['a']} | {label} | {w['n']} | x{w['ratio']:.3f} | "
                         f"{100 * w['sd']:.1f}% ({100 * w['sd_low']:.1f}-{100 * w['sd_high']:.1f}%) | "
                         f"{w['round_s']:.0f} s |")
        ways = res["ways"]
        if "after" in ways and "turns" in ways and ways["turns"]["sd"] > 0:
            k = (ways["after"]["sd"] / ways["turns"]["sd"]) ** 2
            lines.append(f"| {res['pair']} | | | | by turns, one round is worth ~{k:.1f} rounds one after the "
                         "other | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=10, help="rounds each way, per pair (default: %(default)s)")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--pairs", default="aa,ab", help="aa (one config twice), ab (channels_last against not), bs (batch "
                   "32 against 128)")
    p.add_argument("--turn-s", type=float, default=TURN_S, help="how long a turn lasts (default: %(default)s)")
    p.add_argument("--out", default=None, help="raw rounds as JSON (default: none)")
    args = p.parse_args(argv)

    from autotune.machine.hardware import detect

    workload = Workload(model=args.model, image_size=args.image_size)
    measure = MeasureSpec(windows=args.windows, window_s=args.window_s)
    base = TrialConfig(batch_size=args.batch_size)
    pairs = {"aa": (base, TrialConfig(batch_size=args.batch_size)),
             "ab": (base, TrialConfig(batch_size=args.batch_size, channels_last=True)),
             "bs": (TrialConfig(batch_size=32), TrialConfig(batch_size=128))}
    machine = detect().summary_line()
    print(f"# {machine}; load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    print(f"# {args.model} {args.image_size} px, {args.windows} windows of {args.window_s:g} s, {args.rounds} rounds "
          f"each way, interleaved; turns of {args.turn_s:g} s", flush=True)
    results = [pair(name, workload, *pairs[name], measure, args.rounds, lambda s: print(s, flush=True), args.turn_s)
               for name in args.pairs.split(",")]
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "created": time.strftime("%Y-%m-%dT%H:%M"),
                                              "args": vars(args), "pairs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
