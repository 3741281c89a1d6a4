"""Do the claims hold? Tune each workload with autotune, then re-measure its recommendation and the baseline with a
training loop that shares no code with autotune, and compare the claimed speedup with the re-measured one.

For each workload (default: the quality benchmark's four):

1. ``autotune run`` (the real CLI, its own storage) with a trial budget, then ``autotune export``: the YAML's claim
   (``measured.speedup_vs_baseline``, the confirmation's rounds and interval: ``autotune.search.choose.confirm``).
2. The independent loop (``--one``, this file, in a fresh process per run), written as a user following the YAML
   would, importing nothing of autotune: it builds the model and data itself (a torchvision model on JPEGs it encodes
   and decodes with PIL and the standard transforms; its own text classifier on its own synthetic token sequences;
   a ``module:callable`` workload is the user's own code, called as they would), and applies every knob the YAML
   names: batch size and gradient accumulation (``batch.accumulation_steps``), DataLoader workers, prefetch, pinning
   and persistence, intra- and inter-op threads (the inter-op count before any parallel work), bf16 autocast, fp16
   autocast with a ``GradScaler``, channels_last, ``torch.compile`` with the YAML's mode, length bucketing, and the
   YAML's ``environment`` exported before the process starts. A recommendation it cannot reproduce (several DDP
   ranks, a workload's own step or count, a knob it does not know) is refused with its reason, never measured
   without the knob. A warm-up of its own (compile included), then windows timed by ``time.perf_counter`` around
   whole steps (the loss read at each window's end), samples/s per window.
3. The recommendation and the claim's baseline in fresh processes, interleaved (A B, B A, ...), ``--rounds`` rounds,
   each process started in the environment the claim names (``provenance.trials_environment``: autotune's trials
   clear the shell's thread, allocator and preload variables, so both run without them here too; the recommendation
   then gets its own ``environment``). The re-measured speedup and its 95% interval are this file's own analysis
   (``paired_interval``: each round's ratio of medians, Student's t over their logs), not autotune's.

It prints claim / re-measured per workload with both intervals, and whether the claim lies within 5% of the
re-measurement or inside its interval; raw results go to a JSON file, with the machine and its load.

    python benchmarks/claims.py --quick            # 32 px, 8 trials each, 4 rounds: ~30 min on 2 cores
    python benchmarks/claims.py --workloads resnet18,mobilenet_v3_small --image-size 160 --trials 12 --timeout 15m
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = ("resnet18", "mobilenet_v3_small", "benchmarks.workloads:tiny_vit", "transformer_tiny")

# The text models a user of autotune's built-in text workload trains: (vocabulary, width, layers, heads, feed-forward),
# its documented sizes (docs/text.md); rebuilt here, not imported.
TEXT = {"transformer": (8000, 128, 2, 4, 512), "transformer_tiny": (1000, 32, 1, 2, 64)}
PAD = 0

# The knobs this loop applies (a user following the YAML); any other with a value that changes the run is refused.
APPLIED = {"batch_size", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "amp", "channels_last",
           "compile_mode", "intra_op_threads", "inter_op_threads", "cudnn_benchmark", "malloc", "affinity",
           "bucket_by_length"}
INERT = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "static_graph": False}  # DDP's, one process here

# What autotune's trials clear from the shell (its clean room), as this benchmark reads the claim: its own list,
# since it imports nothing of autotune; tests/test_benchmarks.py (test_claims_clean_room_is_the_trials_clean_room)
# fails when it and ``launch_env.INHERITED_VARS``/``INHERITED_PREFIXES`` clear different names.
SHELL_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
              "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY",
              "OMP_DYNAMIC", "OMP_MAX_ACTIVE_LEVELS", "OMP_THREAD_LIMIT", "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT",
              "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_HW_SUBSET", "KMP_SETTINGS", "MKL_DYNAMIC", "MKL_THREADING_LAYER",
              "LD_PRELOAD", "GLIBC_TUNABLES", "THP_MEM_ALLOC_ENABLE", "PYTORCH_CUDA_ALLOC_CONF",
              "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
SHELL_PREFIXES = ("MALLOC_", "TCMALLOC_")

# Student's t, 97.5th percentile, by degrees of freedom (a 95% two-sided interval); beyond 30, the normal's 1.96.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# --- what a recommendation asks, and whether this loop can do it --------------------------------------------

def refusal(rec: dict) -> str | None:
    """Why this loop cannot reproduce ``rec`` (a YAML as a dict) as its user would; None when it can."""
    wl, cfg = rec.get("workload") or {}, rec.get("config") or {}
    if int(wl.get("nproc_per_node") or 1) > 1:
        return f"{wl['nproc_per_node']} DDP ranks: launch them with torchrun as the YAML's distributed section says"
    if wl.get("device", "cpu") != "cpu":
        return f"device {wl.get('device')}: this loop runs on the CPU"
    # the parts a generic loop has too; the built-in text workloads' token count and lengths are autotune's own, which
    # this loop builds itself (``text``: padding, real tokens, bucketing), not a user's code
    own = set(rec.get("user_parts") or ()) - {"optimizer", "collate_fn", "sampler"}
    own -= {"count", "length"} if wl.get("model") in TEXT else set()
    if own:
        return f"the workload's own {', '.join(sorted(own))}: the user's code, not a generic loop's"
    for k, v in cfg.items():
        if k not in APPLIED and k in INERT and v != INERT[k]:
            return f"{k}={v!r}: a DDP knob, and this is one process"
        if k not in APPLIED and k not in INERT and v not in (None, False, 0, "none", "default", "off"):
            return f"{k}={v!r}: a knob this loop does not know how to apply"
    if cfg.get("amp") not in (None, "off", "bf16", "fp16"):
        return f"amp={cfg.get('amp')!r}: not a precision this loop knows"
    return None


# --- building the workload, as its user would -----------------------------------------------------------------

class JPEGs:
    """Synthetic photos: ``pool`` JPEGs encoded once with PIL (smooth colour fields plus noise, about 1.15x the crop),
    decoded and transformed on every access, as a folder of photos is."""

    def __init__(self, image_size: int, length: int, num_classes: int, transform, pool: int = 64) -> None:
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(1)
        self.length, self.num_classes, self.transform, self.pool = length, num_classes, transform, []
        side = int(image_size * 1.15)
        for _ in range(pool):
            h, w = max(16, int(side * rng.uniform(0.9, 1.1))), max(16, int(side * rng.uniform(0.9, 1.3)))
            field = Image.fromarray(rng.integers(0, 256, (max(2, h // 32), max(2, w // 32), 3), dtype=np.uint8))
            arr = np.asarray(field.resize((w, h), Image.BILINEAR), dtype=np.int16) + rng.integers(-12, 13, (h, w, 3))
            buf = io.BytesIO()
            Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
            self.pool.append(buf.getvalue())

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        from PIL import Image

        img = Image.open(io.BytesIO(self.pool[i % len(self.pool)])).convert("RGB")
        return self.transform(img), i % self.num_classes


def vision(wl: dict) -> dict:
    """A torchvision classifier (no weights) on ``JPEGs`` through the standard training transforms."""
    import torch
    import torchvision
    from torchvision import transforms as T

    size = int(wl.get("image_size") or 224)
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    n_cls = int(wl.get("num_classes") or 1000)
    model = torchvision.models.get_model(wl["model"], weights=None, num_classes=n_cls)
    return {"model": model, "dataset": JPEGs(size, int(wl.get("dataset_size") or 50000), n_cls, tf),
            "loss_fn": torch.nn.CrossEntropyLoss()}


def text(wl: dict) -> dict:
    """A small encoder classifier on synthetic token sequences (lognormal lengths: median a quarter of the longest,
    sigma 0.7), padded per batch, mean-pooled over the real tokens, trained with AdamW."""
    import numpy as np
    import torch
    from torch import nn

    vocab, width, layers, heads, ff = TEXT[wl["model"]]
    max_len, n_cls, n = int(wl.get("image_size") or 128), int(wl.get("num_classes") or 2), int(
        wl.get("dataset_size") or 50000)
    lengths = np.clip(np.rint(np.random.default_rng(2).lognormal(math.log(max(8, max_len / 4)), 0.7, n)), 8, max_len)
    tokens = torch.randint(1, vocab, (max(4 * max_len, 1 << 16),), generator=torch.Generator().manual_seed(2))

    class Seqs(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            start = (i * 104729) % (len(tokens) - max_len)
            return tokens[start:start + int(lengths[i])], i % n_cls

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width, padding_idx=PAD), nn.Embedding(max_len, width)
            block = nn.TransformerEncoderLayer(width, heads, ff, dropout=0.1, activation="gelu", batch_first=True)
            self.enc = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, n_cls)

        def forward(self, x):
            real = x != PAD
            h = self.enc(self.norm(self.tok(x) + self.pos(torch.arange(x.shape[1]))), src_key_padding_mask=~real)
            w = real.unsqueeze(-1).to(h.dtype)
            return self.head((h * w).sum(1) / w.sum(1).clamp(min=1))

    def collate(items):
        return (nn.utils.rnn.pad_sequence([s for s, _ in items], batch_first=True, padding_value=PAD),
                torch.tensor([y for _, y in items]))

    return {"model": Encoder(), "dataset": Seqs(), "loss_fn": nn.CrossEntropyLoss(), "collate_fn": collate,
            "optimizer": lambda p: torch.optim.AdamW(p, lr=1e-4, weight_decay=0.01), "lengths": lengths}


def users(wl: dict) -> dict:
    """A ``module:callable`` workload: the user's own code, called with the arguments it takes, as they would."""
    import importlib
    import inspect

    mod, _, name = wl["model"].partition(":")
    sys.path.insert(0, str(ROOT))
    fn = getattr(importlib.import_module(mod), name)
    kw = {k: wl[k] for k in ("image_size", "task", "num_classes") if k in inspect.signature(fn).parameters and k in wl}
    got = fn(**kw)
    return got if isinstance(got, dict) else dict(zip(("model", "dataset", "loss_fn"), got))


