"""The real CUDA path, where a GPU is: deselected by default, run with ``python -m pytest -m gpu`` (skipped, with
the reason, where torch sees no GPU). Nothing here is faked: real children on the GPU, the real allocator cap,
real autocast, GradScaler, cudnn.benchmark and torch.compile, a real study and a real local Ray.

Tiny workloads (32 px) keep the whole file to a few minutes on any GPU; the one OOM trial asks for a batch far
past a small device cap, so it runs out of memory in milliseconds whatever the GPU's size.
"""

from __future__ import annotations

import json

import pytest
import yaml

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial.runner import run_trial

from tests.helpers import TINY, run_cli

pytestmark = pytest.mark.gpu

SPEC = MeasureSpec(windows=2, window_s=0.3, timeout_s=300)


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
