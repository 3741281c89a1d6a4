"""What torch.compile costs a fresh process once a study's inductor cache holds the graph: the figure behind
``autotune.search.choose.time_plan.CACHED_COMPILE_SHARE`` (the finalists' and the confirmation's runs of a compile
config are priced with it).

For each model, one compile config runs ``--runs`` times in fresh processes through the real runner, all with one
inductor cache (as ``Tuner.compile_cache_dir`` gives a study's trials): the first compiles cold, the others load.
Prints each run's wall and compile seconds (dynamo's clock) and the cached share; ``--out`` keeps them.

    python benchmarks/cached_compile.py --models resnet18,mobilenet_v3_small --mode default
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import MeasureSpec, TrialConfig, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.trial.runner import run_trial  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18,mobilenet_v3_small")
    p.add_argument("--mode", default="default", help="torch.compile mode (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="fresh processes per model, the first cold (default 3)")
    p.add_argument("--out", default=None, help="JSON of every run")
    a = p.parse_args(argv)
    hw = detect()
    print(f"# {hw.summary_line()}\n# {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    measure = MeasureSpec(windows=3, window_s=3.0, min_window_steps=1, timeout_s=900)
    rows = []
    for model in [m.strip() for m in a.models.split(",") if m.strip()]:
        workload = Workload(model=model, image_size=a.image_size, num_classes=10, dataset_size=1024)
        config = TrialConfig(batch_size=a.batch_size, compile_mode=a.mode, intra_op_threads=hw.physical_cores or 1,
                             inter_op_threads=1)
        cache = tempfile.mkdtemp(prefix="autotune-cached-compile-")
        runs = []
        for i in range(a.runs):
            r = run_trial(workload, config, measure, compile_cache_dir=cache)
            runs.append({"run": i, "status": r.status, "wall_s": r.wall_s, "compile_s": r.figures().get("compile_s"),
                         "samples_per_s": r.median_samples_per_s})
            print(f"  {model} {a.mode} run {i + 1}/{a.runs} ({'cold' if i == 0 else 'cached'}): {r.status} "
                  f"wall {r.wall_s:.1f} s, compile {runs[-1]['compile_s'] or 0:.1f} s", flush=True)
        cold = runs[0]["compile_s"]
        cached = [x["compile_s"] for x in runs[1:] if x["compile_s"] is not None]
        share = (max(cached) / cold) if cold and cached else None
        print(f"{model} {a.mode}: cold {cold or 0:.1f} s, cached {', '.join(f'{c:.1f}' for c in cached)} s"
              + (f": the cached share at most {share:.3f}" if share is not None else ""), flush=True)
        rows.append({"model": model, "mode": a.mode, "runs": runs, "cached_share": share})
    if a.out:
        Path(a.out).write_text(json.dumps({"machine": hw.to_dict(), "date": time.strftime("%Y-%m-%d"),
                                           "args": vars(a), "models": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
