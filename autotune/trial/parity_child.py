"""The child side of a parity check. Run as ``python -m autotune.trial.parity_child`` by ``parity.parity_check``.

Reads a JSON spec on stdin (workload, reference and candidate configs, steps, seed, result_path) and writes the
two loss curves (and, for inference, each batch's relative output difference) as JSON to ``result_path``; on
failure it writes ``{"error": ...}`` there. stdout and stderr are the user's code's and go to the check's log.

The candidate, the reference and (training) the control are copies of the same freshly built model, run one
after the other, each over the same batches: before each pass torch's generator is reseeded and a fresh seeded
DataLoader (``num_workers=0``) is made, so each pass draws exactly the same data, and only one model with its
optimizer state is on the device at a time (as in the trial: a winner near the memory cap fits the check as it
fit its trial). Each pass draws its random numbers (dropout) from its own generator state, seeded alike.

fp16's GradScaler skips the optimizer step of a batch whose gradients overflowed (the first few, by design,
while it finds its scale). The candidate runs first; the steps it skipped are skipped by the reference and the
control too (not stepped at all), and left out of all the curves: the runs are compared on the steps the
optimizer took, from the same weights. An out-of-memory error is reported as such (``"oom": true``), never as
a numerics verdict.

The N-rank check's child (``autotune.trial.parity_ranks``) reuses the step loop (``run_steps``: an optimizer step
of ``accumulation`` micro-batches, its loss optionally averaged over the ranks), the nudge (``nudged``) and the
result file's protocol (``serve``).
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
import traceback
from typing import Any, Callable

from autotune.trial.worker import apply_threads, die_with_parent, make_step

__all__ = ["CONTROL_NOISE", "nudged", "run_steps", "run", "serve", "main"]


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


def nudged(torch: Any, model: Any, seed: int) -> Any:
    """``model`` with its weights nudged by a relative ``CONTROL_NOISE`` (seeded): the control's start."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.mul_(1 + CONTROL_NOISE * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _value(loss: Any) -> float | None:
    return None if loss is None else float(loss.float().item())


def run(spec: dict) -> dict:
    """Build the workload once; run the candidate, the reference and (training) the control in turn over the
    same batches; return their curves on the steps the candidate's optimizer took."""
    from autotune.config import TrialConfig, Workload
    from autotune.trial.parity import control_needed

    workload = Workload.from_dict(spec["workload"])
    reference = TrialConfig.from_dict(spec["reference"])
    candidate = TrialConfig.from_dict(spec["candidate"])
    steps, seed = int(spec["steps"]), int(spec["seed"])

    import torch

    apply_threads(spec["candidate"])
    torch.manual_seed(seed)

    from autotune.machine.device import get_device
    from autotune.workloads.build import build

    dev = get_device(workload.device)
    dev.prepare(candidate)  # cudnn.benchmark and the current device: the same for every pass
    built = build(workload, seed=seed, config=candidate)
    train = workload.task == "train"
    initial = copy.deepcopy(built.model)  # every pass starts from these weights and buffers
    cuda_index = dev.index if dev.type == "cuda" else None

    def one_pass(config: Any, *, nudge: bool, skip: set[int]) -> tuple[list, list, set[int]]:
        model = copy.deepcopy(initial)
        step = make_step(nudged(torch, model, seed) if nudge else model, built.loss_fn, config, dev, train=train,
                         parts=built)
        curve, outputs, skipped = run_steps(torch, step, _loader(torch, built, candidate, seed), steps=steps,
                                            seed=seed, cuda_index=cuda_index, skip=skip, keep_outputs=not train)
        del step, model
        dev.release_cached_memory()  # the next pass's model gets what this one held
        return curve, outputs, skipped

    cand, cand_out, skipped = one_pass(candidate, nudge=False, skip=set())
    ref, ref_out, _ = one_pass(reference, nudge=False, skip=skipped)
    kept = lambda xs: [x for i, x in enumerate(xs) if i not in skipped]  # noqa: E731
    # the control only widens the limit: run it only when the candidate is over the tolerance
    control = (one_pass(reference, nudge=True, skip=skipped)[0]
               if train and control_needed(kept(ref), kept(cand), tolerance=float(spec["tolerance"])) else [])
    output_diffs = [float(((c - r).norm() / r.norm().clamp_min(1e-12)).item()) for r, c in zip(ref_out, cand_out)]
    return {"losses_reference": kept(ref), "losses_candidate": kept(cand), "losses_control": kept(control),
            "output_rel_diffs": output_diffs, "skipped_steps": sorted(i + 1 for i in skipped),
            "compared": "loss" if train else "output", "pid": os.getpid()}


