"""How sure, honestly: does the claim's "95% interval" cover 95%, with the rounds the product actually stops at?

The claim (``autotune.search.choose.confirm``) is the ratio of the winner's throughput to the baseline's over
interleaved rounds, each a fresh process of each config, and a 95% interval from ``settle.ratio_interval`` (Student's
t over the rounds' log ratios). This benchmark feeds the product's own code rounds whose true ratio is known and
counts how often the stated interval holds it:

1. **simulated rounds**: each fresh process has its own level (log-normal, sd = the per-process spread: 1, 2, 5,
   10%), each round a drift shared by the two runs (the machine's load), each window its own noise (0.5%);
   ``ratio_interval`` at a fixed number of rounds (2 to 10), and the confirmation **as shipped** (``confirm.confirm``
   with a simulated runner: its rounds planned from a simulated finalists' round spread, its stopping rule), by the
   number of rounds it stopped at; beside it, for contrast, the rule it replaced (stop once the interval is within
   +/-5%), which keeps the lucky narrow intervals;
2. **replays of real windows** recorded on this project's machines (``benchmarks/results/*.json``; ``--record`` adds
   a fresh set of real trial children): A/A (two runs of one config relabelled as two configs: the true ratio is 1)
   and A/B (the recorded rounds of two configs resampled with their pairing: the true ratio is the recorded rounds'
   own);
3. **the tie-break**: two configs 2% apart (the faster one heavier, or as light), their finalists' rounds with a
   machine that slows between rounds and runs that stop after 3 to 5 windows, decided by the product's own
   ``finalists.settle_ties`` with its extra rounds: how often the slower is picked; beside it, the pooled-medians
   rule it replaced.

    python benchmarks/coverage.py                 # ~1 min; --runs 300 for a quick look
    python benchmarks/coverage.py --record benchmarks/results/coverage-windows-YYYY-MM-DD.json   # ~3 min, real children
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, TrialResult  # noqa: E402
from autotune.search.budget import Budget  # noqa: E402
from autotune.search.choose import confirm as confirm_mod  # noqa: E402
from autotune.search.choose.settle import ratio_interval, round_spread, t_quantile  # noqa: E402

SPREADS = (0.01, 0.02, 0.05, 0.10)
ROUNDS = (2, 3, 4, 6, 8, 10)
TRUE_RATIO = 1.5
WINDOW_NOISE = 0.005
DRIFT = 0.05  # a round's level, shared by its two runs (the machine's load at that moment)
GOAL = 0.93


# --- 1. simulated rounds ----------------------------------------------------------------------------------------

def process_windows(rng: random.Random, level: float, spread: float, windows: int) -> list[float]:
    """One fresh process's windows: its own level (log-normal, sd ``spread``) times each window's noise."""
    own = level * math.exp(rng.gauss(0.0, spread))
    return [own * math.exp(rng.gauss(0.0, WINDOW_NOISE)) for _ in range(windows)]


def sim_rounds(rng: random.Random, n: int, ratio: float, spread: float, *, windows: int = 3,
               slow_second: float = 0.0) -> tuple[list, list]:
    """``n`` interleaved rounds of A (``ratio`` x B) and B; ``slow_second``: the machine that much slower from the
    second round on (on top of the drift)."""
    a, b = [], []
    for r in range(n):
        drift = 100.0 * math.exp(rng.gauss(0.0, DRIFT)) * (1 - slow_second if r else 1.0)
        a.append(process_windows(rng, drift * ratio, spread, windows))
        b.append(process_windows(rng, drift, spread, windows))
    return a, b


def fixed_coverage(rng: random.Random, runs: int, spread: float, n: int) -> float:
    """Share of ``runs`` simulations in which ``ratio_interval`` over ``n`` rounds holds the true ratio."""
    hit = 0
    for _ in range(runs):
        _, lo, hi = ratio_interval(*sim_rounds(rng, n, TRUE_RATIO, spread))
        hit += lo <= TRUE_RATIO <= hi
    return hit / runs


def finalists_spread(rng: random.Random, spread: float, *, configs: int = 3, rounds: int = 2) -> float | None:
    """The noise estimate the confirmation plans by: ``round_spread`` of a simulated finalists' round set (the top
    configs and the baseline, 2 rounds of 5 longer windows), independent of the confirmation's rounds."""
    sets = [[] for _ in range(configs)]
    for _ in range(rounds):
        drift = 100.0 * math.exp(rng.gauss(0.0, DRIFT))
        for i, s in enumerate(sets):
            s.append(process_windows(rng, drift * (1 + 0.1 * i), spread, 5))
    got = round_spread(sets)
    return None if got is None else got[0]