def buckets(lengths, batch: int):
    """Batches of similar length (shuffled chunks of 50 batches, each sorted by length), shuffled: the length
    bucketing a recommendation with ``bucket_by_length`` asks for; the sampler's order of indices."""
    import numpy as np

    rng = np.random.default_rng(3)
    while True:
        order = rng.permutation(len(lengths))[:len(lengths) // batch * batch]
        chunks = [order[c:c + 50 * batch] for c in range(0, len(order), 50 * batch)]
        out = [part[i:i + batch] for ch in chunks for part in [ch[np.argsort(lengths[ch], kind="stable")]]
               for i in range(0, len(part), batch)]
        for b in rng.permutation(len(out)):
            yield from (int(i) for i in out[b])


# --- the independent loop: one process, one config ------------------------------------------------------------

def _loader(built: dict, cfg: dict):
    import torch

    workers, bs = int(cfg.get("num_workers") or 0), int(cfg["batch_size"])
    kw = {"num_workers": workers, "pin_memory": bool(cfg.get("pin_memory")), "drop_last": True,
          "collate_fn": built.get("collate_fn")}
    if workers:
        kw.update(prefetch_factor=cfg.get("prefetch_factor") or 2,
                  persistent_workers=bool(cfg.get("persistent_workers")))
    if cfg.get("bucket_by_length") and built.get("lengths") is not None:
        lengths = built["lengths"]

        class Sampler(torch.utils.data.Sampler):
            def __iter__(self):
                return buckets(lengths, bs)

            def __len__(self):
                return len(lengths) // bs * bs

        kw["sampler"] = Sampler()
    else:
        kw["shuffle"] = True
    return torch.utils.data.DataLoader(built["dataset"], batch_size=bs, **kw)


def one(spec: dict) -> dict:
    """Measure ``spec`` (config, workload, accumulation, windows) with a plain loop; samples/s per window."""
    cfg, wl = spec["config"], spec["workload"]
    import torch

    if cfg.get("inter_op_threads"):  # before any parallel work, as torch requires
        torch.set_num_interop_threads(int(cfg["inter_op_threads"]))
    if cfg.get("intra_op_threads"):
        torch.set_num_threads(int(cfg["intra_op_threads"]))
    name = wl["model"]
    built = text(wl) if name in TEXT else users(wl) if ":" in name else vision(wl)
    model, loss_fn = built["model"], built["loss_fn"]
    cl = bool(cfg.get("channels_last"))
    if cl:
        model = model.to(memory_format=torch.channels_last)
    opt = (built.get("optimizer") or (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)))(model.parameters())
    if cfg.get("compile_mode") not in (None, "none"):
        model = torch.compile(model, mode=None if cfg["compile_mode"] == "default" else cfg["compile_mode"])
    amp = cfg.get("amp") or "off"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    scaler = torch.amp.GradScaler("cpu") if amp == "fp16" else None
    accum = max(1, int(spec.get("accumulation_steps") or 1))
    it = iter(_forever(_loader(built, cfg)))
    model.train()

    def step() -> tuple:
        n, loss = 0, None
        for _ in range(accum):  # one optimizer step of ``accum`` micro-batches
            x, y = next(it)[:2]
            if cl and x.dim() == 4 and x.is_floating_point():
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = loss_fn(model(x).float(), y) / accum
            (scaler.scale(loss) if scaler else loss).backward()
            n += len(y)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, n

    return {"samples_per_s": _windows(step, spec)}


