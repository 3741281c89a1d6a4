"""An independent re-measurement of training configs, each in a fresh process, interleaved: autotune's
recommendation (read from its exported YAML, as a user reads it) beside PyTorch's defaults and the seeds' recipe.

It shares no code with autotune (it never imports it): its own DataLoader, model, optimizer, autocast and
GradScaler, and wall-clock windows synchronised at each edge, so it can check autotune's figures rather than
repeat them. Adapted from ../shared/measurements/h200-2026-11-26/reference_measure.py (the H200 run of 2026-11-26),
with a driver around it. Always ``weights=None``: nothing is downloaded.

The driver (one table: each config's samples/s per round, the median, the ratio to PyTorch's defaults):

    python benchmarks/gpu_reference.py --data DIR --rec rec.yaml                # on a GPU, 2 rounds
    python benchmarks/gpu_reference.py --data DIR --device cpu --quick          # a tiny run anywhere
    python benchmarks/gpu_reference.py --data DIR --rec rec.yaml --dry-run      # the plan only

Rounds alternate their order (A B C, then C B A, ...), so a drift of the machine over the run does not favour
the config measured first. ``--budget-s`` bounds the whole comparison: a child that could not finish in what is
left is not started, and its cell says "cut".

One config in this process (what each child runs; prints ``RESULT {json}``):

    python benchmarks/gpu_reference.py --one '{"data": DIR, "bs": 64, "workers": 4, "pin": 1, "amp": "fp16"}'

Keys of --one: model, task (train|infer), res, data, classes, bs, workers, prefetch, pin, persistent,
amp (off|fp16|bf16; fp16 runs with a GradScaler), cl (channels_last), cudnn (cudnn.benchmark), compile
(none|default|reduce-overhead|max-autotune), threads, interop, window_s, windows, warmup_s, device (cuda|cpu).
"""

import time

T0 = time.perf_counter()

import argparse  # noqa: E402 - the start-up time counts from the first line
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ONE_DEFAULTS = {"model": "resnet18", "task": "train", "res": 224, "data": None, "classes": 1000, "bs": 64,
                "workers": 0, "prefetch": 2, "pin": 0, "persistent": 0, "amp": "off", "cl": 0, "cudnn": 0,
                "compile": "none", "threads": 0, "interop": 0, "window_s": 1.5, "windows": 4, "warmup_s": 4.0,
                "device": "cuda"}

# PyTorch's defaults: DataLoader(batch_size=64), fp32, nothing else set
DEFAULTS = {"bs": 64}
# the recipe every seed of this project repeats (blog posts' "batch 64, num_workers 4, pin_memory"), with AMP
SEEDS = {"bs": 64, "workers": 4, "pin": 1, "persistent": 1, "prefetch": 2, "cudnn": 1, "amp": "fp16"}