def _loader(torch: Any, built: Any, candidate: Any, seed: int) -> Any:
    """A fresh loader over the same batches as every other pass (torch's generator reseeded first, for a dataset
    that draws from it)."""
    from autotune.workloads.contract import loader_kwargs, steps_per_epoch

    torch.manual_seed(seed)
    kw = {k: v for k, v in loader_kwargs(built, candidate, seed).items()
          if k not in ("persistent_workers", "prefetch_factor", "pin_memory")}
    loader = torch.utils.data.DataLoader(built.dataset, **{**kw, "num_workers": 0})
    if steps_per_epoch(loader) == 0:
        raise ValueError(f"the dataset has {len(built.dataset)} samples, fewer than one batch of "
                         f"{candidate.batch_size}")
    return loader


def run_steps(torch: Any, step: Any, loader: Any, *, steps: int, seed: int, cuda_index: int | None, skip: set[int],
              keep_outputs: bool, accumulation: int = 1,
              reduce: Callable[[float | None], float | None] | None = None) -> tuple[list, list, set[int]]:
    """Run ``steps`` optimizer steps of ``step`` over ``loader`` in its own random stream: the losses (stopping at
    the first non-finite one), the outputs when asked (on the host), and the steps whose optimizer step fp16's
    GradScaler skipped. Steps in ``skip`` draw their batches but are not stepped.

    An optimizer step is ``accumulation`` calls of ``step`` (micro-batches; ``make_step`` steps the optimizer on
    the last), and its loss is the mean of theirs: with equal micro-batches and a mean loss, that is the loss over
    all their samples. ``reduce`` (a DDP rank's: the mean over the ranks, a collective every rank makes at every
    step) turns a rank's loss into the global one, so every rank stops at the same step."""
    stream = _rng_streams(torch, seed, cuda_index)
    scaler = getattr(step, "scaler", None)
    curve: list = []
    outputs: list = []
    skipped: set[int] = set()
    it = iter(loader)

    def next_batch() -> Any:
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)

    for i in range(steps):
        batches = [next_batch() for _ in range(accumulation)]
        if i in skip:
            curve.append(None)
            continue
        before = scaler.get_scale() if scaler is not None else None
        values = []
        for batch in batches:
            result = _in_stream(torch, stream, cuda_index, lambda: step(batch))
            values.append(_value(result.loss))
            if keep_outputs and result.output is not None:
                outputs.append(result.output.detach().float().cpu())
        if scaler is not None and scaler.get_scale() < before:  # found inf: this optimizer step was skipped
            skipped.add(i)
        value = None if any(v is None for v in values) else sum(values) / len(values)
        if reduce is not None:
            value = reduce(value)
        curve.append(value)
        if value is not None and not math.isfinite(value):
            break  # a curve stops at its first non-finite loss: the rest would be noise
    return curve, outputs, skipped


def serve(work: Callable[[dict], dict]) -> None:
    """A check child's life: read the spec on stdin, ``work(spec)``, write its result (or the error) to the spec's
    ``result_path`` and exit at once (skip teardown: compile threads can hang it). An out-of-memory error, here
    or on a DDP rank (``ddp.RankFailure`` of kind oom), is marked so: no numerics verdict."""
    die_with_parent()
    spec = json.loads(sys.stdin.read())
    path = spec["result_path"]
    t0 = time.perf_counter()
    try:
        out = work(spec)
        out["child_s"] = time.perf_counter() - t0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent through the result file
        from autotune.machine.oom import is_oom

        traceback.print_exc()
        rank_tb = getattr(exc, "rank_traceback", None)
        if rank_tb:  # the failed rank's own traceback: the log says where it broke
            print(rank_tb, file=sys.stderr)
        msg = f"{type(exc).__name__}: {exc}".splitlines()[0][:500] if str(exc) else type(exc).__name__
        msg = str(exc).splitlines()[0][:500] if hasattr(exc, "trial_kind") else msg  # "rank 1: ..." as said
        oom = is_oom(exc) or getattr(exc, "trial_kind", None) == "oom"
        out = {"error": msg, "oom": oom, "pid": os.getpid()}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)  # NaN is written as NaN, which json reads back
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if "error" not in out else 1)


def main() -> int:
    serve(run)
    return 0  # not reached: serve exits


if __name__ == "__main__":
    sys.exit(main())