def _forever(loader):
    while True:
        yield from loader


def _windows(step, spec: dict) -> list[float]:
    """A warm-up (two steps, compile included, then ``warmup_s``), then ``windows`` windows of ``window_s``."""
    for _ in range(2):
        step()[0].item()
    end = time.perf_counter() + spec["warmup_s"]
    while time.perf_counter() < end:
        step()[0].item()
    out = []
    for _ in range(spec["windows"]):
        n, t0 = 0, time.perf_counter()
        while True:
            loss, k = step()
            n += k
            if time.perf_counter() - t0 >= spec["window_s"]:
                loss.item()
                break
        out.append(n / (time.perf_counter() - t0))
    return out


def clean(environ: dict) -> dict:
    """``environ`` without the shell's thread, allocator and preload variables (the claim's baseline ran so)."""
    return {k: v for k, v in environ.items() if k not in SHELL_VARS and not k.startswith(SHELL_PREFIXES)}


def run_one(spec: dict, env: dict, timeout_s: float) -> list[float]:
    """``one(spec)`` in a fresh interpreter started with exactly ``env``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        out = subprocess.run([sys.executable, __file__, "--one", f.name], capture_output=True, text=True,
                             timeout=timeout_s, env=env, cwd=str(ROOT))
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"the independent loop failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]


# --- the analysis: this file's own --------------------------------------------------------------------------

def paired_interval(a: list[list[float]], b: list[list[float]]) -> tuple[float, float, float]:
    """``(ratio, low, high)``: the geometric mean of the rounds' ratios of medians (``a[r]`` over ``b[r]``, each
    round a fresh process of each, interleaved) and Student's t 95% interval on their logs."""
    logs = [math.log(statistics.median(x) / statistics.median(y)) for x, y in zip(a, b)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), 0.0, math.inf
    t = T975[len(logs) - 2] if len(logs) - 1 <= len(T975) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