# --- one config, in this process ------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Ask Linux to kill this process when the driver dies (best effort: Linux only)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _loader(cfg: dict):
    import torch
    import torchvision
    from torch.utils.data import DataLoader, RandomSampler
    from torchvision import transforms as T

    res = cfg["res"]
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    if cfg["task"] == "train":
        tf = T.Compose([T.RandomResizedCrop(res), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    else:
        tf = T.Compose([T.Resize(int(res * 256 / 224)), T.CenterCrop(res), T.ToTensor(), norm])
    ds = torchvision.datasets.ImageFolder(cfg["data"], transform=tf)
    # with replacement, 10**7 draws: a small folder never runs out, and no epoch boundary falls in a window
    sampler = RandomSampler(ds, replacement=True, num_samples=10**7, generator=torch.Generator().manual_seed(0))
    kw = dict(batch_size=cfg["bs"], sampler=sampler, num_workers=cfg["workers"], pin_memory=bool(cfg["pin"]),
              drop_last=True)
    if cfg["workers"] > 0:
        kw.update(prefetch_factor=cfg["prefetch"], persistent_workers=bool(cfg["persistent"]))
    return DataLoader(ds, **kw)


def _stepper(cfg: dict, dev):
    """``(step(x, y) -> loss or sum, sync)`` for the config: the model on the device, its optimizer, autocast."""
    import torch
    import torchvision

    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = getattr(torchvision.models, cfg["model"])(weights=None, num_classes=cfg["classes"]).to(dev)
    mf = torch.channels_last if cfg["cl"] else torch.contiguous_format
    model = model.to(memory_format=mf)
    fwd = model if cfg["compile"] in ("none", None, 0) else \
        torch.compile(model, mode=None if cfg["compile"] == "default" else cfg["compile"])
    lossf = torch.nn.CrossEntropyLoss()
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg["amp"])
    scaler = torch.amp.GradScaler(dev.type) if cfg["amp"] == "fp16" else None
    nb = bool(cfg["pin"]) and cuda
    train = cfg["task"] == "train"
    model.train(train)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if train else None

    def step(x, y):
        x = x.to(dev, non_blocking=nb).to(memory_format=mf)
        y = y.to(dev, non_blocking=nb)
        ctx = torch.autocast(dev.type, dtype=amp_dtype) if amp_dtype else torch.autocast(dev.type, enabled=False)
        if not train:
            with torch.inference_mode(), ctx:
                return fwd(x).float().sum()
        opt.zero_grad(set_to_none=True)
        with ctx:
            loss = lossf(fwd(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    return step, sync


def measure_one(cfg: dict) -> dict:
    """Warm up for ``warmup_s`` (and at least 3 steps), then ``windows`` windows of at least ``window_s`` each."""
    if cfg["threads"]:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(cfg["threads"]))
    import torch

    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    if cfg["interop"]:
        torch.set_num_interop_threads(cfg["interop"])
    if cfg["device"] == "cuda":
        torch.backends.cudnn.benchmark = bool(cfg["cudnn"])
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    else:
        dev = torch.device("cpu")
    it = iter(_loader(cfg))
    step, sync = _stepper(cfg, dev)
    t_build = time.perf_counter()
    t_end, nwarm = time.perf_counter() + cfg["warmup_s"], 0
    while time.perf_counter() < t_end or nwarm < 3:
        x, y = next(it)
        out = step(x, y)
        nwarm += 1
    sync()
    t_warm = time.perf_counter()
    wins, data_wait = [], 0.0
    for _ in range(cfg["windows"]):
        n = 0
        sync()
        t0 = time.perf_counter()
        while True:
            td = time.perf_counter()
            x, y = next(it)
            data_wait += time.perf_counter() - td
            out = step(x, y)
            n += cfg["bs"]
            if time.perf_counter() - t0 >= cfg["window_s"]:
                break
        sync()
        wins.append(n / (time.perf_counter() - t0))
    t_meas = time.perf_counter()
    val = float(out.detach().float())
    med = statistics.median(wins)
    q = statistics.quantiles(wins, n=4) if len(wins) >= 2 else [wins[0]] * 3
    r = dict(cfg)
    r.update(sps_median=round(med, 2), sps_windows=[round(w, 2) for w in wins], iqr_rel=round((q[2] - q[0]) / med, 4),
             data_wait_share=round(data_wait / (t_meas - t_warm), 3), warm_steps=nwarm,
             t_setup_s=round(t_build - T0, 2), t_warm_s=round(t_warm - t_build, 2), t_meas_s=round(t_meas - t_warm, 2),
             peak_alloc_mb=round(torch.cuda.max_memory_allocated(0) / 2**20) if dev.type == "cuda" else None,
             loss_or_sum=round(val, 4), finite=bool(val == val),
             gpu=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", torch=torch.__version__)
    return r


def run_one(text: str) -> int:
    _die_with_parent()
    cfg = dict(ONE_DEFAULTS)
    given = json.loads(text)
    unknown = sorted(set(given) - set(ONE_DEFAULTS))
    if unknown:
        print(f"--one: unknown key(s) {', '.join(unknown)}; known: {', '.join(ONE_DEFAULTS)}", file=sys.stderr)
        return 2
    cfg.update(given)
    if not cfg["data"] or not os.path.isdir(cfg["data"]):
        print(f"--one: data {cfg['data']!r} is not a folder (ImageFolder layout: DIR/<class>/<image>.jpg)",
              file=sys.stderr)
        return 2
    print("RESULT " + json.dumps(measure_one(cfg)), flush=True)
    import multiprocessing

    for worker in multiprocessing.active_children():  # the DataLoader's: they would linger seconds after us
        worker.kill()
    os._exit(0)  # CUDA's teardown is not part of any figure


# --- the driver ---------------------------------------------------------------------------------------------------

def describe(cfg: dict) -> str:
    """A config in words: "bs 64, 4 workers, pin, persistent, prefetch 2, cudnn.benchmark, fp16+GradScaler"."""
    c = {**ONE_DEFAULTS, **cfg}
    parts = [f"bs {c['bs']}", f"{c['workers']} workers"]
    if c["workers"]:
        parts += [p for p, on in (("pin", c["pin"]), ("persistent", c["persistent"])) if on]
        parts.append(f"prefetch {c['prefetch']}")
    elif c["pin"]:
        parts.append("pin")
    parts += [p for p, on in (("cudnn.benchmark", c["cudnn"]), ("channels_last", c["cl"])) if on]
    parts.append({"fp16": "fp16+GradScaler", "bf16": "bf16", "off": "fp32"}.get(c["amp"], str(c["amp"])))
    if c["compile"] not in ("none", None, 0):
        parts.append(f"compile {c['compile']}")
    if c["threads"]:
        parts.append(f"{c['threads']} threads")
    return ", ".join(parts)


def from_recommendation(path: str) -> tuple[dict, dict, dict]:
    """``(config, workload, environment)`` of autotune's exported YAML, in this script's keys: only what a user
    reads in the file (its ``config``, ``workload`` and ``environment`` sections)."""
    import yaml

    doc = yaml.safe_load(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        raise ValueError(f"{path}: no config section (export it with `autotune export -o FILE`)")
    c, w = doc["config"], doc.get("workload") or {}
    cfg = {"bs": int(c["batch_size"]), "workers": int(c.get("num_workers") or 0),
           "prefetch": int(c.get("prefetch_factor") or 2), "pin": int(bool(c.get("pin_memory"))),
           "persistent": int(bool(c.get("persistent_workers"))), "amp": c.get("amp") or "off",
           "cl": int(bool(c.get("channels_last"))), "cudnn": int(bool(c.get("cudnn_benchmark"))),
           "compile": c.get("compile_mode") or "none", "threads": int(c.get("intra_op_threads") or 0),
           "interop": int(c.get("inter_op_threads") or 0)}
    workload = {k: w[src] for k, src in (("model", "model"), ("task", "task"), ("res", "image_size"),
                                          ("classes", "num_classes")) if w.get(src) is not None}
    env = {str(k): str(v) for k, v in (doc.get("environment") or {}).items()}
    return cfg, workload, env


def plan(args) -> tuple[list[dict], list[str]]:
    """The configs to compare (each: name, what, cfg, env) and notes on what was left out."""
    notes: list[str] = []
    base = {"model": "resnet18", "task": "train", "res": 224, "classes": 1000, "data": str(Path(args.data).resolve()),
            "device": args.device, "window_s": args.seconds, "windows": args.windows, "warmup_s": args.warmup_s}
    entries = []
    if args.rec:
        try:
            cfg, workload, env = from_recommendation(args.rec)
            base.update(workload)
            entries.append({"name": "recommended", "cfg": cfg, "env": env})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"no recommendation measured: {exc}")
    else:
        notes.append("no recommendation measured: no --rec given")
    entries += [{"name": "pytorch_defaults", "cfg": dict(DEFAULTS), "env": {}},
                {"name": "seeds_recipe", "cfg": dict(SEEDS), "env": {}}]
    for e in entries:
        e["cfg"] = {**ONE_DEFAULTS, **base, **e["cfg"]}
        if args.image_size:
            e["cfg"]["res"] = args.image_size
        if args.batch_size:
            e["cfg"]["bs"] = args.batch_size
        if args.device == "cpu" and e["cfg"]["compile"] not in ("none", None, 0):
            notes.append(f"{e['name']}: compile {e['cfg']['compile']} kept on the CPU (needs a C++ compiler)")
        e["what"] = describe(e["cfg"]) + (f" + its environment ({len(e['env'])} variables)" if e["env"] else "")
    return entries, notes


def order(n: int, rounds: int) -> list[tuple[int, int]]:
    """``(round, index)`` pairs: round 0 runs 0..n-1, round 1 n-1..0, and so on."""
    return [(r, i) for r in range(rounds) for i in (range(n) if r % 2 == 0 else range(n - 1, -1, -1))]


def _child(entry: dict, timeout_s: float, log: Path) -> dict:
    """One config in a fresh process (its own process group, so a timeout also ends its DataLoader workers); its
    output goes to ``log``, read once it has exited (a pipe would wait for workers that outlive it)."""
    import signal

    env = {**os.environ, **entry["env"], "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, os.path.abspath(__file__), "--one", json.dumps(entry["cfg"])]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            p.wait(timeout=timeout_s)
            why = None
        except subprocess.TimeoutExpired:
            why = f"timed out after {timeout_s:.0f} s"
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever is left of it: the child, or workers it left
            except OSError:
                pass
            p.wait()
    wall = round(time.perf_counter() - t0, 1)
    text = log.read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith("RESULT ") and why is None:
            return {"ok": True, "wall_s": wall, **json.loads(line[len("RESULT "):])}
    last = next((ln for ln in reversed(text.splitlines()) if ln.strip()), f"exit code {p.returncode}")
    return {"ok": False, "why": why or last[:300], "wall_s": wall}


def table(entries: list[dict], results: dict, rounds: int) -> str:
    """One row per config: its samples/s in each round ("cut" where it did not run, "fail" where it failed), the
    median of its rounds, the ratio of that median to PyTorch's defaults', and the config in words."""
    heads = ["config"] + [f"round {r + 1}" for r in range(rounds)] + ["median", "vs defaults", "what"]
    medians = {}
    for e in entries:
        got = [results.get((r, e["name"])) for r in range(rounds)]
        ok = [g["sps_median"] for g in got if g and g.get("ok")]
        medians[e["name"]] = statistics.median(ok) if ok else None
    ref = medians.get("pytorch_defaults")
    rows = []
    for e in entries:
        cells = [e["name"]]
        for r in range(rounds):
            g = results.get((r, e["name"]))
            cells.append("cut" if g is None else f"{g['sps_median']:.1f}" if g.get("ok") else "fail")
        m = medians[e["name"]]
        cells += ["-" if m is None else f"{m:.1f}", "-" if m is None or not ref else f"x{m / ref:.2f}", e["what"]]
        rows.append(cells)
    widths = [max(len(str(x[i])) for x in [heads] + rows) for i in range(len(heads))]
    fmt = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(heads), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def drive(args) -> int:
    entries, notes = plan(args)
    runs = order(len(entries), args.rounds)
    out = Path(args.out) if args.out else None
    if args.dry_run:
        print(json.dumps({"configs": entries, "order": [[r + 1, entries[i]["name"]] for r, i in runs],
                          "notes": notes}, indent=1))
        return 0
    if not Path(args.data).is_dir():
        print(f"gpu_reference: --data {args.data!r} is not a folder", file=sys.stderr)
        return 2
    logs = (out or Path(os.environ.get("TMPDIR", "/tmp"))) / "reference-logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    results: dict = {}
    for r, i in runs:
        e = entries[i]
        left = deadline - time.monotonic()
        if left < args.min_child_s:
            notes.append(f"round {r + 1} {e['name']} and later: cut, {max(0.0, left):.0f} s left of --budget-s "
                         f"{args.budget_s:.0f} (a child needs at least {args.min_child_s:.0f})")
            break
        got = _child(e, min(args.child_timeout_s, left), logs / f"{e['name']}-round{r + 1}.log")
        results[(r, e["name"])] = got
        say = f"{got['sps_median']:.1f} samples/s (IQR {100 * got['iqr_rel']:.1f}%, data wait " \
              f"{100 * got['data_wait_share']:.0f}%, setup {got['t_setup_s']} s)" if got["ok"] else f"FAIL {got['why']}"
        print(f"round {r + 1} {e['name']}: {say}, {got['wall_s']} s wall", flush=True)
        if out:
            with open(out / "reference_results.jsonl", "a") as f:
                f.write(json.dumps({"round": r + 1, "name": e["name"], "env": e["env"], **got}) + "\n")
    text = table(entries, results, args.rounds)
    device = next((g.get("gpu") for g in results.values() if g.get("ok")), args.device)
    head = (f"samples/s of each config in a fresh process (median of {args.windows} windows of >= {args.seconds:g} s "
            f"after {args.warmup_s:g} s warm-up), rounds interleaved; device: {device}")
    report = "\n".join([head, text] + [f"note: {n}" for n in notes])
    print(report, flush=True)
    if out:
        (out / "reference_table.txt").write_text(report + "\n")
    return 0 if any(g.get("ok") for g in results.values()) else 1


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one", metavar="JSON", help="measure one config in this process (what each child runs)")
    p.add_argument("--data", help="an ImageFolder of JPEGs (benchmarks/make_jpegs.py makes one)")
    p.add_argument("--rec", help="autotune's exported recommendation (autotune export -o rec.yaml)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="default: %(default)s")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default: 2; 1 with --quick)")
    p.add_argument("--seconds", type=float, default=1.0, metavar="S",
                   help="the least length of a window (default: %(default)s)")
    p.add_argument("--windows", type=int, default=3, help="windows per child (default: %(default)s)")
    p.add_argument("--warmup-s", type=float, default=3.0, help="warm-up per child (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=None, help="override the crop size of every config")
    p.add_argument("--batch-size", type=int, default=None, help="override the batch size of every config")
    p.add_argument("--quick", action="store_true",
                   help="a tiny run to check the script: 32 px, batch 8, 2 windows of 0.3 s, 0.5 s warm-up, 1 round")
    p.add_argument("--budget-s", type=float, default=600.0,
                   help="wall-clock bound of the whole comparison (default: %(default)s)")
    p.add_argument("--child-timeout-s", type=float, default=120.0, help="each child's limit (default: %(default)s)")
    p.add_argument("--min-child-s", type=float, default=20.0,
                   help="a child is not started with less than this left of --budget-s (default: %(default)s)")
    p.add_argument("--out", help="a folder for the table, the raw results (JSON lines) and each child's log")
    p.add_argument("--dry-run", action="store_true", help="print the configs and their order, run nothing")
    args = p.parse_args(argv)
    if args.one is None and not args.data:
        p.error("--data DIR is required (or --one JSON)")
    if args.quick:
        args.image_size = args.image_size or 32
        args.batch_size = args.batch_size or 8
        args.seconds, args.windows, args.warmup_s = 0.3, 2, 0.5
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    for name in ("rounds", "windows"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.seconds <= 0 or args.budget_s <= 0:
        p.error("--seconds and --budget-s must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one is not None:
        return run_one(args.one)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