def shipped(rng: random.Random, runs: int, spread: float) -> dict[int, list[int]]:
    """The confirmation as shipped (``confirm.confirm``: its planned rounds, its stopping rule, its interval) with a
    simulated runner; ``{rounds it stopped at: [covered, runs]}``."""
    by_n: dict[int, list[int]] = {}
    winner, baseline = TrialConfig(batch_size=32), TrialConfig(batch_size=16)
    measure = MeasureSpec(windows=3, window_s=1.0)
    budget = Budget.of(None, started=time.monotonic() - 1e9)  # no deadline: the noise alone sets the rounds
    for _ in range(runs):
        drift = {"level": 100.0}

        def runner(workload, c, m, **kw):
            level = drift["level"] * (TRUE_RATIO if c is winner else 1.0)
            return TrialResult(status="ok", samples_per_s=tuple(process_windows(rng, level, spread, m.windows)),
                               wall_s=1.0, batch_size=c.batch_size)

        conf = confirm_mod.confirm(winner, baseline, runner=_drifting(runner, drift, rng), workload=None,
                                   measure=measure, log_dir=None, log=lambda m: None, budget=budget,
                                   spread=finalists_spread(rng, spread))
        cell = by_n.setdefault(len(conf.rounds), [0, 0])
        cell[0] += conf.low <= TRUE_RATIO <= conf.high
        cell[1] += 1
    return by_n


def _drifting(runner, drift: dict, rng: random.Random):
    """``runner`` with a new drift every second call (each round is two runs, back to back)."""
    calls = {"n": 0}

    def run(workload, c, m, **kw):
        if calls["n"] % 2 == 0:
            drift["level"] = 100.0 * math.exp(rng.gauss(0.0, DRIFT))
        calls["n"] += 1
        return runner(workload, c, m, **kw)

    return run


def stop_when_narrow(rng: random.Random, runs: int, spread: float) -> dict[int, list[int]]:
    """The rule the confirmation replaced, with today's interval: 2 rounds, then more while wider than +/-5%, at most
    the product's ``MAX_ROUNDS``; ``{rounds: [covered, runs]}``."""
    by_n: dict[int, list[int]] = {}
    for _ in range(runs):
        a, b = sim_rounds(rng, confirm_mod.MAX_ROUNDS, TRUE_RATIO, spread)
        n = confirm_mod.MIN_ROUNDS
        while True:
            ratio, lo, hi = ratio_interval(a[:n], b[:n])
            if max(hi / ratio - 1, 1 - lo / ratio) <= confirm_mod.TARGET or n == confirm_mod.MAX_ROUNDS:
                break
            n += 1
        cell = by_n.setdefault(n, [0, 0])
        cell[0] += lo <= TRUE_RATIO <= hi
        cell[1] += 1
    return by_n


# --- 2. replays of real windows -----------------------------------------------------------------------------

def load_recorded(path: Path) -> dict[str, list[list[float]]]:
    """A results file's real windows, ``{label: [windows of each fresh process, in the order run]}``: the claims
    benchmark's rounds, ddp_vs_threads', settle_ab's, spread's runs, or this file's ``--record``."""
    d = json.loads(path.read_text())
    out: dict[str, list[list[float]]] = {}
    if "workloads" in d and d["workloads"] and "rounds" in d["workloads"][0]:  # claims.py
        for w in d["workloads"]:
            for k, rounds in w["rounds"].items():
                out[f"{w['workload']} {k}"] = rounds
    elif isinstance(d.get("windows"), dict):  # ddp_vs_threads.py, --record
        out.update(d["windows"])
    elif "runs" in d and isinstance(d["runs"], list):  # settle_ab.py
        for r in d["runs"]:
            if r.get("status") == "ok" and r.get("samples"):
                out.setdefault(f"{r['config']} {r.get('rule', '')}".strip(), []).append(r["samples"])
    elif "configs" in d:  # spread.py
        for k, c in d["configs"].items():
            out[k] = [r["samples_per_s"] for r in c.get("runs", [])
                      if r.get("status") == "ok" and r.get("samples_per_s")]
    return {k: [list(map(float, r)) for r in v if r] for k, v in out.items()}


