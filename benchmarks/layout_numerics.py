"""Does ``channels_last`` alone move the loss? The numerics check (``autotune.trial.parity``) on configs whose only
change from fp32 eager is the memory layout, against what fp32 eager itself does from weights nudged by a
rounding-sized 1e-6 (the check's control).

Why: a config that changes no dtype and no graph (issue 50) would skip the check, which costs a child and three
trainings (6% of a 10-minute budget in the issue's run). channels_last changes the order of the sums inside a
convolution (oneDNN's NHWC kernels), as another thread count does; if its drift from the reference stays within
the control's drift, it says nothing a rounding nudge does not, and the check buys nothing for it.

For each workload x task x batch: ``max_rel_diff`` of channels_last fp32 from fp32 eager (train: smoothed loss
curves over ``--steps``; infer: each batch's outputs), the control's (``noise_floor``), their ratio, and whether
the check with its default tolerance passes. Tolerance 1e-12 is passed to the child so the control always runs.

    python benchmarks/layout_numerics.py                  # 3 vision workloads, 32 and 64 px, train and infer
    python benchmarks/layout_numerics.py --out benchmarks/results/layout-numerics-<date>.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig, Workload  # noqa: E402
from autotune.machine.hardware import detect  # noqa: E402
from autotune.trial.parity import DEFAULT_TOLERANCE, FLOOR_FACTOR, parity_check  # noqa: E402

WORKLOADS = ("resnet18", "mobilenet_v3_small", "benchmarks.workloads:tiny_vit")


def f(x) -> str:
    return "-" if x is None else f"{x:.2e}"


def one(model: str, task: str, size: int, batch: int, steps: int) -> dict:
    wl = Workload(model=model, image_size=size, task=task, dataset_size=max(256, batch * steps))
    cfg = TrialConfig(batch_size=batch, channels_last=True, intra_op_threads=2, inter_op_threads=1)
    r = parity_check(wl, cfg, steps=steps, tolerance=1e-12)
    floor = r.noise_floor
    verdict = None
    if r.max_rel_diff is not None:  # what the check would say at its default tolerance
        limit = max(DEFAULT_TOLERANCE, FLOOR_FACTOR * (floor or 0.0))
        verdict = r.max_rel_diff <= limit
    return {"model": model, "task": task, "image_size": size, "batch": batch, "steps": steps,
            "max_rel_diff": r.max_rel_diff, "noise_floor": floor,
            "ratio_to_control": (r.max_rel_diff / floor) if floor and r.max_rel_diff is not None else None,
            "passes_default": verdict, "reason": r.reason, "seconds": r.seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--sizes", default="32,64")
    p.add_argument("--batches", default="16,32")
    p.add_argument("--tasks", default="train,infer")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    hw = detect()
    rows = []
    start = time.monotonic()
    for model in a.workloads.split(","):
        for task in a.tasks.split(","):
            for size in (int(x) for x in a.sizes.split(",")):
                for batch in (int(x) for x in a.batches.split(",")):
                    row = one(model, task, size, batch, a.steps)
                    rows.append(row)
                    print(f"{model:32s} {task:5s} {size:3d}px b{batch:<3d} channels_last {f(row['max_rel_diff'])}"
                          f"  control {f(row['noise_floor'])}  ratio {f(row['ratio_to_control'])}"
                          f"  passes {row['passes_default']}", flush=True)
    worst = max((r["ratio_to_control"] for r in rows if r["ratio_to_control"] is not None), default=None)
    print(f"\n{len(rows)} checks on {hw.summary_line()} ({platform.processor() or platform.machine()}) in "
          f"{time.monotonic() - start:.0f} s; the most channels_last drifted against the control: "
          f"{'-' if worst is None else f'x{worst:.2f}'}; failed at the default tolerance: "
          f"{sum(1 for r in rows if r['passes_default'] is False)}")
    if a.out:
        Path(a.out).write_text(json.dumps({"machine": hw.summary_line(), "cpu_flags": sorted(
            f for f in hw.cpu_flags if f.startswith(("amx", "avx512_bf16", "avx2"))), "date": time.strftime("%Y-%m-%d"),
            "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
