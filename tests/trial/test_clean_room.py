"""Every trial runs in a clean room (``autotune.machine.launch_env``): the shell's thread, allocator and preload
variables are cleared for the baseline and each candidate alike, and what the shell set is said and recorded.

Real children: a workload whose model writes what its process ran with (``tests.workloads_fixtures:
threads_probe``), with ``OMP_NUM_THREADS=1`` exported as torchrun and many clusters do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.machine.launch_env import clean_env, inherited_env, inherited_line
from autotune.trial.runner import child_env, run_trial

from tests.helpers import REPO_ROOT, run_cli

PROBE = Workload(model="tests.workloads_fixtures:threads_probe", image_size=16)
SPEC = MeasureSpec(windows=2, window_s=0.2, settle_windows=0, timeout_s=120)


def _torch_default_threads() -> int:
    """torch's own thread count in a fresh process started from a clean room."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=clean_env(),
                         capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.strip())


def _probed(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_what_the_shell_exports_is_cleared_and_the_configs_own_environment_set():
    shell = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LD_PRELOAD": "/x/libjemalloc.so",
             "MALLOC_ARENA_MAX": "2", "TCMALLOC_RELEASE_RATE": "5",
             "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
             "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/root"}
    assert set(inherited_env(shell)) == {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "MALLOC_ARENA_MAX",
                                         "TCMALLOC_RELEASE_RATE", "PYTORCH_CUDA_ALLOC_CONF", "GLIBC_TUNABLES"}
    base = child_env(TrialConfig(), base=shell)  # the baseline: PyTorch's own defaults
    assert not inherited_env(base) and base["CUDA_VISIBLE_DEVICES"] == "1" and base["PATH"] == "/bin"
    cand = child_env(TrialConfig(intra_op_threads=2, malloc="retain"), base=shell)  # exactly its config's
    assert cand["OMP_NUM_THREADS"] == "2" and "MALLOC_ARENA_MAX" not in cand and "LD_PRELOAD" not in cand
    assert cand["MALLOC_TRIM_THRESHOLD_"] == str(1 << 40)  # malloc=retain's own
    # a place that bounds the trial (Ray's shared GPU node) sets it under the config
    assert child_env(TrialConfig(), base=shell, placement={"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "1"
    assert child_env(TrialConfig(intra_op_threads=2), base=shell,
                     placement={"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "2"
    assert inherited_line({}) is None and "OMP_NUM_THREADS=1" in inherited_line({"OMP_NUM_THREADS": "1"})


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29)
def test_with_omp_num_threads_1_exported_the_baseline_child_runs_torchs_default_threads(tmp_path, monkeypatch):
    """A real trial child of the baseline (no threads in its config) with OMP_NUM_THREADS=1 and MALLOC_ARENA_MAX=2
    exported: torch.get_num_threads() in the child is torch's own default (what a clean process gets), not 1, and
    neither variable reaches it; a candidate with threads=1 gets its 1."""
    default = _torch_default_threads()
    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("AUTOTUNE_TEST_PROBE", str(probe))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    base = run_trial(PROBE, TrialConfig(batch_size=8), SPEC)
    cand = run_trial(PROBE, TrialConfig(batch_size=8, intra_op_threads=1), SPEC)
    assert base.ok and cand.ok, (base.reason, cand.reason)
    seen = _probed(probe)
    assert seen[0]["threads"] == default and seen[0]["env"] == {"OMP_NUM_THREADS": None, "MALLOC_ARENA_MAX": None,
                                                                 "LD_PRELOAD": None}
    assert seen[1]["threads"] == 1 and seen[1]["env"]["OMP_NUM_THREADS"] == "1"
    if (os.cpu_count() or 1) > 1:
        assert default > 1  # else the test could not tell the shell's 1 from torch's default


@pytest.mark.slow  # a real `autotune run` (~30 s quiet, a minute on a loaded VM); the child's threads are shown above
def test_a_real_run_with_omp_num_threads_1_exported_says_it_records_it_and_its_baseline_runs_without_it(tmp_path):
    """The real CLI with OMP_NUM_THREADS=1 exported: one line at the start says what the shell set; the baseline
    trial's process ran torch's default threads; the YAML's provenance lists what the shell set."""
    default = _torch_default_threads()
    probe = tmp_path / "probe.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AUTOTUNE_TEST_PROBE": str(probe), "PYTHONPATH": str(REPO_ROOT)}
    db = f"sqlite:///{tmp_path}/c.db"
    run = subprocess.run([sys.executable, "-m", "autotune.cli", "run", "--model", PROBE.model, "--image-size", "16",
                          "--trials", "1", "--finalists", "1", "--rounds", "1", "--parity-steps", "0", "--windows", "2",
                          "--window-seconds", "0.2", "--storage", db, "--no-progress", "--no-warm-start"],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    said = [ln for ln in run.stderr.splitlines() if ln.startswith("the shell sets ")]
    assert said == [inherited_line({"OMP_NUM_THREADS": "1"})]
    assert _probed(probe)[0]["threads"] == default  # trial 0, the baseline
    out = tmp_path / "rec.yaml"
    done = run_cli("export", "--storage", db, "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    prov = yaml.safe_load(out.read_text())["provenance"]
    assert prov["shell_environment"] == {"OMP_NUM_THREADS": "1"} and prov["trials_environment"].startswith("clean")
