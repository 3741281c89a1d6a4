"""User callables (``tests.workloads_fixtures:NAME``) for workload and runner tests.

Every model has at least one parameter, because the worker builds an SGD optimizer over them; the failure
models misbehave in ``forward`` so the failure happens inside a measured step.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import torch
from torch import nn
from torch.utils.data import TensorDataset

NOT_CALLABLE = 42


def _images(image_size: int, n: int = 256, num_classes: int = 10) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, image_size, image_size, generator=g)
    y = torch.randint(0, num_classes, (n,), generator=g)
    return TensorDataset(x, y)


def tiny(image_size: int = 32, task: str = "train"):
    """A tiny conv net on random images: the cheapest workload that still trains for real."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    return model, _images(image_size), nn.CrossEntropyLoss()


def tiny_dict(image_size: int, num_classes: int):
    """The dict form, using the num_classes it is offered."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))
    return {"model": model, "dataset": _images(image_size, n=16, num_classes=num_classes),
            "loss_fn": nn.CrossEntropyLoss()}


class _Misbehaving(nn.Module):
    """A linear classifier whose forward first does ``self.action()``."""

    def __init__(self, action) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)
        self.action = action

    def forward(self, x):
        self.action()
        return self.fc(x.mean(dim=(2, 3)))


def _misbehaving(action, image_size: int):
    return _Misbehaving(action), _images(image_size, n=64), nn.CrossEntropyLoss()


def _alloc() -> None:
    torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: the CPU allocator refuses it


def alloc_oom(image_size: int = 32):
    return _misbehaving(_alloc, image_size)


def hang(image_size: int = 32):
    return _misbehaving(lambda: time.sleep(3600), image_size)


def abort(image_size: int = 32):
    return _misbehaving(os.abort, image_size)


_HOARD: list = []
_HOG_SAFETY_MB = 8 * 1024  # if nobody kills us by then, stop growing (the test fails as a timeout, the box lives)


def _hog() -> None:
    while True:
        if len(_HOARD) * 200 < _HOG_SAFETY_MB:
            _HOARD.append(torch.ones(200 * 2**20 // 4))  # 200 MiB of float32, every page written
        else:
            time.sleep(0.5)


def memory_hog(image_size: int = 32):
    return _misbehaving(_hog, image_size)


class _NaN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        return self.fc(x.mean(dim=(2, 3))) * float("nan")


def nan_loss(image_size: int = 32):
    return _NaN(), _images(image_size, n=64), nn.CrossEntropyLoss()


def _boom() -> None:
    raise ValueError("boom")


def raises(image_size: int = 32):
    return _misbehaving(_boom, image_size)


def wrong_return(image_size: int = 32):
    return "not a tuple"


def not_a_module(image_size: int = 32):
    return (lambda x: x), _images(image_size, n=8), nn.CrossEntropyLoss()


def no_loss(image_size: int = 32):
    return tiny(image_size)[:2]


def empty_dataset(image_size: int = 32):
    return tiny(image_size)[0], TensorDataset(torch.empty(0, 3, image_size, image_size)), nn.CrossEntropyLoss()


def dict_without_dataset(image_size: int = 32):
    return {"model": tiny(image_size)[0]}


def _churn() -> None:
    # One 40 MiB buffer written and freed every step. glibc's defaults map any block over 32 MiB (the highest its
    # sliding mmap threshold goes) afresh and unmap it on free, so its 10,240 pages are faulted in every step;
    # retain serves it from the heap top it pads by 512 MiB and never trims. (Three 16 MiB buffers, tried first,
    # churned 1,400-8,200 faults a step depending on where the model's own allocations landed.)
    buf = torch.ones(10 << 20)
    del buf


def churn(image_size: int = 32):
    return _misbehaving(_churn, image_size)


def _churn_big() -> None:
    # One 768 MiB buffer written and freed every step. retain serves blocks from the heap top while it has room
    # (it pads the heap by 512 MiB), but a block over 32 MiB that does not fit there is mapped anew and handed
    # back every step, its 196,608 small pages faulted in again; hugepages faults it in 2 MiB pages instead.
    # (resnet18 at batch 64, 128 px: its 64 MiB first activation, 16,384 faults a step with retain, 32 with hugepages.)
    buf = torch.ones(192 << 20)
    del buf


def churn_big(image_size: int = 32):
    return _misbehaving(_churn_big, image_size)


def _spike(mib: int) -> None:
    """Map ``mib`` MiB with every page faulted in by the kernel (MAP_POPULATE), then unmap it at once.

    Here 300 MiB takes ~105 ms to fault in (the resident size climbing all the while) and ~20 ms to unmap, so the
    block is resident at more than 250 MiB for about 40 ms and at its full size for a few ms: shorter than a
    0.1 s memory sample, let alone the once-a-second PSS reading the parent used to report."""
    import mmap

    mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE).close()


class _SpikeOnce(nn.Module):
    """A linear classifier whose 5th forward maps, fills and frees a ``mib`` MiB block: one short spike."""

    def __init__(self, mib: int) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)
        self.mib = mib
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 5 and self.mib:
            _spike(self.mib)
        return self.fc(x.mean(dim=(2, 3)))


def spike_300mib(image_size: int = 32):
    return _SpikeOnce(300), _images(image_size, n=64), nn.CrossEntropyLoss()


def spike_none(image_size: int = 32):
    """``spike_300mib`` without the spike: the same process, to measure the spike against."""
    return _SpikeOnce(0), _images(image_size, n=64), nn.CrossEntropyLoss()


class _SlowFirst(nn.Module):
    """A linear classifier whose first forward sleeps 0.5 s: a start-up cost, as compiling is."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.5)
        return self.fc(x.mean(dim=(2, 3)))


