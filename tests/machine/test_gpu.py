"""The real CUDA path, where a GPU is: deselected by default, run with ``python -m pytest -m gpu`` (skipped, with
the reason, where torch sees no GPU). Nothing here is faked: real children on the GPU, the real allocator cap,
real autocast, GradScaler, cudnn.benchmark and torch.compile, a real study and a real local Ray.

Tiny workloads (32 px) keep the whole file to a few minutes on any GPU; the one OOM trial asks for a batch far
past a small device cap, so it runs out of memory in milliseconds whatever the GPU's size. Issue 35's tests (at the
end; benchmarks/gpu_host.sh runs them first) measure the two ceilings and fork-served CUDA trials, and time one eager
resnet18 trial at 224 px, the trial the tuner runs most.
"""

from __future__ import annotations

import json

import pytest
import yaml

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial.forkserver import ForkedChild, ForkServers
from autotune.trial.runner import run_trial

from tests.helpers import TINY, run_cli

pytestmark = pytest.mark.gpu

SPEC = MeasureSpec(windows=2, window_s=0.3, timeout_s=300)
HEAVY = "tests.heavy_data_workloads:build"  # a tiny convnet over JPEGs decoded by PIL: the data path binds


def _cc_major() -> int:
    import torch

    return torch.cuda.get_device_capability(0)[0]


def _wl(device: str, model: str = TINY, size: int = 32) -> Workload:
    return Workload(model=model, image_size=size, num_classes=10, device=device)


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_fp16_grad_scaler_channels_last_and_cudnn_benchmark_on_cuda(device, tmp_path):
    config = TrialConfig(batch_size=32, amp="fp16", channels_last=True, cudnn_benchmark=True, pin_memory=True,
                         num_workers=1)
    r = run_trial(_wl(device), config, SPEC.replace(device_memory_cap_mb=2048.0), log_path=tmp_path / "log")
    assert r.status == "ok", (r.reason, (tmp_path / "log").read_text()[-3000:])
    assert r.median_samples_per_s > 0 and r.final_loss is not None
    assert 0 < r.peak_device_allocated_mb <= r.peak_device_mb <= 2048.0
    assert r.device_memory_cap_mb == 2048.0


def test_a_cuda_trial_fits_the_minimum_host_cap(tmp_path):
    """MIN_CUDA_MEMORY_CAP_MB was estimated without a GPU: a small trial with its CUDA context, the CUDA
    libraries' pages and pinned batches must fit under it (the figure goes to docs/gpu.md)."""
    from autotune.machine.limits import MIN_CUDA_MEMORY_CAP_MB

    r = run_trial(_wl("cuda"), TrialConfig(batch_size=32, pin_memory=True, num_workers=1), SPEC,
                  log_path=tmp_path / "log")
    assert r.status == "ok", r.reason
    print(f"host peak of a tiny CUDA trial: {r.peak_host_mb:.0f} MiB (RSS sum {r.peak_host_rss_mb:.0f} MiB)")
    assert r.peak_host_mb < MIN_CUDA_MEMORY_CAP_MB


def test_bf16_with_torch_compile(tmp_path):
    if _cc_major() < 8:
        pytest.skip("bf16 needs compute capability 8.0 or newer")
    config = TrialConfig(batch_size=32, amp="bf16", compile_mode="default", cudnn_benchmark=True)
    r = run_trial(_wl("cuda"), config, SPEC, log_path=tmp_path / "log")
    assert r.status == "ok", (r.reason, (tmp_path / "log").read_text()[-3000:])
    assert r.compile_s and r.compile_s > 0


def test_a_batch_past_the_device_cap_is_oom_and_the_next_trial_starts_clean(tmp_path):
    # resnet18 at 128 px, 512 images: far more than 300 MiB of activations, so the allocator's cap stops it
    big = run_trial(_wl("cuda", "resnet18", 128), TrialConfig(batch_size=512), SPEC.replace(device_memory_cap_mb=300.0),
                    log_path=tmp_path / "big.log")
    assert big.status == "oom", (big.reason, (tmp_path / "big.log").read_text()[-3000:])
    assert "out of memory" in big.reason.lower()
    small = run_trial(_wl("cuda"), TrialConfig(batch_size=8), SPEC.replace(device_memory_cap_mb=300.0))
    assert small.status == "ok" and small.peak_device_mb < 300.0  # a fresh process: nothing left of the last one


