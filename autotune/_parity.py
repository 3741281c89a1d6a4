"""The child side of a parity check. Run as ``python -m autotune._parity`` by ``parity.parity_check``.

Reads a JSON spec on stdin (workload, reference and candidate configs, steps, seed, result_path) and writes the
two loss curves (and, for inference, each batch's relative output difference) as JSON to ``result_path``; on
failure it writes ``{"error": ...}`` there. stdout and stderr are the user's code's and go to the check's log.

The reference and the candidate are two copies of the same freshly built model, stepped in turn on each batch:
a batch is drawn once (seeded DataLoader, ``num_workers=0``) and given to both, so no batch is kept beyond its
step and the two runs see exactly the same data. Each run draws its random numbers (dropout) from its own
generator state, seeded alike, so interleaving does not make one run's dropout depend on the other's.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
import traceback
from typing import Any

from ._worker import apply_threads, die_with_parent, make_step


def _rng_streams(torch: Any, seed: int, cuda_index: int | None) -> dict:
    """A random-generator state (CPU, and the CUDA device's) for one run; every run's starts alike."""
    with torch.random.fork_rng(devices=[] if cuda_index is None else [cuda_index]):
        torch.manual_seed(seed + 1)
        state = {"cpu": torch.get_rng_state(),
                 "cuda": None if cuda_index is None else torch.cuda.get_rng_state(cuda_index)}
    return state


def _in_stream(torch: Any, state: dict, cuda_index: int | None, fn: Any) -> Any:
    """Call ``fn`` with the global generators set to ``state``; save their new state there; restore the outer."""
    with torch.random.fork_rng(devices=[] if cuda_index is None else [cuda_index]):
        torch.set_rng_state(state["cpu"])
        if cuda_index is not None:
            torch.cuda.set_rng_state(state["cuda"], cuda_index)
        out = fn()
        state["cpu"] = torch.get_rng_state()
        if cuda_index is not None:
            state["cuda"] = torch.cuda.get_rng_state(cuda_index)
    return out


# The control run's initial weights are the reference's times (1 + CONTROL_NOISE * N(0, 1)): a perturbation of
# the size of fp32 rounding, so the control shows how far fp32 training drifts on its own from a nudge that small.
CONTROL_NOISE = 1e-6


def _nudged(torch: Any, model: Any, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.mul_(1 + CONTROL_NOISE * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _value(loss: Any) -> float | None:
    return None if loss is None else float(loss.float().item())


def run(spec: dict) -> dict:
    """Build the workload once, step the reference and the candidate on the same batches; return both curves."""
    from .config import TrialConfig, Workload

    workload = Workload.from_dict(spec["workload"])
    reference = TrialConfig.from_dict(spec["reference"])
    candidate = TrialConfig.from_dict(spec["candidate"])
    steps, seed = int(spec["steps"]), int(spec["seed"])

    import torch

    apply_threads(spec["candidate"])
    torch.manual_seed(seed)

    from ._device import get_device
    from .workloads import build

    dev = get_device(workload.device)
    dev.prepare(candidate)  # cudnn.benchmark and the current device: the same for both runs
    built = build(workload, seed=seed, config=candidate)
    train = workload.task == "train"
    # Both copies are taken before either is touched: the same initial weights and buffers.
    # The control (train only) is the reference from nudged weights: its drift is the noise floor.
    # The workload's own optimizer, step and count (autotune.contract) are what was measured: they are checked.
    steppers = [make_step(copy.deepcopy(built.model), built.loss_fn, cfg, dev, train=train, parts=built)
                for cfg in (reference, candidate)]
    if train:
        steppers.append(make_step(_nudged(torch, copy.deepcopy(built.model), seed), built.loss_fn, reference, dev,
                                  train=True, parts=built))
    cuda_index = dev.index if dev.type == "cuda" else None
    streams = [_rng_streams(torch, seed, cuda_index) for _ in steppers]

    from .contract import loader_kwargs, steps_per_epoch

    kw = {k: v for k, v in loader_kwargs(built, candidate, seed).items()
          if k not in ("persistent_workers", "prefetch_factor", "pin_memory")}
    loader = torch.utils.data.DataLoader(built.dataset, **{**kw, "num_workers": 0})
    if steps_per_epoch(loader) == 0:
        raise ValueError(f"the dataset has {len(built.dataset)} samples, fewer than one batch of "
                         f"{candidate.batch_size}")
    curves: list[list] = [[] for _ in steppers]
    output_diffs: list[float] = []
    finite = [True for _ in steppers]
    it = iter(loader)
    for _ in range(steps):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        outs = []
        for i, step in enumerate(steppers):
            if not finite[i]:  # a curve stops at its first non-finite loss: the rest would be noise
                outs.append(None)
                continue
            result = _in_stream(torch, streams[i], cuda_index, lambda: step(batch))
            value = _value(result.loss)
            curves[i].append(value)
            if value is not None and not math.isfinite(value):
                finite[i] = False
            outs.append(result.output)
        if not train and outs[0] is not None and outs[1] is not None:
            ref, cand = outs[0].float(), outs[1].float()
            output_diffs.append(float(((cand - ref).norm() / ref.norm().clamp_min(1e-12)).item()))
        if not (finite[0] and finite[1]):
            break
    return {"losses_reference": curves[0], "losses_candidate": curves[1],
            "losses_control": curves[2] if train else [], "output_rel_diffs": output_diffs,
            "compared": "loss" if train else "output", "pid": os.getpid()}


def main() -> int:
    die_with_parent()
    spec = json.loads(sys.stdin.read())
    path = spec["result_path"]
    t0 = time.perf_counter()
    try:
        out = run(spec)
        out["child_s"] = time.perf_counter() - t0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent through the result file
        traceback.print_exc()
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500] if str(exc) else type(exc).__name__
        out = {"error": msg, "pid": os.getpid()}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)  # NaN is written as NaN, which json reads back
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if "error" not in out else 1)  # skip teardown: compile threads can hang it


if __name__ == "__main__":
    sys.exit(main())