def replay_aa(rng: random.Random, runs: list[list[float]], n: int, trials: int) -> float | None:
    """A/A: ``n`` rounds of two recorded processes of one config relabelled A and B (true ratio 1), each process in
    one round at most (rounds that share a process would not be independent); None with fewer than ``2n``."""
    if len(runs) < 2 * n:
        return None
    hit = 0
    for _ in range(trials):
        drawn = rng.sample(range(len(runs)), 2 * n)
        _, lo, hi = ratio_interval([runs[i] for i in drawn[::2]], [runs[j] for j in drawn[1::2]])
        hit += lo <= 1.0 <= hi
    return hit / trials


def replay_ab(rng: random.Random, a: list[list[float]], b: list[list[float]], n: int, trials: int) -> float | None:
    """A/B: ``n`` distinct rounds of the ``k`` recorded interleaved rounds of two configs, pairs kept; the truth is
    all ``k`` rounds' own ratio (the geometric mean of their ratios: the finite population the draws come from).
    None unless ``n < k``."""
    k = min(len(a), len(b))
    if n >= k:
        return None
    truth = math.exp(statistics.fmean(math.log(statistics.median(x) / statistics.median(y))
                                      for x, y in zip(a[:k], b[:k])))
    hit = 0
    for _ in range(trials):
        idx = rng.sample(range(k), n)
        _, lo, hi = ratio_interval([a[i] for i in idx], [b[i] for i in idx])
        hit += lo <= truth <= hi
    return hit / trials


# --- 3. the tie-break ----------------------------------------------------------------------------------------

def tie_break(rng: random.Random, runs: int, spread: float, *, lighter_slower: bool, pooled: bool = False) -> float:
    """Share of ``runs`` in which the product's tie-break (``finalists.settle_ties`` and its extra rounds) picks the
    slower of two configs 2% apart; ``pooled``: the rule it replaced (the higher median of all windows pooled over
    the two rounds). Each finalist run stops after 3 to 5 windows; the machine runs 10% slower in the second round."""
    from autotune.search.choose import finalists as fin
    from autotune.search.choose.finalist_rounds import Evidence
    from autotune.search.choose.payback import RunLength
    from autotune.search.choose.settle import EXTRA_ROUNDS
    from autotune.search.record.trials import MemoryLimit
    from autotune.measure import summarize

    fast = TrialConfig(batch_size=16, channels_last=True)
    slow = TrialConfig(batch_size=16, amp="bf16", intra_op_threads=1 if lighter_slower else None)  # fewer threads
    ctx = SimpleNamespace(run_length=RunLength.default(), limit=MemoryLimit(None))
    picked_slow = 0
    for _ in range(runs):
        ev = Evidence({c.key(): [] for c in (fast, slow)}, {c.key(): 100.0 for c in (fast, slow)},
                      {c.key(): [] for c in (fast, slow)}, {c.key(): None for c in (fast, slow)})
        for r in range(2):
            level = 100.0 * math.exp(rng.gauss(0.0, DRIFT)) * (0.9 if r else 1.0)
            for c, f in ((fast, 1.02), (slow, 1.0)):
                ev.rounds[c.key()].append(process_windows(rng, level * f, spread, rng.choice((3, 4, 5))))
        if pooled:
            med = {c.key(): summarize(ev.samples(c.key())).median for c in (fast, slow)}
            picked_slow += med[slow.key()] > med[fast.key()]
            continue

        extra = {"n": 0}

        def more(ev, a, b, why, gap):
            if extra["n"] >= EXTRA_ROUNDS:
                return False
            extra["n"] += 1
            level = 90.0 * math.exp(rng.gauss(0.0, DRIFT))
            for c, f in ((fast, 1.02), (slow, 1.0)):
                ev.rounds[c.key()].append(process_windows(rng, level * f, spread, rng.choice((3, 4, 5))))
            return True

        scored = [fin.Scored(c, SimpleNamespace(number=i, user_attrs={}), summarize(ev.samples(c.key())), 100.0)
                  for i, c in enumerate((fast, slow))]
        got = fin.settle_ties(ctx, None, scored, [], ev, [], more)
        picked_slow += got is not None and got[1].config.key() == slow.key()
    return picked_slow / runs


