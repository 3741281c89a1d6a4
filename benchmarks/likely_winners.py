"""Which knob values win on THIS kind of CPU: the likely winners' entry of ``search_spaces/likely.yaml``, measured.

For each workload, every combination of the bundle's knobs (bf16 where the CPU has it, channels_last for images,
the allocators default, retain and tcmalloc where installed: ``quality.ground_truth``) x the batch sizes runs
through the real runner, each config in ``--rounds`` fresh processes (the order shuffled anew each round: a
process's level moves 5-20% on these VMs), its figure the median of its processes.
Per knob and value: on how many workloads the best config had it, and the best config with that value over the
best without it (the geometric mean over the workloads). A knob's values are ordered by wins, then by that ratio;
a value that won nowhere and lost by more than 3% on average is left out of the order (the separation would only
drop it again).

It prints the table and the YAML entry for this CPU kind (``Hardware.cpu_kind``); ``--write`` puts the entry into
``search_spaces/likely.yaml`` with the machine, the date and the raw results' file, and keeps the others.

    python benchmarks/likely_winners.py                                  # 4 workloads, 32 px, batch 16/32, 3 rounds
    python benchmarks/likely_winners.py --workloads resnet18,mobilenet_v3_small --write
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

from benchmarks.quality import WORKLOADS, ground_truth, space_doc  # noqa: E402
from autotune.config import MeasureSpec, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.search.space.search_space import fit_workload, space_from_dict  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402

KNOBS = ("amp", "channels_last", "malloc")
LOSES = 0.97  # a value that never won and ran under this share of the best without it is left out of the order


def measure_grid(name: str, a, hw, measure) -> dict:
    """``{config key: {"config", "medians": [per round], "figure"}}`` for one workload's grid."""
    workload = Workload(model=name, image_size=a.image_size, num_classes=10, dataset_size=a.dataset_size)
    space = fit_workload(space_from_dict(space_doc(a.batches, a.batches[0]), hardware=hw), workload)
    configs = ground_truth(space)
    rows = {c.key(): {"config": c, "medians": []} for c in configs}
    rng = random.Random(a.seed)
    for r in range(a.rounds):
        order = list(configs)
        rng.shuffle(order)
        for i, c in enumerate(order):
            res = run_trial(workload, c, measure)
            rows[c.key()]["medians"].append(res.median_samples_per_s if res.ok else 0.0)
            print(f"  {name} round {r + 1}/{a.rounds} {i + 1}/{len(order)} {c.short():<40} {res.status:<6} "
                  f"{res.median_samples_per_s or 0:8.1f}/s", flush=True)
    for row in rows.values():
        row["figure"] = statistics.median(row["medians"]) if all(row["medians"]) else 0.0
    return rows


def knob_table(grids: dict[str, dict]) -> dict[str, dict]:
    """Per knob, per value: wins (workloads whose best config had it) and the geometric mean over workloads of
    the best with it over the best without it."""
    out: dict[str, dict] = {}
    for knob in KNOBS:
        values = sorted({getattr(r["config"], knob) for g in grids.values() for r in g.values()}, key=str)
        if len(values) < 2:
            continue
        out[knob] = {}
        for v in values:
            wins, logs = 0, []
            for g in grids.values():
                ok = [r for r in g.values() if r["figure"]]
                if len({getattr(r["config"], knob) for r in ok}) < 2:  # not varied there (channels_last on text)
                    continue
                best = max(ok, key=lambda r: r["figure"])
                wins += getattr(best["config"], knob) == v
                with_v = max((r["figure"] for r in ok if getattr(r["config"], knob) == v), default=0.0)
                without = max((r["figure"] for r in ok if getattr(r["config"], knob) != v), default=0.0)
                if with_v and without:
                    logs.append(math.log(with_v / without))
            out[knob][str(v).lower() if isinstance(v, bool) else v] = {
                "wins": wins, "ratio": math.exp(statistics.fmean(logs)) if logs else None}
    return out


def order(table: dict[str, dict], baseline: dict) -> dict[str, list]:
    """Each knob's values, the baseline's own left out, by wins then ratio; a value that never won and lost by
    more than ``1 - LOSES`` on average left out."""
    knobs = {}
    for knob, values in table.items():
        kept = [(v, s) for v, s in values.items() if str(v).lower() != str(baseline.get(knob)).lower()
                and (s["wins"] or (s["ratio"] or 0.0) >= LOSES)]
        kept.sort(key=lambda vs: (-vs[1]["wins"], -(vs[1]["ratio"] or 0.0)))
        knobs[knob] = [True if v == "true" else v for v, _ in kept]
    return knobs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batches", default="16,32")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per config (default: %(default)s)")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=0.5)
    p.add_argument("--dataset-size", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--write", action="store_true", help="put this CPU kind's entry into search_spaces/likely.yaml")
    p.add_argument("--out", default=None, help="raw results (default benchmarks/results/likely-<kind>-<date>.json)")
    a = p.parse_args(argv)
    a.batches = tuple(int(b) for b in a.batches.split(","))
    hw = detect()
    kind, day = hw.cpu_kind, time.strftime("%Y-%m-%d")
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"likely-{kind}-{day}.json"
    measure = MeasureSpec(windows=a.windows, window_s=a.window_seconds, min_window_steps=1, timeout_s=600)
    print(f"# {hw.summary_line()} (kind {kind})\n# {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    t0 = time.monotonic()
    grids = {name: measure_grid(name, a, hw, measure) for name in a.workloads.split(",")}
    table = knob_table(grids)
    knobs = order(table, space_doc(a.batches, a.batches[0])["baseline"])
    raw = {"machine": hw.summary_line(), "kind": kind, "date": day, "args": vars(a),
           "grids": {n: [{"config": r["config"].short(), "medians": r["medians"], "figure": r["figure"]}
                         for r in g.values()] for n, g in grids.items()}, "table": table, "order": knobs}
    out.write_text(json.dumps(raw, indent=1, default=str))
    print(f"\n{len(grids)} workloads in {(time.monotonic() - t0) / 60:.1f} min; per knob and value: workloads won, "
          "best with it / best without it (geometric mean):")
    for knob, values in table.items():
        print(f"  {knob}: " + ", ".join(f"{v} {s['wins']} won, x{s['ratio']:.3f}" if s["ratio"] else f"{v} n/a"
                                        for v, s in values.items()))
    what = "; ".join(f"{k}: " + ", ".join(f"{v} won {s['wins']} of {len(grids)}, x{s['ratio']:.2f}"
                                          for v, s in vs.items() if s["ratio"]) for k, vs in table.items())
    entry = {"knobs": knobs, "measured": [{
        "machine": hw.summary_line(), "date": day, "source": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT)
        else str(out), "what": f"{', '.join(grids)} at {a.image_size} px, batch {'/'.join(map(str, a.batches))}, "
        f"{a.rounds} processes a config: {what}"}]}
    import yaml

    print(f"\nthis CPU kind's entry ({kind}):\n" + yaml.safe_dump({kind: entry}, sort_keys=False, width=110))
    if a.write:
        path = ROOT / "search_spaces" / "likely.yaml"
        text = path.read_text()
        doc = yaml.safe_load(text)
        doc.setdefault("kinds", {})[kind] = entry
        head = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
        path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=110))
        print(f"written: {path} (kinds.{kind})")
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