# --- the benchmark ---------------------------------------------------------------------------------------------

def tune(name: str, a, folder: Path) -> dict:
    """``autotune run`` then ``autotune export``: the YAML as a dict."""
    db = f"sqlite:///{folder}/claims.db"
    cmd = [sys.executable, "-m", "autotune.cli", "run", "--model", name, "--image-size", str(a.image_size),
           "--trials", str(a.trials), "--windows", str(a.windows), "--window-seconds", str(a.window_seconds),
           "--storage", db, "--no-progress", "--parity-steps", str(a.parity_steps)]
    cmd += ["--timeout", a.timeout] if a.timeout else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"autotune run {name} failed: {run.stderr.strip().splitlines()[-1:]}")
    out = folder / "rec.yaml"
    subprocess.run([sys.executable, "-m", "autotune.cli", "export", "--storage", db, "-o", str(out)], check=True,
                   capture_output=True, cwd=ROOT, env=env)
    import yaml

    return yaml.safe_load(out.read_text())


def remeasure(rec: dict, a) -> dict:
    """The recommendation and the claim's baseline (its config from the confirmation; PyTorch's defaults at bs 64
    in an older YAML) through the independent loop, interleaved, each in the environment the claim names."""
    wl = {k: v for k, v in rec["workload"].items() if k != "data"}
    base_cfg = (rec.get("confirmation") or {}).get("baseline_config") or {"batch_size": 64}
    spec = {"workload": wl, "windows": a.windows_remeasure, "window_s": a.window_seconds * 2, "warmup_s": 2.0}
    prov = rec.get("provenance") or {}
    # autotune's trials ran without the shell's thread/allocator/preload variables (its clean room, said in the
    # provenance); an older claim's trials inherited the shell
    room = clean(dict(os.environ)) if "shell_environment" in prov else dict(os.environ)
    room["PYTHONPATH"] = str(ROOT)
    accum = (rec.get("batch") or {}).get("accumulation_steps") or 1
    contenders = {"recommended": (rec["config"], {**room, **(rec.get("environment") or {})}, accum),
                  "baseline": (base_cfg, room, 1)}
    rounds: dict[str, list[list[float]]] = {k: [] for k in contenders}
    for r in range(a.rounds):
        for k in (list(contenders) if r % 2 == 0 else list(reversed(contenders))):
            cfg, env, steps = contenders[k]
            rounds[k].append(run_one({**spec, "config": cfg, "accumulation_steps": steps}, env, timeout_s=900))
            print(f"  round {r + 1} {k:<12} {statistics.median(rounds[k][-1]):.1f} samples/s", flush=True)
    ratio, lo, hi = paired_interval(rounds["recommended"], rounds["baseline"])
    return {"rounds": rounds, "speedup": ratio, "interval": [lo, hi]}