# --- recording real windows ------------------------------------------------------------------------------------

def record(out: Path, rounds: int, model: str, image_size: int) -> None:
    """Real trial children (``autotune.trial.runner.run_trial``, as every trial and confirmation run): two configs,
    ``rounds`` interleaved rounds (A B, B A, ...), 3 windows of 0.3 s each; their windows to ``out``."""
    from autotune.config import Workload
    from autotune.machine.hardware import detect
    from autotune.trial.runner import run_trial

    configs = {"bs=16 t=1": TrialConfig(batch_size=16, intra_op_threads=1),
               "bs=32 t=1": TrialConfig(batch_size=32, intra_op_threads=1)}
    spec = MeasureSpec(windows=3, window_s=0.3, timeout_s=120)
    wl = Workload(model=model, image_size=image_size)
    windows: dict[str, list[list[float]]] = {k: [] for k in configs}
    for r in range(rounds):
        for k in (list(configs) if r % 2 == 0 else list(reversed(configs))):
            res = run_trial(wl, configs[k], spec)
            windows[k].append(list(res.samples_per_s) if res.ok else [])
            print(f"  round {r + 1} {k}: {res.status} {res.median_samples_per_s or 0:.1f} samples/s", flush=True)
    out.write_text(json.dumps({"machine": detect(with_torch=False).summary_line(), "created": time.strftime("%F %T"),
                               "workload": wl.to_dict(), "spec": spec.to_dict(), "windows": windows}, indent=1))
    print(f"recorded: {out}")


# --- the report --------------------------------------------------------------------------------------------------

def _pct(hit: int, n: int) -> str:
    return f"{100 * hit / n:.1f}% ({n})" if n else "-"


def report(runs: int, seed: int, files: list[Path]) -> dict:
    rng = random.Random(seed)
    out: dict = {"runs": runs, "seed": seed, "true_ratio": TRUE_RATIO, "window_noise": WINDOW_NOISE, "drift": DRIFT}
    print(f"# coverage of the stated 95% interval; true ratio x{TRUE_RATIO}, window noise {WINDOW_NOISE:.1%}, "
          f"round drift {DRIFT:.0%}, {runs} runs a cell, seed {seed}\n")
    print("## 1a. `ratio_interval` at a fixed number of rounds\n")
    print("| per-process spread | " + " | ".join(f"{n} rounds" for n in ROUNDS) + " |")
    print("| --- |" + " --- |" * len(ROUNDS))
    out["fixed"] = {}
    for s in SPREADS:
        row = {n: fixed_coverage(rng, runs, s, n) for n in ROUNDS}
        out["fixed"][s] = row
        print(f"| {s:.0%} | " + " | ".join(f"{100 * v:.1f}%" for v in row.values()) + " |")
    print("\n## 1b. the confirmation as shipped (`confirm.confirm`): coverage by the rounds it stopped at "
          "(runs that stopped there)\n")
    out["shipped"], out["narrow"] = {}, {}
    for name, fn in (("shipped", shipped), ("narrow", stop_when_narrow)):
        if name == "narrow":
            print("\n## 1c. for contrast: stop once the interval is within +/-5% (the rule it replaced)\n")
        print("| per-process spread | all | " + " | ".join(f"{n}" for n in range(2, confirm_mod.MAX_ROUNDS + 1))
              + " |")
        print("| --- | --- |" + " --- |" * (confirm_mod.MAX_ROUNDS - 1))
        for s in SPREADS:
            by_n = fn(rng, runs, s)
            out[name][s] = {n: v for n, v in sorted(by_n.items())}
            hit, tot = sum(v[0] for v in by_n.values()), sum(v[1] for v in by_n.values())
            print(f"| {s:.0%} | {_pct(hit, tot)} | " + " | ".join(
                _pct(*by_n.get(n, (0, 0))) for n in range(2, confirm_mod.MAX_ROUNDS + 1)) + " |")
    out["replay"] = replays(rng, runs, files)
    print("\n## 3. the tie-break: how often the slower of two configs 2% apart is picked (2 finalist rounds, "
          "the machine 10% slower in the second, runs of 3-5 windows, then up to 3 extra rounds)\n")
    print("| per-process spread | paired, as light | paired, the slower lighter | pooled medians, as light (before) |")
    print("| --- | --- | --- | --- |")
    out["tie"] = {}
    for s in SPREADS:
        row = (tie_break(rng, runs, s, lighter_slower=False), tie_break(rng, runs, s, lighter_slower=True),
               tie_break(rng, runs, s, lighter_slower=False, pooled=True))
        out["tie"][s] = row
        print(f"| {s:.0%} | " + " | ".join(f"{100 * v:.1f}%" for v in row) + " |")
    return out