def test_the_device_cap_binds_during_the_trial_not_after(tmp_path):
    """The same config runs without a cap and fails under a cap below its need: the cap is enforced while the
    trial runs (an allocation past it raises), not judged from the peak afterwards."""
    wl, config = _wl("cuda", "resnet18", 64), TrialConfig(batch_size=128)
    free = run_trial(wl, config, SPEC, log_path=tmp_path / "free.log")
    assert free.status == "ok", free.reason
    need = free.peak_device_allocated_mb
    capped = run_trial(wl, config, SPEC.replace(device_memory_cap_mb=max(256.0, need / 2)))
    assert capped.status == "oom", capped.reason
    roomy = run_trial(wl, config, SPEC.replace(device_memory_cap_mb=need * 1.5 + 256.0))
    assert roomy.status == "ok" and roomy.peak_device_mb <= need * 1.5 + 256.0


def test_a_short_run_with_finalists_and_the_numerics_check(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "name": "gpu-smoke", "device": "cuda",
        "parameters": {"batch_size": {"type": "int", "choices": [16, 32]},
                       "amp": {"type": "categorical", "choices": ["off", "fp16"]},
                       "channels_last": {"type": "bool"}},
        "baseline": {"batch_size": 16, "amp": "off", "channels_last": False}}))
    storage = f"sqlite:///{tmp_path}/gpu.db"
    out = run_cli("run", "--model", TINY, "--image-size", "32", "--device", "cuda", "--space", str(space),
                  "--storage", storage, "--trials", "4", "--finalists", "2", "--rounds", "1", "--parity-steps", "8",
                  "--windows", "2", "--window-seconds", "0.3", "--no-progress", "--no-warm-start", timeout=900,
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "recommended:" in out.stdout
    exported = tmp_path / "best.yaml"
    ex = run_cli("export", "--storage", storage, "-o", str(exported), cwd=tmp_path)
    assert ex.returncode == 0, ex.stderr[-2000:]
    doc = yaml.safe_load(exported.read_text())
    measured = doc["measured"]
    assert measured["device_memory_cap_mb"] > 0 and measured["peak_device_allocated_mb"] > 0
    if doc["config"]["amp"] != "off" or doc["config"]["channels_last"]:
        assert doc.get("parity") and doc["parity"]["steps"] == 8  # a numerics knob won: it was checked


def test_recommend_then_apply_trains_on_the_gpu(tmp_path):
    import torch

    from autotune import recommend
    from tests.workloads_fixtures import tiny

    rec = recommend(TINY, image_size=32, device="cuda", trials=2, budget=None, storage=f"sqlite:///{tmp_path}/r.db",
                    measure=SPEC, progress=False)
    model, data, loss_fn = tiny(32)
    loader = torch.utils.data.DataLoader(data, **rec.dataloader_kwargs())
    with rec.apply() as run:
        model = run.prepare_model(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = run.grad_scaler()
        for i, (x, y) in enumerate(loader):
            x, y = run.prepare_input(x), run.prepare_input(y)
            with run.autocast():
                loss = loss_fn(model(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad()
            if i == 5:
                break
    assert next(model.parameters()).is_cuda and torch.isfinite(loss)


def test_ray_runs_a_gpu_trial_on_one_gpu(tmp_path):
    pytest.importorskip("ray.tune")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"name": "ray-gpu", "device": "cuda",
                                     "parameters": {"batch_size": {"type": "int", "choices": [16, 32]}},
                                     "baseline": {"batch_size": 16}}))
    storage = f"sqlite:///{tmp_path}/ray.db"
    out = run_cli("run", "--backend", "ray", "--model", TINY, "--image-size", "32", "--device", "cuda:0",
                  "--space", str(space), "--storage", storage, "--trials", "2", "--finalists", "1", "--rounds", "1",
                  "--windows", "2", "--window-seconds", "0.3", "--no-progress", "--no-warm-start", timeout=900,
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    import optuna

    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    ok = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert ok, json.dumps([t.user_attrs.get("reason") for t in study.trials])
    assert all(t.user_attrs.get("peak_device_allocated_mb") for t in ok)


def test_inference_step_latency_is_synchronised_and_kept_on_cuda(tmp_path):
    """trial/latency.py on a GPU: each inference step is timed to the device's synchronize, so p99 >= p50 >= the
    floor and all are real milliseconds, not the launch time of asynchronous kernels."""
    wl = Workload(model=TINY, image_size=32, num_classes=10, device="cuda", task="infer")
    r = run_trial(wl, TrialConfig(batch_size=32), SPEC, log_path=tmp_path / "log")
    assert r.status == "ok", (r.reason, (tmp_path / "log").read_text()[-3000:])
    assert 0 < r.latency_min_ms <= r.latency_p50_ms <= r.latency_p99_ms, r


def test_two_nccl_ranks_run_one_trial_one_gpu_each(tmp_path):
    """trial/ddp.py on CUDA: NCCL, torch.cuda.set_device(rank), init_process_group(device_id=...), DDP on GPU r."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"{torch.cuda.device_count()} GPU(s) visible: two NCCL ranks need two")
    wl = Workload(model=TINY, image_size=32, num_classes=10, device="cuda", nproc_per_node=2)
    r = run_trial(wl, TrialConfig(batch_size=16), SPEC, log_path=tmp_path / "log")
    assert r.status == "ok", (r.reason, (tmp_path / "log").read_text()[-3000:])
    assert r.world_size == 2 and len(r.ranks) == 2 and all(x["peak_device_mb"] for x in r.ranks), r.ranks


# --- issue 35: the two ceilings and fork-served CUDA trials (benchmarks/gpu_host.sh runs these first; each prints
# one "issue35:" line, which its summary collects) ---------------------------------------------------------------------

def test_the_data_path_ceiling_with_pinned_memory_on_cuda(tmp_path):
    """The data path alone on a GPU (MeasureSpec.part="data", autotune.trial.parts): the workload's DataLoader with
    two persistent workers and pinned memory, each batch copied to the device non_blocking, no model."""
    config = TrialConfig(batch_size=16, num_workers=2, pin_memory=True, persistent_workers=True)
    r = run_trial(_wl("cuda", HEAVY), config, SPEC.replace(part="data"), log_path=tmp_path / "log")
    assert r.status == "ok", (r.reason, (tmp_path / "log").read_text()[-3000:])
    assert r.median_samples_per_s > 0
    assert r.cpu_cores_used is not None and r.cpu_cores_used > 0  # the workers' decoding, counted
    assert r.data_wait_share > 0.5  # its step only copies the batch: nearly all of it is the loader
    print(f"issue35: data-path ceiling (2 workers, pinned, non_blocking copy) {r.median_samples_per_s:.0f} "
          f"samples/s, {r.cpu_cores_used:.2f} cores busy")


def test_the_model_ceiling_on_cuda_outruns_the_full_trial_at_zero_workers(tmp_path):
    """The model alone on one batch already on the device (part="model") never waits for data, and runs faster
    than the full trial of the same config, which decodes every JPEG in the training loop (0 workers)."""
    wl, config = _wl("cuda", HEAVY), TrialConfig(batch_size=16)
    model = run_trial(wl, config, SPEC.replace(part="model"), log_path=tmp_path / "model.log")
    full = run_trial(wl, config, SPEC, log_path=tmp_path / "full.log")
    assert model.status == "ok", (model.reason, (tmp_path / "model.log").read_text()[-3000:])
    assert full.status == "ok", (full.reason, (tmp_path / "full.log").read_text()[-3000:])
    assert model.data_wait_share < 0.2
    assert full.data_wait_share > 0.5  # the full trial is bound by its data path, as the H200 run's were
    assert model.median_samples_per_s > full.median_samples_per_s
    print(f"issue35: model ceiling {model.median_samples_per_s:.0f} samples/s (data wait "
          f"{100 * model.data_wait_share:.0f}%) vs the full trial at 0 workers {full.median_samples_per_s:.0f} "
          f"(data wait {100 * full.data_wait_share:.0f}%)")


class _Recording(ForkServers):
    """Fork servers that keep what each launch returned: a ``ForkedChild`` (the trial was forked) or None (it took
    the cold path: no server, a server that failed to start, or one that found CUDA initialised and quit)."""

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[ForkedChild | None] = []

    def launch(self, *args, **kwargs):
        child = super().launch(*args, **kwargs)
        self.launched.append(child)
        return child


def test_a_second_cuda_trial_is_forked_by_the_fork_server(tmp_path):
    """Two CUDA trials in a row through one pool: both are forked by the same server, which is still alive after
    the second (it never initialised CUDA; each child made its own context), and the second pays no torch import."""
    config = TrialConfig(batch_size=32, pin_memory=True, num_workers=1)
    with _Recording() as servers:
        first = run_trial(_wl("cuda"), config, SPEC, log_path=tmp_path / "1.log", servers=servers)
        server = servers.pids()
        second = run_trial(_wl("cuda"), config, SPEC, log_path=tmp_path / "2.log", servers=servers)
        assert servers.pids() == server and len(server) == 1, (server, servers.pids())
    assert first.status == "ok", (first.reason, (tmp_path / "1.log").read_text()[-3000:])
    assert second.status == "ok", (second.reason, (tmp_path / "2.log").read_text()[-3000:])
    assert len(servers.launched) == 2 and all(isinstance(c, ForkedChild) for c in servers.launched), servers.launched
    assert {c.server_pid for c in servers.launched} == set(server)
    print(f"issue35: fork-served CUDA trials: wall {first.wall_s:.1f} s then {second.wall_s:.1f} s; start-up "
          f"{first.startup_s:.1f} s (the server's torch import included) then {second.startup_s:.1f} s")


def test_an_eager_resnet18_trial_through_the_fork_server_wall_time(tmp_path):
    """Issue 35's goal for a GPU trial: an eager resnet18 trial (224 px, batch 64, 2 workers, pinned memory) with
    the GPU's default windows (1 s, stopping once three agree within 2%) under 8 s wall on an H200 host (24-30 s
    on 2026-11-26). Its server is started first by a tiny trial, as a tuner's first trial starts it, and the
    workload is checked once in this process, as `autotune run` checks it. Asserted: < 30 s; the figure is printed."""
    from autotune.cli.args import GPU_WINDOW_S, TIGHT_SPREAD
    from autotune.workloads.build import check

    spec = MeasureSpec(window_s=GPU_WINDOW_S, tight_spread=TIGHT_SPREAD, timeout_s=120)
    wl = check(Workload(model="resnet18", image_size=224, device="cuda"))
    config = TrialConfig(batch_size=64, num_workers=2, pin_memory=True)
    with ForkServers() as servers:
        warm = run_trial(_wl("cuda"), TrialConfig(batch_size=8), SPEC, servers=servers)
        r = run_trial(wl, config, spec, log_path=tmp_path / "log", servers=servers)
    assert warm.status == "ok", warm.reason
    assert r.status == "ok", (r.reason, (tmp_path / "log").read_text()[-3000:])
    print(f"issue35: eager resnet18 trial (224 px, bs 64, 2 workers, pinned, {len(r.samples_per_s)} windows of "
          f">= {GPU_WINDOW_S:g} s) wall {r.wall_s:.1f} s (goal < 8 s on an H200 host), start-up {r.startup_s:.1f} s, "
          f"warm-up {r.warmup_s:.1f} s, {r.median_samples_per_s:.0f} samples/s; the server's first trial "
          f"{warm.wall_s:.1f} s")
    assert r.wall_s < 30


def test_pinned_memory_is_not_charged_to_the_locked_memory_limit():
    """machine.loader_memory reads RLIMIT_MEMLOCK but does not hold pinned batches to it: CUDA's pinned pages
    (cudaHostAlloc, what pin_memory uses) are pinned by the driver, which does not charge them to the limit (containers
    with the default 64 KiB to 8 MiB pin gigabytes). Checked here: 256 MiB pinned under a 1 MiB limit. Should this
    fail, pinned batches must be held to the limit too (LoaderLimits.problems)."""
    import subprocess
    import sys

    code = ("import resource, torch\n"
            "resource.setrlimit(resource.RLIMIT_MEMLOCK, (2**20, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))\n"
            "t = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()\n"
            "print(t.is_pinned(), resource.getrlimit(resource.RLIMIT_MEMLOCK)[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["True", str(2**20)], out.stderr[-2000:]


def test_pinned_batches_stay_within_the_counted_bound():
    """Issue 52 item 10: a pin_memory loader (2 workers x prefetch 2) whose loop pauses holding one batch, its queue
    filling; CUDA's host allocator rounds each block up to a power of two and caches it. Its pool's peak
    (``host_memory_stats``) must lie within what ``loader_memory.pinned_bytes`` counts, and be whole 8 MiB blocks
    (the rounding is real: a 7.3 MiB batch of images pins an 8 MiB block; the labels' blocks are bytes). The loop
    holds one batch, as a training loop does: a test that kept five in hand held more than any loader rule counts."""
    import time

    import torch

    from autotune.machine.loader_memory import pinned_bytes

    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        pytest.skip("this torch keeps no host allocator statistics (torch.cuda.host_memory_stats)")
    data = torch.utils.data.TensorDataset(torch.zeros(160, 3, 200, 200), torch.zeros(160, dtype=torch.long))
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=2, prefetch_factor=2, pin_memory=True)
    batch = 16 * 3 * 200 * 200 * 4 + 16 * 8
    it = iter(loader)
    held = next(it)
    time.sleep(3)  # the loop pauses: the workers and the pin thread fill the queue
    s = stats()
    peak = s.get("reserved_bytes.all.peak") or s.get("reserved_bytes.peak") or s.get("allocated_bytes.peak")
    blocks = round((peak or 0) / 2**23)
    print(f"issue52: pinned pool peak {(peak or 0) / 2**20:.1f} MiB ({blocks} blocks of 8 MiB) for batches of "
          f"{batch / 2**20:.1f} MiB (counted {pinned_bytes(batch, 2, 2) / 2**20:.1f} MiB)")
    assert peak is not None and blocks >= 1 and abs(peak - blocks * 2**23) < 2**20, s  # whole 8 MiB blocks
    assert peak <= pinned_bytes(batch, 2, 2), s
    del held


_NCCL_RANK = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)
x = torch.ones(64 * 2**20 // 4, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
if rank == 0:
    st = os.statvfs("/dev/shm")
    print("USED", (st.f_blocks - st.f_bavail) * st.f_frsize, flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_nccl_shared_memory_of_two_ranks_is_measured(tmp_path):
    """Issue 52 item 10: DDP without P2P (NCCL_P2P_DISABLE=1) moves tensors through NCCL's segments in /dev/shm,
    which the loader rule does not count (``machine.loader_memory``: outside the rule; only ``MARGIN`` is left for
    them). Measured here: /dev/shm used while two ranks all-reduce 64 MiB, printed for docs/loader-memory.md (not yet
    run: no two GPUs were lent to this work, and NCCL refuses two ranks on one GPU, so the one-H200 machine this
    project is lent skips it too). The assertion is the rule's premise: NCCL's transport uses /dev/shm."""
    import os
    import subprocess
    import sys

    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("two GPUs are needed for two NCCL ranks on one host")
    script = tmp_path / "rank.py"
    script.write_text(_NCCL_RANK)
    st = os.statvfs("/dev/shm")
    before = (st.f_blocks - st.f_bavail) * st.f_frsize
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(script)],
                         env={**os.environ, "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    used = int(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("USED"))) - before
    print(f"issue52: NCCL's /dev/shm for 2 ranks without P2P: {used / 2**20:.1f} MiB")
    assert used > 0