def _row(name: str, rec: dict, a) -> dict:
    """One workload's row: the claim, then the re-measurement (or why not)."""
    m, conf = rec["measured"], rec.get("confirmation") or {}
    print(f"claim: {conf.get('headline') or m.get('speedup_vs_baseline')}", flush=True)
    why = refusal(rec)
    row = {"workload": name, "config": rec["config"], "claim": m.get("speedup_vs_baseline"),
           "claim_interval": conf.get("interval"), "claim_rounds": len(conf.get("rounds") or ()),
           "selection": (rec.get("selection") or {}).get("speedup_vs_baseline"), "load": os.getloadavg()}
    if why is not None:
        print(f"refused: {why}", flush=True)
        return {**row, "refused": why}
    if row["claim"] is None or not (conf.get("interval") or [None])[0]:  # a figure with no interval is no claim
        print("no confirmed claim to check", flush=True)
        why = conf.get("why") or conf.get("status") or "no confirmation rounds: a provisional or older recommendation"
        return {**row, "refused": f"no confirmed claim ({why})"}
    again = remeasure(rec, a)
    return {**row, "remeasured": again["speedup"], "remeasured_interval": again["interval"],
            "rounds": again["rounds"], "load_after": os.getloadavg()}


def _table(rows: list[dict]) -> None:
    print("\n| workload | selection | claim (95% interval, rounds) | re-measured (95% interval) | claim/re-measured | "
          "within 5% | inside the re-measurement's interval |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r.get("refused"):
            print(f"| {r['workload']} | | | refused: {r['refused']} | | | |")
            continue
        ci, ri = r["claim_interval"] or [None, None], r["remeasured_interval"]
        within = abs(r["claim"] / r["remeasured"] - 1) <= 0.05
        inside = ri[0] <= r["claim"] <= ri[1]
        cl = f"x{r['claim']:.2f}" + (f" (x{ci[0]:.2f}-x{ci[1]:.2f}, {r['claim_rounds']})" if ci[0] else "")
        print(f"| {r['workload']} | x{r['selection'] or float('nan'):.2f} | {cl} | x{r['remeasured']:.2f} "
              f"(x{ri[0]:.2f}-x{ri[1]:.2f}) | {r['claim'] / r['remeasured']:.3f} | {'yes' if within else 'no'} | "
              f"{'yes' if inside else 'no'} |")


def _machine() -> str:
    """The CPU's model name and the cores this process may use (from /proc/cpuinfo and the affinity mask)."""
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown CPU"
    return f"{model} ({len(os.sched_getaffinity(0))} usable cores)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one", metavar="SPEC", help=argparse.SUPPRESS)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=1.0)
    p.add_argument("--windows-remeasure", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--parity-steps", type=int, default=10)
    p.add_argument("--timeout", default=None, help="each tuning run's --timeout too (e.g. 15m): whichever ends first")
    p.add_argument("--quick", action="store_true", help="32 px, 8 trials, windows of 0.5 s, 4 rounds")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(one(json.loads(Path(a.one).read_text()))))
        return 0
    if a.quick:
        a.image_size, a.trials, a.window_seconds = 32, 8, 0.5
    machine = _machine()
    print(f"# {machine.strip()}\n# {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()}", flush=True)
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"claims-{time.strftime('%Y%m%d-%H%M%S')}.json")
    rows = []
    for name in [w.strip() for w in a.workloads.split(",") if w.strip()]:
        print(f"\n## {name}", flush=True)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                rec = tune(name, a, Path(tmp))
        except RuntimeError as exc:  # autotune said why in one line (a misspelt model, say): so do we
            print(f"claims.py: {exc}", file=sys.stderr)
            return 2
        rows.append(_row(name, rec, a))
        out.write_text(json.dumps({"machine": machine.strip(), "args": vars(a), "workloads": rows}, indent=1))
    _table(rows)
    print(f"\nraw results: {out}; load at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