def replays(rng: random.Random, runs: int, files: list[Path]) -> dict:
    """Section 2: each recorded config with 8 or more processes (A/A) and each pair recorded in the same 6 or more
    rounds (A/B), at 2, 3, 4 and 6 rounds ("-": too few recorded for that many independent rounds)."""
    print("\n## 2. replays of real windows (A/A: the true ratio is 1; A/B: the recorded rounds' own)\n")
    print("| source | config(s) | processes | " + " | ".join(f"{n} rounds" for n in (2, 3, 4, 6)) + " |")
    print("| --- | --- | --- |" + " --- |" * 4)
    got = {}
    trials = max(200, runs // 2)

    def cells(row: list) -> str:
        return " | ".join("-" if v is None else f"{100 * v:.1f}%" for v in row)

    for f in files:
        data = load_recorded(f)
        for label, procs in data.items():
            if len(procs) >= 8:  # fewer: a handful of ways to pair them, too coarse to read a coverage from
                row = [replay_aa(rng, procs, n, trials) for n in (2, 3, 4, 6)]
                got[f"{f.name}: A/A {label}"] = row
                print(f"| {f.name} | A/A {label} | {len(procs)} | {cells(row)} |")
        labels = list(data)
        for x, y in zip(labels[::2], labels[1::2]):
            if len(data[x]) == len(data[y]) >= 6:
                row = [replay_ab(rng, data[x], data[y], n, trials) for n in (2, 3, 4, 6)]
                got[f"{f.name}: A/B {x} / {y}"] = row
                print(f"| {f.name} | A/B {x} / {y} | {len(data[x])} rounds | {cells(row)} |")
    return got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2000, help="simulations a cell (default 2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replay", nargs="*", default=None,
                   help="results files with real windows (default: benchmarks/results/{claims,ddp-vs-threads,"
                        "settle-ab,spread,coverage-windows}-*.json)")
    p.add_argument("--record", metavar="OUT.json", help="record real windows (real trial children) and stop")
    p.add_argument("--model", default="tests.workloads_fixtures:tiny")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--record-rounds", type=int, default=16)
    p.add_argument("--json", metavar="OUT.json", help="write the figures here too")
    a = p.parse_args(argv)
    if a.runs < 50:
        print("coverage.py: --runs must be at least 50 (a coverage from fewer says little)", file=sys.stderr)
        return 2
    if a.record:
        record(Path(a.record), a.record_rounds, a.model, a.image_size)
        return 0
    files = ([Path(f) for f in a.replay] if a.replay is not None else
             [Path(f) for pat in ("claims-*.json", "ddp-vs-threads-*.json", "settle-ab-*.json", "spread-*.json",
                                  "coverage-windows-*.json")
              for f in sorted(glob.glob(str(ROOT / "benchmarks" / "results" / pat)))])
    t0 = time.monotonic()
    out = report(a.runs, a.seed, files)
    print(f"\n{time.monotonic() - t0:.0f} s; t(0.975) at 1 df = {t_quantile(0.975, 1):.1f}: two rounds' interval is "
          "wide, the honest answer")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
