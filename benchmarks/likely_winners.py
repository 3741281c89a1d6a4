"""Which knob values win on THIS kind of CPU: the likely winners' entry of ``search_spaces/likely.yaml``, measured.

For each workload, every combination of the bundle's knobs (bf16 where the CPU has it, channels_last for images,
the allocators default, retain and tcmalloc where installed: ``quality.ground_truth``) x the batch sizes runs
through the real runner, each config in ``--rounds`` fresh processes (the order shuffled anew each round: a
process's level moves 5-20% on these VMs), its figure the median of its processes.
Per knob and value: on how many workloads the best config had it, and the best config with that value over the
best without it (the geometric mean over the workloads). A knob's first value is the one that won most (then by
that ratio); each next one is its fallback where the ones before it are not offered (tcmalloc not installed, bf16
not in the CPU), so it is judged again on the configs without them. A value that won nowhere and lost by more than
3% on average there is left out of the order (the separation would only drop it again).

It prints the table and the YAML entry for this CPU kind (``Hardware.cpu_kind``); ``--write`` puts the entry into
``search_spaces/likely.yaml`` with the machine, the date and the raw results' file, and keeps the others as they
are written; ``--from`` reads an earlier run's raw results instead of measuring.

    python benchmarks/likely_winners.py                                  # 4 workloads, 32 px, batch 16/32, 3 rounds
    python benchmarks/likely_winners.py --workloads resnet18,mobilenet_v3_small --write
    python benchmarks/likely_winners.py --from benchmarks/results/likely-amx-2026-11-28.json
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
            out[knob][_key(v)] = {
                "wins": wins, "ratio": math.exp(statistics.fmean(logs)) if logs else None}
    return out


def order(grids: dict[str, dict], baseline: dict) -> dict[str, list]:
    """Each knob's values in order of preference, the baseline's own left out: the first by wins then ratio
    (``knob_table``); each next the same, judged again on the configs without the values before it (where those
    are not offered it is the one taken); a value that never won and lost by more than ``1 - LOSES`` on average
    there ends the list."""
    knobs = {}
    for knob in KNOBS:
        chosen: list = []
        while True:
            left = {n: {k: r for k, r in g.items() if _key(getattr(r["config"], knob)) not in chosen}
                    for n, g in grids.items()}
            values = knob_table(left).get(knob, {})
            kept = [(v, st) for v, st in values.items() if v != _key(baseline.get(knob))
                    and (st["wins"] or (st["ratio"] or 0.0) >= LOSES)]
            if not kept:
                break
            kept.sort(key=lambda vs: (-vs[1]["wins"], -(vs[1]["ratio"] or 0.0)))
            chosen.append(kept[0][0])
        if chosen or knob in knob_table(grids):
            knobs[knob] = [True if v == "true" else False if v == "false" else v for v in chosen]
    return knobs


def _key(v):
    """A knob value as ``knob_table`` names it (booleans as "true"/"false")."""
    return str(v).lower() if isinstance(v, bool) else v


class _Parsed:
    """A config's three bundle knobs read back from its short form in a raw results file (``TrialConfig.short``:
    "bf16" for amp, "cl" for channels_last, "malloc=X" unless the default)."""

    def __init__(self, short: str) -> None:
        words = short.split()
        self.amp = "bf16" if "bf16" in words else "off"
        self.channels_last = "cl" in words
        self.malloc = next((w.split("=", 1)[1] for w in words if w.startswith("malloc=")), "default")
        self.short = short


def read_grids(path: Path) -> tuple[dict, dict]:
    """``(grids, raw)`` of an earlier run's raw results (``--from``)."""
    raw = json.loads(path.read_text())
    grids = {n: {r["config"]: {"config": _Parsed(r["config"]), "medians": r["medians"], "figure": r["figure"]}
                 for r in rows} for n, rows in raw["grids"].items()}
    return grids, raw


def write_entry(path: Path, kind: str, entry: dict) -> None:
    """``entry`` as ``kinds.<kind>`` of the likely winners' file, in its own block style; the rest of the file (the
    other kinds' entries and every comment) as it was."""
    import yaml

    block = yaml.safe_dump({kind: entry}, sort_keys=False, width=110, default_flow_style=None)
    block = "".join("  " + line if line.strip() else line for line in block.splitlines(keepends=True))
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"  {kind}:"), None)
    if start is None:
        text = "".join(lines)
        text = text if text.endswith("\n") else text + "\n"
        if "\nkinds:" not in "\n" + text:
            text += "kinds:\n"
        path.write_text(text + block)
        return
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and not lines[i].startswith("    ") and not lines[i].startswith("#")), len(lines))
    path.write_text("".join(lines[:start]) + block + "".join(lines[end:]))


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
    p.add_argument("--from", dest="from_file", default=None, metavar="FILE",
                   help="an earlier run's raw results: its entry worked out again, nothing measured")
    a = p.parse_args(argv)
    a.batches = tuple(int(b) for b in a.batches.split(","))
    t0 = time.monotonic()
    if a.from_file:
        out = Path(a.from_file)
        grids, raw = read_grids(out)
        kind, day, machine = raw["kind"], raw["date"], raw["machine"]
        a.workloads, a.image_size, a.rounds = (",".join(grids), raw["args"]["image_size"], raw["args"]["rounds"])
        a.batches = tuple(raw["args"]["batches"])
        print(f"# {machine} (kind {kind}), {day}: from {out}", flush=True)
    else:
        hw = detect()
        kind, day, machine = hw.cpu_kind, time.strftime("%Y-%m-%d"), hw.summary_line()
        out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"likely-{kind}-{day}.json"
        measure = MeasureSpec(windows=a.windows, window_s=a.window_seconds, min_window_steps=1, timeout_s=600)
        print(f"# {machine} (kind {kind})\n# {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
        grids = {name: measure_grid(name, a, hw, measure) for name in a.workloads.split(",")}
    table = knob_table(grids)
    knobs = order(grids, space_doc(a.batches, a.batches[0])["baseline"])
    if not a.from_file:
        raw = {"machine": machine, "kind": kind, "date": day, "args": vars(a),
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
    fallbacks = "; ".join(f"{k} where {', '.join(map(str, vs[:i]))} is not offered: {v}"
                          for k, vs in knobs.items() for i, v in enumerate(vs) if i)
    out = out.resolve()
    entry = {"knobs": knobs, "measured": [{
        "machine": machine, "date": day, "source": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT)
        else str(out), "what": f"benchmarks/likely_winners.py: {', '.join(grids)} at {a.image_size} px, batch "
        f"{'/'.join(map(str, a.batches))}, {a.rounds} processes a config: {what}"
        + (f"; judged again without the values before it, {fallbacks}" if fallbacks else "")}]}
    import yaml

    print(f"\nthis CPU kind's entry ({kind}):\n" + yaml.safe_dump({kind: entry}, sort_keys=False, width=110))
    if a.write:
        path = ROOT / "search_spaces" / "likely.yaml"
        write_entry(path, kind, entry)
        print(f"written: {path} (kinds.{kind})")
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
