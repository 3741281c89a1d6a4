"""Does the warm start pay? Trials until 95% of the best on a second workload, with and without it. Figures printed.

1. Workload A (resnet18, 64 px, train) is tuned once, with a trial budget, in its own SQLite storage.
2. For each seed, workload B (resnet34, 64 px, train, by default) is tuned twice with the same trial budget and
   seed, each in a fresh copy of A's storage: once with the warm start (A's winner is among B's first trials)
   and once with ``warm_start=False``. Which of the two goes first alternates from seed to seed, so a slow
   drift of the machine does not favour one. B's runs are search only (no finalists): the figure is about the
   search trials, and the finalists would cost two more trials per run.
3. The best configs the B runs found are re-measured interleaved (A B C, B C A, ...), in fresh processes; the
   best re-measured median is "the best" of B.
4. Per run: the best-so-far after each measured trial (copies of an answered config cost nothing and do not
   count), and the first trial at which it reached 95% of the best (and of the best single search figure of
   any run, which the winner's curse biases up). Median and range over the seeds are printed.

Not a test: the default run takes 30-60 minutes on 2 busy cores. ``--quick`` runs a tiny model and space.
The machine lock (/tmp/autotune-machine.lock) is shared with any other autotune run here: a run that finds
it held waits for it. The figures are only as steady as the machine; say where and when they were taken.

    python benchmarks/warm_start.py                          # resnet18 64 px -> resnet34 64 px, 2 seeds
    python benchmarks/warm_start.py --seeds 0 1 --trials-b 10 --model-b mobilenet_v3_small
    python benchmarks/warm_start.py --quick --out /tmp/w.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.errors import StorageError  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.measure import summarize  # noqa: E402
from autotune.recommendation import stored_recommendation  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402
from autotune.search.space.search_space import space_from_dict  # noqa: E402
from autotune.search.record.storage import machine_lock  # noqa: E402
from autotune.search.tuner import Tuner  # noqa: E402

TINY = "tests.workloads_fixtures:tiny"


def space_doc(quick: bool) -> dict:
    """A reduced CPU space without torch.compile (80-95 s per compiled trial here would dominate the run)."""
    if quick:
        return {"name": "warm-quick", "device": "cpu",
                "parameters": {"batch_size": {"type": "int", "choices": [8, 16, 32]},
                               "channels_last": {"type": "bool"},
                               "malloc": {"type": "categorical", "choices": ["default", "retain"]}},
                "baseline": {"batch_size": 8, "channels_last": False, "malloc": "default"}}
    return {"name": "warm-start", "device": "cpu",
            "parameters": {"batch_size": {"type": "int", "choices": [16, 32, 64, 128]},
                           "num_workers": {"type": "int", "choices": [0, 1]},
                           "amp": {"type": "categorical", "choices": ["off", "bf16"]},
                           "channels_last": {"type": "bool"},
                           "intra_op_threads": {"type": "int", "choices": [1, 2]},
                           "malloc": {"type": "categorical", "choices": ["default", "retain"]}},
            "fixed": {"inter_op_threads": 1, "prefetch_factor": 2, "compile_mode": "none"},
            "baseline": {"batch_size": 64, "num_workers": 0, "amp": "off", "channels_last": False,
                         "intra_op_threads": 2, "malloc": "default"}}


class SearchOnly(Tuner):
    """A tuner whose run ends with its search: no finalists (the figure is about the search trials)."""

    def finalize(self, *, budget=None, runner=None):
        return None


def locked(what: str, fn, *args, **kwargs):
    """Run ``fn`` holding the machine lock, waiting while another autotune run on this machine holds it."""
    waited = 0
    while True:
        try:
            with machine_lock(what):
                return fn(*args, **kwargs)
        except StorageError as exc:
            if "measuring on this machine" not in str(exc):
                raise
            if waited % 60 == 0:
                print(f"  waiting for the machine lock: {exc}", flush=True)
            time.sleep(5)
            waited += 5


def history(study) -> list[dict]:
    """Best-so-far after each measured trial (copies of an answered config are not trials that cost)."""
    out, best, elapsed = [], 0.0, 0.0
    for t in study.trials:
        ua = t.user_attrs
        if ua.get("duplicate_of") is not None or ua.get("status") in (None, "interrupted"):
            continue  # a copy costs nothing; a killed trial is measured again by its retry
        elapsed += ua.get("wall_s") or 0.0
        if ua.get("status") == "ok" and t.value and all(c <= 0 for c in t.constraints.values()):
            best = max(best, t.value)
        out.append({"trial": t.number, "n": len(out) + 1, "best_so_far": best, "elapsed_s": round(elapsed, 1),
                    "value": t.value, "config": ua.get("config"), "warm_start_from": ua.get("warm_start_from")})
    return out


def measured(study) -> int:
    """How many trials of the study were measured (what a resumed run still owes of its budget)."""
    return len(history(study))


def reached(hist: list[dict], bar: float) -> int | None:
    """The measured trials until the best-so-far reached ``bar`` (None: never, within the budget)."""
    return next((h["n"] for h in hist if h["best_so_far"] >= bar), None)


def describe(xs: list[int | None], budget: int) -> str:
    """Median and range over the seeds; a run that never reached the bar counts as budget + 1."""
    vals = [x if x is not None else budget + 1 for x in xs]
    never = sum(x is None for x in xs)
    return (f"median {statistics.median(vals):g}, range {min(vals)}-{max(vals)} over {len(vals)} seed(s)"
            + (f" ({never} never reached it in {budget} trials: counted as {budget + 1})" if never else "")
            + f"; per seed {['-' if x is None else x for x in xs]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-a", default="resnet18")
    p.add_argument("--size-a", type=int, default=64)
    p.add_argument("--model-b", default="resnet34")
    p.add_argument("--size-b", type=int, default=64)
    p.add_argument("--trials-a", type=int, default=10)
    p.add_argument("--trials-b", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--rounds", type=int, default=2, help="interleaved re-measurement rounds of B's best configs")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=1.0)
    p.add_argument("--quick", action="store_true", help="a tiny model and space (smoke run)")
    p.add_argument("--workdir", default=None, metavar="DIR",
                   help="keep the storages here (default: a temporary folder, removed at the end); the folder of "
                        "a killed run resumes it: A and the B runs that finished are not measured again")
    p.add_argument("--out", default=None, help="JSON file (default benchmarks/results/warm-start-<time>.json)")
    a = p.parse_args(argv)
    out = (Path(a.out) if a.out
           else ROOT / "benchmarks" / "results" / f"warm-start-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    hw = detect()
    measure = MeasureSpec(windows=a.windows, window_s=a.window_seconds, min_window_steps=1, warmup_min_steps=3,
                          warmup_min_s=0.0, timeout_s=600)
    wa = Workload(model=a.model_a, image_size=a.size_a)
    wb = Workload(model=a.model_b, image_size=a.size_b)
    if a.quick:
        measure = MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=120)
        wa, wb = Workload(model=TINY, image_size=16), Workload(model=TINY, image_size=32)
        a.trials_a, a.trials_b, a.seeds, a.rounds = 4, 4, a.seeds[:1], 1
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"# {hw.summary_line()}\n# {time.strftime('%Y-%m-%d %H:%M %Z')}  load average {' '.join(load)} "
          f"(1/5/15 min) at the start\n# A: {wa.label()}, {a.trials_a} trials; B: {wb.label()}, {a.trials_b} "
          f"trials x seeds {a.seeds}", flush=True)
    space = space_from_dict(space_doc(a.quick), hardware=hw)
    tmp = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="autotune-warm-"))
    print(f"# storages in {tmp} (--workdir {tmp} resumes a killed run)", flush=True)

    def tuner(workload, db: Path, seed: int, warm: bool, tag: str, cls=Tuner) -> Tuner:
        return cls(workload, space=space, measure=measure, storage=f"sqlite:///{db}", hardware=hw, progress=False,
                     seed=seed, finalists=1, finalist_rounds=1, parity_steps=0, patience=0, warm_start=warm,
                     log=lambda m: print(f"  {tag}: {m}", flush=True))

    # 1. workload A, once
    a_db = tmp / "a" / "autotune.db"
    ta = tuner(wa, a_db, 0, False, "A")
    t0 = time.monotonic()
    rec_a = stored_recommendation(ta.study()) if a_db.exists() else None
    if rec_a is None:
        rec_a = locked("warm-start benchmark, workload A", ta.run, trials=max(1, a.trials_a - measured(ta.study())))
    print(f"A: {rec_a.config.short()} {rec_a.median_samples_per_s:.1f} samples/s ({time.monotonic() - t0:.0f} s)",
          flush=True)

    # 2. workload B, with and without, per seed, alternating which goes first
    runs = []
    for i, seed in enumerate(a.seeds):
        order = (True, False) if i % 2 == 0 else (False, True)
        for warm in order:
            db = tmp / f"b-{seed}-{'warm' if warm else 'cold'}" / "autotune.db"
            if not db.exists():
                db.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(a_db, db)  # the same storage either way: only the switch differs
            tag = f"B seed {seed} {'warm' if warm else 'cold'}"
            tb = tuner(wb, db, seed, warm, tag, SearchOnly)
            t0 = time.monotonic()
            left = a.trials_b - measured(tb.study())
            if left > 0:
                locked(f"warm-start benchmark, {tag}", tb.run, trials=left)
            hist = history(tb.study())
            runs.append({"seed": seed, "warm": warm, "history": hist, "wall_s": time.monotonic() - t0})
            print(f"{tag}: best-so-far " + " ".join(f"{h['best_so_far']:.0f}" for h in hist), flush=True)

    # 3. B's best configs re-measured interleaved: the reference
    bests = {}
    for r in runs:
        top = max((h for h in r["history"] if h["value"] and h["config"]), key=lambda h: h["value"], default=None)
        if top is not None:
            c = TrialConfig.from_dict(top["config"])
            bests[c.short()] = c
    names = list(bests)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(a.rounds):
        for n in names[rnd % len(names):] + names[: rnd % len(names)]:
            res = locked("warm-start benchmark, re-measure", run_trial, wb, bests[n], measure)
            samples[n].extend(res.samples_per_s)
            print(f"re-measure round {rnd + 1} {n:<44} {res.status:<6} {(res.median_samples_per_s or 0):8.1f}/s",
                  flush=True)
    med = {n: summarize(xs).median for n, xs in samples.items() if xs}
    best_ref = max(med.values(), default=None)
    best_search = max(h["best_so_far"] for r in runs for h in r["history"])

    # 4. figures
    lines = []
    bars = [("the best single search figure", best_search)]
    if best_ref is not None:
        bars.insert(0, ("the best re-measured median", best_ref))
    for label, bar in bars:
        lines.append(f"trials to 95% of {label} ({bar:.1f} samples/s, bar {0.95 * bar:.1f}):")
        for warm in (True, False):
            xs = [reached(r["history"], 0.95 * bar) for r in runs if r["warm"] == warm]
            lines.append(f"  {'with the warm start   ' if warm else 'without the warm start'}: "
                         f"{describe(xs, a.trials_b)}")
    if med:  # judged by each config's re-measured median where it has one: drift between runs cancels
        lines.append("trials until a config within 95% of the best re-measured median was measured (a config's "
                     "re-measured median where it has one, else its search figure):")
        for warm in (True, False):
            xs = [next((h["n"] for h in r["history"] if h["config"] and h["value"] and
                        med.get(TrialConfig.from_dict(h["config"]).short(), h["value"]) >= 0.95 * best_ref), None)
                  for r in runs if r["warm"] == warm]
            lines.append(f"  {'with the warm start   ' if warm else 'without the warm start'}: "
                         f"{describe(xs, a.trials_b)}")
    warm_cfgs = sorted({h["config"] and TrialConfig.from_dict(h["config"]).short() for r in runs
                        for h in r["history"] if h["warm_start_from"]})
    load_end = Path("/proc/loadavg").read_text().split()[:3]
    lines.append(f"A's winner: {rec_a.config.short()}; queued in B as: {', '.join(warm_cfgs) or 'nothing'}")
    lines.append("re-measured: " + "; ".join(f"{n} {m:.1f}" for n, m in sorted(med.items(), key=lambda kv: -kv[1])))
    lines.append(f"load average at the end {' '.join(load_end)}; measure: {measure.windows} windows of "
                 f"{measure.window_s:g} s, {measure.warmup_min_steps}+ warm-up steps")
    print("\n" + "\n".join(lines))
    out.write_text(json.dumps({"machine": hw.to_dict(), "date": time.strftime("%Y-%m-%d %H:%M"),
                               "load_start": load, "load_end": load_end, "workload_a": wa.to_dict(),
                               "workload_b": wb.to_dict(), "recommendation_a": rec_a.to_dict(), "runs": runs,
                               "remeasured": samples, "medians": med, "best_remeasured": best_ref,
                               "best_search": best_search, "summary": lines}, indent=1))
    print(f"\nraw results: {out}")
    if not a.workdir:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
