"""How often the planned search keeps a knob that does nothing, and how often it keeps one that helps (issue 52
item 2): the real ``coordinate.plan`` driven to its end over simulated trials, many times.

Each trial is a fresh process: its rate is the config's true rate times the process's own level (log-normal, sd
``--spread``, as ``coverage.py`` draws it) times the machine's drift (a random walk between trials, sd ``--drift``
a step), and its windows spread ~1% around that (so the study's window noise sits at the plan's 5% floor, as on a
quiet CPU). Every knob's true factor is 1 (A/A) unless ``--gain KNOB=VALUE:FACTOR`` says otherwise.

Prints, per spread: how often the search ended on a config with a no-op knob moved from the baseline (a false
keep), how often each no-op value was (over all of them, and over the searches where the bundle lost, so each of
its members was tried alone on the baseline), how often each real gain was kept, and the trials it took.
The 95% intervals are Wilson's over the runs. The likely winners (bf16, channels_last, retain) run as trial 1, so a
bundle that wins by luck is taken apart by reverting each knob, and a no-op in it stays unless reverting it wins:
that is the planned search's design (the bundle is this CPU kind's measured winners), and it counts here.

    python benchmarks/keep_rule.py --runs 400
    python benchmarks/keep_rule.py --runs 400 --gain malloc=hugepages:1.07
    python benchmarks/keep_rule.py --runs 400 --batch-curve 32:1,64:1.08,128:1.15,256:1.2,512:1.1

With ``--batch-curve`` the space offers those batch sizes and the rate follows the curve, so the batch walk runs too
and the table says how often the search ended on a batch within 2% of the curve's best (issue 50).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402
from optuna.distributions import CategoricalDistribution  # noqa: E402
from optuna.trial import TrialState, create_trial  # noqa: E402

from autotune.search.plan.coordinate import plan  # noqa: E402
from autotune.search.space.complete import complete  # noqa: E402
from autotune.search.space.search_space import space_from_dict  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPREADS = (0.02, 0.05, 0.10)
WINDOW_NOISE = 0.01
BASELINE = {"batch_size": 32, "amp": "off", "channels_last": False, "malloc": "default"}
LIKELY = {"amp": "bf16", "channels_last": True, "malloc": "retain"}


def space(batches=(32,)):
    import dataclasses

    from autotune.machine.hardware import detect

    # the same space on every machine: bf16 offered whatever this CPU is (its flag), as the planned search's tests
    # do, and hugepages whatever its kernel and C library (a preloaded tcmalloc would depend on what is installed)
    hw = detect(with_torch=False)
    hw = dataclasses.replace(hw, cpu_flags=tuple(hw.cpu_flags) + ("avx512_bf16",), libc="glibc 2.36", thp="madvise")
    params = {"batch_size": {"type": "int", "choices": sorted(batches)},
              "amp": {"type": "categorical", "choices": ["off", "bf16"]},
              "channels_last": {"type": "bool"},
              "malloc": {"type": "categorical", "choices": ["default", "retain", "hugepages"]}}
    return space_from_dict({"name": "keep-rule", "device": "cpu", "parameters": params, "baseline": BASELINE},
                           hardware=hw)


def search(rng: random.Random, sp, gains: dict[tuple[str, object], float], spread: float, drift: float,
           *, max_trials: int = 40, curve: dict[int, float] | None = None) -> tuple[dict, int, bool]:
    """One planned search to its end (or ``max_trials``): the incumbent it ended on, the trials it ran, and whether
    the bundle's members were each tried alone on the baseline (it did not beat it beyond the noise; since
    2026-11-29 a tie where the walk moved the batch runs the bundle again there first, and is counted here only
    where each member is then tried alone)."""
    study = optuna.create_study(direction="maximize")
    dists = {p.name: CategoricalDistribution(list(p.choices)) for p in sp.params}
    level = [1.0]

    def run(params: dict, roles: dict) -> None:
        params = complete(sp, params)
        level[0] *= math.exp(rng.gauss(0.0, drift))
        true = 100.0 * math.prod(f for (k, v), f in gains.items() if params.get(k) == v)
        true *= (curve or {}).get(params["batch_size"], 1.0)
        own = true * level[0] * math.exp(rng.gauss(0.0, spread))
        windows = sorted(own * math.exp(rng.gauss(0.0, WINDOW_NOISE)) for _ in range(5))
        med = windows[2]
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=med, params=params, distributions=dists,
            user_attrs={"config": sp.effective(params).to_dict(), "status": "ok", "peak_host_mb": 10.0,
                        "samples_per_s": windows, "rel_iqr": (windows[3] - windows[1]) / med, **roles}))

    run(BASELINE, {"baseline": True})
    run({**BASELINE, **LIKELY}, {"likely_winner": True})
    while True:
        p = plan(sp, study.get_trials(deepcopy=False), noise=0.05)
        if p.done or not p.needs or len(study.trials) >= max_trials:
            alone = any("each is tried alone on the baseline" in n for n in p.notes)
            return dict(p.incumbent or BASELINE), len(study.trials), alone
        for need in p.needs[:max_trials - len(study.trials)]:
            run(need.params, need.roles)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def measure(runs: int, spread: float, gains: dict, *, drift: float, seed: int,
            curve: dict[int, float] | None = None, max_trials: int = 40) -> dict:
    """The rates over ``runs`` searches: a no-op knob moved from the baseline; each real gain kept; trials; and,
    with a batch ``curve`` (batch size -> true factor), how often the search ended on a batch within 2% of the
    curve's best."""
    rng, sp = random.Random(seed), space(tuple(curve) if curve else (32,))
    false_keep, kept, trials, near, rel = 0, {g: 0 for g in gains}, [], 0, []
    knobs = [k for k in BASELINE if k != "batch_size"]
    noops = [(p.name, c) for p in sp.params if p.name in knobs for c in p.choices
             if c != BASELINE[p.name] and (p.name, c) not in gains]
    each, alone_runs, alone_each = 0, 0, 0
    for _ in range(runs):
        inc, n, alone = search(rng, sp, gains, spread, drift, curve=curve, max_trials=max_trials)
        trials.append(n)
        moved = {(k, v) for k, v in inc.items() if k in knobs and BASELINE[k] != v}
        false_keep += any(m not in gains for m in moved)
        each += sum(m in moved for m in noops)
        alone_runs += alone
        alone_each += alone * sum(m in moved for m in noops)
        for g in gains:
            kept[g] += g in moved
        if curve:
            factor = curve[inc.get("batch_size", BASELINE["batch_size"])]
            near += factor >= max(curve.values()) / 1.02
            # the pick's true rate over the best config's: the batch's and every real gain's
            rel.append(factor * math.prod(f for g, f in gains.items() if g in moved)
                       / (max(curve.values()) * math.prod(max(f, 1.0) for f in gains.values())))
    return {"false_keep": false_keep, "kept": kept, "runs": runs, "trials": sorted(trials),
            "each": each / (runs * len(noops)) if noops else 0.0,
            "alone_runs": alone_runs, "near": near, "rel": sorted(rel),
            "alone_each": alone_each / (alone_runs * len(noops)) if noops and alone_runs else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=400, help="searches per spread (default 400)")
    ap.add_argument("--spreads", default=",".join(map(str, SPREADS)),
                    help="per-process spreads, log sd (default %(default)s)")
    ap.add_argument("--drift", type=float, default=0.01, help="the machine's drift a trial, log sd (default 0.01)")
    ap.add_argument("--gain", action="append", default=[], metavar="KNOB=VALUE:FACTOR",
                    help="a knob value that really helps, e.g. malloc=hugepages:1.07 (repeatable)")
    ap.add_argument("--batch-curve", default="", metavar="BATCH:FACTOR,...",
                    help="batch sizes to walk and their true factors, e.g. 32:1,64:1.08,128:1.15,256:1.2,512:1.1 "
                         "(default: batch 32 only, no walk)")
    ap.add_argument("--max-trials", type=int, default=40,
                    help="end each search after this many trials, as a budget does; the pick is the plan's best "
                         "config then (default 40: the plan's end)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    gains = {}
    for g in args.gain:
        knob, rest = g.split("=", 1)
        value, factor = rest.rsplit(":", 1)
        value = {"true": True, "false": False}.get(value.lower(), value)
        gains[(knob, value)] = float(factor)
    curve = {int(b): float(f) for b, f in (c.split(":") for c in args.batch_curve.split(",") if c)} or None
    if curve and BASELINE["batch_size"] not in curve:
        ap.error(f"--batch-curve must include the baseline's batch {BASELINE['batch_size']}")
    print(f"{args.runs} planned searches a spread, drift {args.drift:.0%} a trial, gains "
          f"{', '.join(f'{k}={v} x{f}' for (k, v), f in gains.items()) or 'none (A/A)'}"
          + (f", batch curve {args.batch_curve}" if curve else "")
          + (f", at most {args.max_trials} trials" if args.max_trials < 40 else ""))
    print("| per-process spread | searches ending with a no-op kept (95% CI) | each no-op value kept | the same, "
          "where the bundle lost and each member was tried alone (searches) | "
          + "".join(f"{k}={v} kept | " for k, v in gains)
          + ("ended on a batch within 2% of the best (95% CI) | the pick's true rate over the best config's "
             "(mean, median, 10th percentile) | " if curve else "") + "trials (median, max) |")
    print("| --- | --- | --- | --- | " + "--- | " * (len(gains) + 2 * bool(curve)) + "--- |")
    for spread in (float(s) for s in args.spreads.split(",")):
        r = measure(args.runs, spread, gains, drift=args.drift, seed=args.seed, curve=curve,
                    max_trials=args.max_trials)
        lo, hi = wilson(r["false_keep"], r["runs"])
        cells = "".join(f"{r['kept'][g] / r['runs']:.0%} | " for g in gains)
        if curve:
            nlo, nhi = wilson(r["near"], r["runs"])
            q = r["rel"]
            cells += (f"{r['near'] / r['runs']:.0%} ({nlo:.0%}-{nhi:.0%}) | "
                      f"{sum(q) / len(q):.3f}, {q[len(q) // 2]:.3f}, {q[len(q) // 10]:.3f} | ")
        t = r["trials"]
        alone = "-" if r["alone_each"] is None else f"{r['alone_each']:.1%} ({r['alone_runs']})"
        print(f"| {spread:.0%} | {r['false_keep'] / r['runs']:.1%} ({lo:.1%}-{hi:.1%}) | {r['each']:.1%} | {alone} | "
              f"{cells}"
              f"{t[len(t) // 2]}, {t[-1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
