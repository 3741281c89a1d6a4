"""Hardware detection on this machine, and the cgroup readers against fake cgroup trees."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from autotune.machine import hardware
from autotune.machine.hardware import cgroup_cpu_quota, cgroup_memory_limit_mb, detect


@pytest.fixture(scope="module")
def hw():
    return detect()


def test_detect_this_machine(hw):
    assert hw.usable_cores >= 1
    assert hw.usable_cores <= hw.logical_cores
    assert hw.affinity_cores == len(os.sched_getaffinity(0))
    assert hw.ram_total_mb > 0
    assert 0 <= hw.ram_available_mb <= hw.ram_total_mb
    assert hw.cpu_model
    import torch

    assert hw.torch == torch.__version__


def test_fingerprint_is_short_hex_and_stable(hw):
    assert re.fullmatch(r"[0-9a-f]{10}", hw.fingerprint)
    assert detect().fingerprint == hw.fingerprint
    assert detect(with_torch=False).fingerprint == hw.fingerprint


def test_fingerprint_ignores_software_but_not_hardware(hw):
    assert dataclasses.replace(hw, torch="0.0.1", python="3.0", os="Other 1.0").fingerprint == hw.fingerprint
    assert dataclasses.replace(hw, usable_cores=hw.usable_cores + 1).fingerprint != hw.fingerprint
    assert dataclasses.replace(hw, ram_total_mb=hw.ram_total_mb + 8192).fingerprint != hw.fingerprint


def test_describe_and_to_dict(hw):
    text = hw.describe()
    assert "fingerprint" in text and hw.fingerprint in text
    assert "gpu" in text
    assert "cores" in text and "memory" in text
    d = json.loads(json.dumps(hw.to_dict()))
    assert d["fingerprint"] == hw.fingerprint
    assert d["usable_cores"] == hw.usable_cores
    assert f"{hw.usable_cores} usable cores" in hw.summary_line()


def test_the_loaders_limits_are_part_of_the_snapshot_not_of_the_fingerprint(hw):
    """`autotune env` says the shared memory, the open-file and locked-memory limits (machine.loader_memory); a
    container with more /dev/shm is the same hardware (its study is found again)."""
    lines = {line.split("  ")[0]: line for line in hw.describe().splitlines()}
    assert {"shared memory", "open files", "locked memory"} <= set(lines)
    assert lines["open files"].split()[2] == (str(hw.loader_limits.nofile_soft) if hw.loader_limits.nofile_soft
                                              else "unlimited")
    assert "sharing strategy file_descriptor" in lines["open files"] or "file_system" in lines["open files"]
    more = dataclasses.replace(hw, loader_memory={**hw.loader_memory, "shm_free_bytes": 2**40})
    assert more.fingerprint == hw.fingerprint
    assert type(hw).from_dict(hw.to_dict()).loader_limits == hw.loader_limits


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                        ("always madvise [never]\n", "never"), ("garbage", None)])
def test_thp_mode_read_from_sysfs(tmp_path, text, mode):
    from autotune.machine.malloc import thp_mode

    f = tmp_path / "enabled"
    f.write_text(text)
    assert thp_mode(f) == mode
    assert thp_mode(tmp_path / "missing") is None


def test_detect_reports_the_kernels_thp_mode(hw):
    from autotune.machine.malloc import thp_mode

    assert hw.thp == thp_mode()
    assert f"transparent huge pages {hw.thp or 'unknown'}" in hw.describe()
    assert dataclasses.replace(hw, thp="never").fingerprint == hw.fingerprint  # a setting, not the hardware


# a module:callable's check child is the same child (slow: every CLI run test goes through it, 7 s here)
@pytest.mark.parametrize("model", [pytest.param("tests.study_fixtures:sleepy", marks=pytest.mark.slow),
                                   "transformer_tiny"])
def test_a_run_parent_knows_torchs_facts_without_importing_torch(hw, model):
    """`autotune run`'s parent checks the workload in a child (a module:callable always, a built-in one where the
    parent has no torch), which answers what detect() needs of torch and the collect_env stamp: the parent reads
    the versions from torch's version.py and never imports torch (3-9 s of CPU), nor starts a second child."""
    import subprocess
    import sys

    from autotune.config import Workload
    from autotune.machine.envstamp import collect_env_stamp
    from autotune.workloads.build import probe_builtin

    code = ("import json, subprocess, sys\nfrom autotune.config import Workload\n"
            "from autotune.workloads.build import check\nfrom autotune.machine.hardware import detect\n"
            f"w = check(Workload(model={model!r}, image_size=16), env_stamp=True)\n"
            "hw = detect()\nfrom autotune.provenance import versions_of\nv = versions_of(hw)\n"
            "from autotune.machine.envstamp import collect_env_stamp\n"
            "subprocess.run = subprocess.Popen = None  # the stamp comes without a child\nstamp = collect_env_stamp()\n"
            "print(json.dumps(['torch' in sys.modules, hw.torch, hw.cuda, hw.torch_cpu_capability, hw.cudnn,"
            " hw.torchvision, v['torch'], v['cuda'], stamp.get('torch_version'), stamp.get('gcc_version'), w.data]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    imported, *facts, stamp_torch, stamp_gcc, data = json.loads(out.stdout.strip().splitlines()[-1])
    assert not imported
    assert facts == [hw.torch, hw.cuda, hw.torch_cpu_capability, hw.cudnn, hw.torchvision, hw.torch, hw.cuda]
    assert hw.torch_cpu_capability  # this process imported torch: the real answer, compared above
    here = collect_env_stamp()  # this process's own, from a collect_env child
    assert stamp_torch == here["torch_version"] == hw.torch and stamp_gcc == here["gcc_version"]
    if ":" not in model:  # the child's probe of a built-in workload is this process's
        assert data == json.loads(json.dumps(probe_builtin(Workload(model=model, image_size=16))))


def test_detect_without_torch_has_no_versions():
    hw = detect(with_torch=False)
    assert hw.torch is None and hw.torchvision is None and hw.torch_cpu_capability is None


def test_detect_honours_cgroup_limits(monkeypatch):
    monkeypatch.setattr(hardware, "cgroup_cpu_quota", lambda root="/sys/fs/cgroup": 1.5)
    monkeypatch.setattr(hardware, "cgroup_memory_limit_mb", lambda root="/sys/fs/cgroup": (512.0, 100.0))
    hw = detect(with_torch=False)
    assert hw.cgroup_cpu_quota == 1.5
    assert hw.usable_cores == 1  # 1.5 cores of quota: one core's worth of full-speed threads
    assert hw.ram_total_mb == 512.0
    assert hw.ram_available_mb <= 412.0
    assert hw.cgroup_memory_limit_mb == 512.0


def test_detect_fractional_quota_below_one_still_gives_one_core(monkeypatch):
    monkeypatch.setattr(hardware, "cgroup_cpu_quota", lambda root="/sys/fs/cgroup": 0.5)
    assert detect(with_torch=False).usable_cores == 1


# --- cgroup readers -------------------------------------------------------------------------------------------

def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("text, cores", [
    ("150000 100000\n", 1.5),
    ("200000 100000", 2.0),
    ("50000 100000", 0.5),
    ("max 100000\n", None),
    ("max", None),
])
def test_cgroup_v2_cpu_quota(tmp_path, text, cores):
    _write(tmp_path, "cpu.max", text)
    assert cgroup_cpu_quota(tmp_path) == cores


@pytest.mark.parametrize("quota, period, cores", [
    ("300000", "100000", 3.0),
    ("50000", "100000", 0.5),
    ("-1", "100000", None),
])
def test_cgroup_v1_cpu_quota(tmp_path, quota, period, cores):
    _write(tmp_path, "cpu/cpu.cfs_quota_us", quota + "\n")
    _write(tmp_path, "cpu/cpu.cfs_period_us", period + "\n")
    assert cgroup_cpu_quota(tmp_path) == cores


def test_cgroup_cpu_quota_absent(tmp_path):
    assert cgroup_cpu_quota(tmp_path) is None
    assert cgroup_cpu_quota(tmp_path / "does-not-exist") is None


def test_cgroup_v2_memory(tmp_path):
    _write(tmp_path, "memory.max", "max\n")
    _write(tmp_path, "memory.current", str(300 * 2**20) + "\n")
    assert cgroup_memory_limit_mb(tmp_path) == (None, 300.0)
    _write(tmp_path, "memory.max", str(4 * 2**30) + "\n")
    assert cgroup_memory_limit_mb(tmp_path) == (4096.0, 300.0)


def test_cgroup_v2_memory_without_current(tmp_path):
    _write(tmp_path, "memory.max", str(2**31))
    assert cgroup_memory_limit_mb(tmp_path) == (2048.0, None)


def test_cgroup_v1_memory(tmp_path):
    _write(tmp_path, "memory/memory.limit_in_bytes", str(3 * 2**30) + "\n")
    _write(tmp_path, "memory/memory.usage_in_bytes", str(2**29) + "\n")
    assert cgroup_memory_limit_mb(tmp_path) == (3072.0, 512.0)


def test_cgroup_v1_memory_unlimited(tmp_path):
    _write(tmp_path, "memory/memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory_limit_mb(tmp_path) == (None, None)


def test_cgroup_memory_absent(tmp_path):
    assert cgroup_memory_limit_mb(tmp_path) == (None, None)
