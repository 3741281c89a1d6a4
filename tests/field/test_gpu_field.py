"""On a GPU (``gpu``-marked: skipped, saying why, where torch sees none): the field run finds the loop's CUDA device
in NVML and its windows carry the GPU's SM clock, NVML's slow-down reasons, memory and temperature."""

from __future__ import annotations

import time

import pytest
import torch

from autotune.config import TrialConfig
from autotune.field import FieldRun, FieldSpec
from autotune.field.host import SLOWDOWNS, DeviceSampler
from tests.helpers import make_rec

pytestmark = pytest.mark.gpu


def test_the_device_sampler_reads_the_cuda_devices_gpu():
    torch.cuda.init()
    s = DeviceSampler.of_cuda(torch.cuda.current_device()).sample()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**20
    assert s["gpu_mem_total_mb"] == pytest.approx(total, rel=0.02), s  # the same device torch sees
    assert 0 < s["gpu_sm_mhz"] <= s["gpu_sm_max_mhz"] and 0 < s["gpu_temp_c"] < 120, s
    assert set(s["gpu_slowdown"]) <= {name for _, name in SLOWDOWNS}, s


def test_a_loop_on_the_gpu_has_its_windows_carry_nvmls_figures():
    lines: list[str] = []
    rec = make_rec(config=TrialConfig(batch_size=64), storage="")
    run = FieldRun(rec.field_claim(), spec=FieldSpec(window_s=0.1, host_every_s=0.02, keep_every_s=60.0),
                   log=lines.append).start()
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t_end = time.monotonic() + 3.0
    while time.monotonic() < t_end:
        x = torch.randn(64, 512, device="cuda")
        run.batch(x)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
    run.stop(log=False)
    assert run.off is None and not any("GPU figures off" in x for x in lines), lines
    carried = [w.host for w in run.train.closed if "gpu_sm_mhz" in w.host]
    assert carried and all(h["gpu_sm_mhz"] > 0 and h["gpu_mem_used_mb"] > 0 for h in carried), run.train.closed