def slow_first_step(image_size: int = 32):
    return _SlowFirst(), _images(image_size, n=64), nn.CrossEntropyLoss()


class VirtualClock:
    """A stand-in for ``time.perf_counter`` in in-process worker tests: it moves only when a fixture model below
    spends time (``spend``), so window rates are exactly what the model says, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spend(seconds: float) -> None:
    """Sleep, or move the virtual clock when a test installed one as ``time.perf_counter``."""
    clock = time.perf_counter
    if isinstance(clock, VirtualClock):
        clock.now += seconds
    else:
        time.sleep(seconds)


class _Timed(nn.Module):
    """A linear classifier whose forward spends ``cost(seconds since its first call)`` seconds."""

    def __init__(self, cost: Callable[[float], float]) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)
        self.cost = cost
        self.t0: float | None = None

    def forward(self, x):
        now = time.perf_counter()
        self.t0 = now if self.t0 is None else self.t0
        spend(self.cost(now - self.t0))
        return self.fc(x.mean(dim=(2, 3)))


def late_warm_up(image_size: int = 32):
    """Steps of 100 ms for 0.3 s after the first, then of 10 ms: a warm-up that outlasts the first step (an
    allocator, a cache, prefetched batches)."""
    return _Timed(lambda t: 0.1 if t < 0.3 else 0.01), _images(image_size, n=64), nn.CrossEntropyLoss()


class _Counted(_Timed):
    """``_Timed`` by calls: ``cost(calls so far)``, whatever the wall time of the steps (under load, the first
    step's one-time work can outlast a slow phase measured in seconds)."""

    def forward(self, x):
        self.t0 = (self.t0 or 0) + 1
        spend(self.cost(self.t0 - 1))
        return self.fc(x.mean(dim=(2, 3)))


def late_warm_up_by_steps(image_size: int = 32):
    """Steps of 100 ms for the first 4 calls (the warm-up's one step and about a 0.3 s window), then 10 ms: the
    warm-up that outlasts the first step, for a real child on a loaded machine."""
    return _Counted(lambda n: 0.1 if n < 4 else 0.01), _images(image_size, n=64), nn.CrossEntropyLoss()


def steady_steps(image_size: int = 32):
    """Steps of 50 ms from the first."""
    return _Timed(lambda t: 0.05), _images(image_size, n=64), nn.CrossEntropyLoss()


def slowing_down(image_size: int = 32):
    """Steps of 5 ms x 3 ** (seconds / 0.3): every 0.3 s window slower than the one before, none settles."""
    return _Timed(lambda t: 0.005 * 3 ** (t / 0.3)), _images(image_size, n=64), nn.CrossEntropyLoss()


class _BreaksUnderBF16(nn.Module):
    """The tiny conv net, but under bf16 autocast its logits get a large bias on one class (or become NaN), so
    the reduced-precision loss leaves fp32's: what a config with broken numerics looks like to a parity check."""

    def __init__(self, nan: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, 10)
        self.nan = nan

    def forward(self, x):
        out = self.fc(self.body(x))
        if out.dtype == torch.bfloat16:  # only autocast makes a Linear return bf16 here
            if self.nan:
                return out * float("nan")
            return out + torch.tensor([20.0] + [0.0] * 9, dtype=out.dtype)
        return out


def bf16_diverges(image_size: int = 32):
    torch.manual_seed(0)
    return _BreaksUnderBF16(nan=False), _images(image_size, n=64), nn.CrossEntropyLoss()


def bf16_nan(image_size: int = 32):
    torch.manual_seed(0)
    return _BreaksUnderBF16(nan=True), _images(image_size, n=64), nn.CrossEntropyLoss()


# --- the workload contract's optional parts (autotune.workloads.contract) -------------------------------------------

def _wide(optimizer):
    """A ~42 MB linear stack (10.5 M float32 parameters) on 32 px images: its optimizer state shows in the peak."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                          nn.Linear(2048, 10))
    return {"model": model, "dataset": _images(32, n=64), "loss_fn": nn.CrossEntropyLoss(), "optimizer": optimizer}


def wide_sgd(image_size: int = 32):
    """Plain SGD: no state beyond the gradients."""
    return _wide(lambda params: torch.optim.SGD(params, lr=0.01))


def wide_adamw(image_size: int = 32):
    """AdamW: two more copies of the weights (exp_avg, exp_avg_sq)."""
    return _wide(lambda params: torch.optim.AdamW(params, lr=1e-3))


def tiny_half_count(image_size: int = 32):
    """autotune's step, but the workload counts half of each batch as samples and 7 tokens per sample."""
    model, dataset, loss_fn = tiny(image_size)
    return {"model": model, "dataset": dataset, "loss_fn": loss_fn,
            "count": lambda batch: (len(batch[0]) // 2, 7 * (len(batch[0]) // 2))}


def _step_returning(value):
    def step(model, batch, optimizer, ctx):
        with ctx.autocast():
            loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        ctx.backward(loss)
        ctx.optimizer_step(optimizer)
        return value(loss)
    return step


def step_returns_none(image_size: int = 32):
    model, dataset, _ = tiny(image_size)
    return {"model": model, "dataset": dataset, "step": _step_returning(lambda loss: None)}


def step_returns_vector(image_size: int = 32):
    model, dataset, _ = tiny(image_size)
    return {"model": model, "dataset": dataset, "step": _step_returning(lambda loss: loss.expand(3))}


def count_too_many(image_size: int = 32):
    model, dataset, loss_fn = tiny(image_size)
    return {"model": model, "dataset": dataset, "loss_fn": loss_fn, "count": lambda batch: 2 * len(batch[0])}


def _no_optimizer(params):
    raise ValueError("lr must be positive")


def optimizer_raises(image_size: int = 32):
    model, dataset, loss_fn = tiny(image_size)
    return {"model": model, "dataset": dataset, "loss_fn": loss_fn, "optimizer": _no_optimizer}


def misspelt_part(image_size: int = 32):
    model, dataset, loss_fn = tiny(image_size)
    return {"model": model, "dataset": dataset, "loss_fn": loss_fn, "optimiser": _no_optimizer}


def step_not_callable(image_size: int = 32):
    model, dataset, loss_fn = tiny(image_size)
    return {"model": model, "dataset": dataset, "loss_fn": loss_fn, "step": "train"}


class _Stream(torch.utils.data.IterableDataset):
    """An endless-free stream of 40 random images (an IterableDataset has no length)."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for i in range(40):
            yield torch.randn(3, 32, 32, generator=g), i % 10


def iterable(image_size: int = 32):
    model, _, loss_fn = tiny(image_size)
    return {"model": model, "dataset": _Stream(), "loss_fn": loss_fn}


def iterable_with_sampler(image_size: int = 32):
    return {**iterable(image_size), "sampler": range(10)}


# --- a global batch: counting micro-batches, optimizer steps and zero_grad calls -----------------------------

class _CountingSGD(torch.optim.SGD):
    """SGD that counts its steps and zero_grad calls into ``counts``, and writes them as JSON to the file
    ``$AUTOTUNE_TEST_COUNTS`` (if set) after every step, where the parent of a trial's child reads them."""

    def __init__(self, params, counts: dict) -> None:
        super().__init__(params, lr=0.01)
        self.counts = counts

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.counts["zero_grads"] += 1
        super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        out = super().step(closure)
        self.counts["optimizer_steps"] += 1
        path = os.environ.get("AUTOTUNE_TEST_COUNTS")
        if path:
            import json

            with open(path, "w") as f:
                json.dump(self.counts, f)
        return out


def counted(image_size: int = 32):
    """tiny with autotune's own step, whose loss counts the micro-batches and whose optimizer counts its steps
    and zero_grad calls (``_CountingSGD``): a global batch must step once per ``accumulation_steps`` batches."""
    counts = {"micro_batches": 0, "optimizer_steps": 0, "zero_grads": 0}
    ce = nn.CrossEntropyLoss()

    def loss_fn(out, y):
        counts["micro_batches"] += 1
        return ce(out, y)

    model, data, _ = tiny(image_size)
    return {"model": model, "dataset": data, "loss_fn": loss_fn,
            "optimizer": lambda params: _CountingSGD(params, counts)}


class _LaunchCheck(nn.Module):
    """Fails its first forward unless the launch environment reached the process: an allocator preloaded
    (LD_PRELOAD, mapped into the process) and OpenMP's threads pinned (OMP_PROC_BIND: the main thread on one core)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)
        self.checked = False

    def forward(self, x):
        if not self.checked:
            import os
            from pathlib import Path

            preload = os.environ.get("LD_PRELOAD", "")
            if not preload or Path(preload).name not in Path("/proc/self/maps").read_text():
                raise RuntimeError(f"no preloaded allocator mapped (LD_PRELOAD={preload!r})")
            if not os.environ.get("OMP_PROC_BIND") or len(os.sched_getaffinity(0)) != 1:
                raise RuntimeError(f"threads not pinned: affinity {sorted(os.sched_getaffinity(0))}")
            self.checked = True
        return self.fc(x.mean(dim=(2, 3)))


def launch_check(image_size: int = 32):
    return _LaunchCheck(), _images(image_size, n=64), nn.CrossEntropyLoss()


# --- workloads that cannot build: broken for every config, so the first trial ends the run -----------------

def broken_build(image_size: int = 32):
    """Raises when called, as a workload whose data or model cannot be made does."""
    raise RuntimeError("cannot open /data/shards: no such file")


def breaks_after_the_check(image_size: int = 32):
    """Builds once (the check child's build, which writes the file ``AUTOTUNE_TEST_BUILT`` names), then raises as
    ``broken_build`` does: data that went away between the check and the first trial (an unmounted share)."""
    import os

    flag = os.environ["AUTOTUNE_TEST_BUILT"]
    if os.path.exists(flag):
        broken_build()
    open(flag, "w").close()
    return tiny(image_size)


# --- a descendant that leaves the trial's process group (autotune.machine.proctree) -------------------------------

_DAEMON = """
import os, sys, time
if os.fork():
    os._exit(0)  # the intermediate exits at once: its child is an orphan from the start
os.setsid()      # and leaves the trial's session and process group
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(3600)
"""


def _start_daemon() -> None:
    """Start a double-forked grandchild that calls ``os.setsid()`` and sleeps; its pid goes to the file
    ``$AUTOTUNE_TEST_PIDFILE``. Returns once it is up."""
    import subprocess
    import sys

    path = os.environ["AUTOTUNE_TEST_PIDFILE"]
    subprocess.run([sys.executable, "-c", _DAEMON, path], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # longer than a memory sample: the parent has seen it, as it sees a long-lived helper


def setsid_grandchild(image_size: int = 32):
    """The tiny workload, whose build starts a setsid'd, double-forked grandchild (a data server, a daemon)."""
    _start_daemon()
    return tiny(image_size)


def setsid_grandchild_then_abort(image_size: int = 32):
    """The same, and then the trial dies abruptly (SIGABRT) in its first step, with no chance to clean up."""
    _start_daemon()
    return _misbehaving(os.abort, image_size)


def chatty(image_size: int = 32):
    """The tiny workload, after printing 8 MiB (100,000 numbered lines of 84 bytes) while it builds."""
    import sys

    for i in range(100_000):
        sys.stdout.write(f"chatty line {i:06d} " + "x" * 64 + "\n")
    sys.stdout.flush()
    return tiny(image_size)



class _Hangs(nn.Module):
    """``inner``, but its forward never returns (an hour's sleep): a trial that runs until it is killed."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        time.sleep(3600)
        return self.inner(x)


def tiny_on_test_nodes(image_size: int = 16):
    """``tiny``, as tests/search/backends/test_ray_nodes.py needs it on each of its two Ray nodes (from the node's
    environment). ``$AUTOTUNE_TEST_RUNS_DIR``: the node's folder, where each trial process leaves its pid.
    ``$AUTOTUNE_TEST_HANG_LATER``: every run but the node's first hangs in its first step, so the test can kill
    the node under a running trial. ``$AUTOTUNE_TEST_FIRST_WAITS_FOR`` (another node's folder): the node's
    first run starts only once that node has started its second (at most 2 minutes), so the other node, the
    only free one meanwhile, is sure to get a second trial."""
    model, dataset, loss_fn = tiny(image_size)
    folder = os.environ.get("AUTOTUNE_TEST_RUNS_DIR")
    if not folder:
        return model, dataset, loss_fn
    earlier = [f for f in os.listdir(folder) if f != str(os.getpid())]
    open(os.path.join(folder, str(os.getpid())), "w").close()
    other = os.environ.get("AUTOTUNE_TEST_FIRST_WAITS_FOR")
    if other and not earlier:
        deadline = time.monotonic() + 120
        while len(os.listdir(other)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    if earlier and os.environ.get("AUTOTUNE_TEST_HANG_LATER"):
        model = _Hangs(model)
    return model, dataset, loss_fn


class _ThreadsProbe(nn.Module):
    """Writes, at its first forward, the process's torch thread count and what its environment says of threads and
    the allocator to the file ``$AUTOTUNE_TEST_PROBE`` names (one line per process): what a trial really ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
        self.said = False

    def forward(self, x):
        if not self.said and os.environ.get("AUTOTUNE_TEST_PROBE"):
            self.said = True
            import json

            seen = {"threads": torch.get_num_threads(), "pid": os.getpid(),
                    "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MALLOC_ARENA_MAX", "LD_PRELOAD")}}
            with open(os.environ["AUTOTUNE_TEST_PROBE"], "a") as f:
                f.write(json.dumps(seen) + "\n")
        return self.net(x)


def threads_probe(image_size: int = 16):
    """The tiny workload, its model saying what each trial's process ran with (``_ThreadsProbe``)."""
    torch.manual_seed(0)
    return _ThreadsProbe(), _images(image_size, n=64), nn.CrossEntropyLoss()


class _HangInWorkers(torch.utils.data.Dataset):
    """Images whose every item, fetched in a DataLoader worker, writes the worker's pid to ``$AUTOTUNE_TEST_MARKS``
    and hangs (a user's ``__getitem__`` stuck on a network read: the worker never gets back to torch's own check of
    its parent); in the main process (a probe) an item is an item."""

    def __init__(self, image_size: int) -> None:
        self.images = _images(image_size, n=64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            marks = os.environ.get("AUTOTUNE_TEST_MARKS")
            if marks:
                open(os.path.join(marks, str(os.getpid())), "w").close()
            time.sleep(3600)
        return self.images[i]


def _hang_in_workers(method: str, image_size: int):
    # the start method the trial's DataLoader takes by default (torch.multiprocessing's): Python 3.14 makes it
    # forkserver on Linux; a user may set spawn
    import multiprocessing

    multiprocessing.set_start_method(method, force=True)
    return tiny(image_size)[0], _HangInWorkers(image_size), nn.CrossEntropyLoss()


def hang_in_spawn_workers(image_size: int = 32):
    return _hang_in_workers("spawn", image_size)


def hang_in_forkserver_workers(image_size: int = 32):
    return _hang_in_workers("forkserver", image_size)
