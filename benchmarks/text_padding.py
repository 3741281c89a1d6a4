"""Does padding matter for the text workload? tokens/s of a training step, interleaved, in one process.

Three ways to batch the same synthetic sequences (``autotune.workloads.text``): padded to the batch's longest in random
order (the workload's collate), the same padded up to a multiple of 64, and length-bucketed (batches of similar
lengths: indices sorted by length within chunks of 50 batches, the batches shuffled, as HF's group_by_length).
Real (non-pad) tokens per second of AdamW training steps, rounds interleaved (A B C, B C A, ...).

    python benchmarks/text_padding.py --batch-size 32 --seq-len 128 --rounds 4 --steps 6
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--amp", default="off", choices=("off", "bf16"))
    args = ap.parse_args()
    import torch

    from autotune.config import Workload
    from autotune.workloads.text import PAD, pad_collate
    from autotune.workloads.build import build

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    built = build(Workload(model=args.model, image_size=args.seq_len, dataset_size=4096))
    ds, model, loss_fn = built.dataset, built.model, built.loss_fn
    opt = built.optimizer(model.parameters())
    bs = args.batch_size
    rng = random.Random(0)

    def random_batches():
        idx = list(range(len(ds)))
        rng.shuffle(idx)
        return [idx[i:i + bs] for i in range(0, len(idx) - bs + 1, bs)]

    def bucketed_batches():
        idx = list(range(len(ds)))
        rng.shuffle(idx)
        chunk = 50 * bs
        out = []
        for c in range(0, len(idx), chunk):
            part = sorted(idx[c:c + chunk], key=lambda i: ds.lengths[i])
            out += [part[i:i + bs] for i in range(0, len(part) - bs + 1, bs)]
        rng.shuffle(out)
        return out

    def pad64(batch):
        tokens, labels = batch
        extra = -tokens.shape[1] % 64
        return torch.nn.functional.pad(tokens, (0, extra), value=PAD), labels

    modes = {"longest": (random_batches, lambda b: b), "multiple64": (random_batches, pad64),
             "bucketed": (bucketed_batches, lambda b: b)}
    names = list(modes)
    results: dict[str, list[float]] = {m: [] for m in names}
    padded: dict[str, list[float]] = {m: [] for m in names}

    def step(batch):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        opt.step()

    for name in names:  # warm-up
        make, post = modes[name]
        for ids in make()[:2]:
            step(post(pad_collate([ds[i] for i in ids])))
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            make, post = modes[name]
            batches = [post(pad_collate([ds[i] for i in ids])) for ids in make()[:args.steps]]
            real = sum(int((b[0] != PAD).sum()) for b in batches)
            cells = sum(b[0].numel() for b in batches)
            t0 = time.perf_counter()
            for b in batches:
                step(b)
            dt = time.perf_counter() - t0
            results[name].append(real / dt)
            padded[name].append(real / cells)
            print(f"round {r} {name:<11} {real / dt:8.0f} real tokens/s  ({100 * real / cells:.0f}% real)", flush=True)
    summary = {m: {"median_tokens_per_s": round(statistics.median(v), 1), "min": round(min(v), 1),
                   "max": round(max(v), 1), "real_share": round(statistics.mean(padded[m]), 3)}
               for m, v in results.items()}
    for m in names[1:]:
        ratios = [a / b for a, b in zip(results[m], results["longest"])]
        summary[m]["vs_longest_per_round"] = [round(x, 3) for x in ratios]
    print(json.dumps({"args": vars(args), "torch_threads": torch.get_num_threads(), "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
