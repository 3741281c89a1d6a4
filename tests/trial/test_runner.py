"""run_trial: one real child process per status, plus the parent's bookkeeping against scripted fake children.

Real children import torch (a few seconds each), so there is one per status. The fake children are tiny Python
scripts passed as ``python=``: they speak the worker's event protocol with exact timing, which lets the parent's
logic (parsing, pruning, kills, clean-up) be tested deterministically and fast.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest
import torch

from autotune.trial import worker as _worker
from autotune.trial import runner
from autotune.machine.device import CPUDevice, CUDADevice
from autotune.machine.malloc import thp_mode
from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.errors import ConfigError
from autotune.trial.runner import child_env, run_trial
from autotune.trial.events import to_dict

FIX = "tests.workloads_fixtures"
SPEC = MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, warmup_max_s=5, timeout_s=120)


def wl(name: str, **kw) -> Workload:
    return Workload(model=f"{FIX}:{name}", image_size=32, num_classes=10, **kw)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids, timeout=5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if not _gone(p)]
        if alive:
            time.sleep(0.1)
    return alive


# =============================================================================================================
# Real children
# =============================================================================================================

def test_ok(tmp_path):
    events = []
    log = tmp_path / "trial.log"
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, on_event=events.append, log_path=log)
    assert r.status == "ok", (r.reason, r.traceback, log.read_text()[-2000:])
    assert r.reason == ""
    assert r.ok
    assert len(r.samples_per_s) == SPEC.windows == len(r.window_steps)
    assert r.median_samples_per_s > 0 and math.isfinite(r.median_samples_per_s)
    for sps, steps in zip(r.samples_per_s, r.window_steps):
        assert steps >= SPEC.min_window_steps
        assert steps * 8 / sps >= SPEC.window_s * 0.999  # a window lasts at least window_s
    assert r.final_loss is not None and math.isfinite(r.final_loss)
    assert r.peak_host_mb is not None and r.peak_host_mb > 0
    assert r.warmup_steps is not None and r.warmup_steps >= 1
    assert r.data_wait_s_per_step is not None and r.data_wait_s_per_step >= 0
    assert r.compute_s_per_step is not None and r.compute_s_per_step > 0
    assert 0 <= r.kernel_cpu_share <= 1 and r.minor_faults_per_step >= 0
    assert r.startup_s is not None and r.startup_s > 0
    assert r.wall_s is not None and r.wall_s >= r.startup_s
    assert r.batch_size == 8
    assert r.signal is None and r.traceback is None
    assert [e["event"] for e in events] == ["started", "built", "warmup", "window", "window", "done"]
    assert log.exists()  # a log the caller asked for is kept


def test_ok_with_a_dataloader_worker_leaves_no_process_behind():
    seed = 900_000 + os.getpid() % 100_000  # marks this trial's command line
    spec = SPEC.replace(seed=seed)
    seen: dict[str, object] = {"workers": set()}
    done = threading.Event()

    def watch(pid):  # the worker lives from the first step to the last window: look all along, not at events
        while not done.is_set():
            try:
                seen["workers"].update(k.pid for k in psutil.Process(pid).children(recursive=True))
            except psutil.Error:
                return
            time.sleep(0.01)

    def on_event(ev):
        if ev["event"] == "started":
            seen["child"] = ev["pid"]
            threading.Thread(target=watch, args=(ev["pid"],), daemon=True).start()

    try:
        r = run_trial(wl("tiny"), TrialConfig(batch_size=8, num_workers=1), spec, on_event=on_event)
    finally:
        done.set()
    assert r.status == "ok", (r.reason, r.traceback)
    assert len(r.samples_per_s) == 2 and r.median_samples_per_s > 0
    assert seen["workers"], "no DataLoader worker process was seen during the trial"
    pids = [seen["child"], *seen["workers"]]
    assert _wait_gone(pids) == [], "trial processes outlived run_trial"
    marker = f'"seed": {seed}'
    stragglers = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "autotune.trial.worker" in cmd and marker in cmd and not _gone(p.info["pid"]):
            stragglers.append(p.info["pid"])
    assert stragglers == []


# slow: a torchvision model's trial; by default a real trial runs in test_ok, torchvision models are built in
# workloads/test_workloads.py and the infer task runs in a child in
# trial/test_parity.py::test_infer_compares_outputs
@pytest.mark.slow
def test_real_torchvision_model_infer_bf16_channels_last():
    w = Workload(model="resnet18", task="infer", image_size=32, num_classes=10, dataset_size=64)
    r = run_trial(w, TrialConfig(batch_size=8, amp="bf16", channels_last=True), SPEC)
    assert r.status == "ok", (r.reason, r.traceback)
    assert len(r.samples_per_s) == 2 and r.median_samples_per_s > 0
    assert r.final_loss is not None and math.isfinite(r.final_loss)  # infer with labels still reports a loss


def test_over_memory():
    spec = SPEC.replace(memory_cap_mb=1536.0, timeout_s=120)
    r = run_trial(wl("memory_hog"), TrialConfig(batch_size=4), spec)
    assert r.status == "over_memory", (r.status, r.reason, r.traceback)
    assert "1.50 GiB cap" in r.reason and r.reason.startswith("killed at ")
    assert r.is_memory_failure
    assert r.peak_host_mb is not None and r.peak_host_mb > 1536
    assert r.samples_per_s == ()
    assert r.wall_s < 90


# slow: a real trial per memory shape; by default the memory watch stops a real child over its cap
# (test_over_memory)
@pytest.mark.slow
def test_a_spike_shorter_than_a_sample_is_in_the_peak():
    """One step maps 300 MiB, faults every page in and frees it again, resident at full size for a few ms: the
    kernel's high-water marks keep it; a sampler (0.1 s RSS, 1 s PSS) almost always missed it."""
    plain = run_trial(wl("spike_none"), TrialConfig(batch_size=8), SPEC)
    spiked = run_trial(wl("spike_300mib"), TrialConfig(batch_size=8), SPEC)
    assert plain.ok and spiked.ok, (plain.reason, spiked.reason)
    assert spiked.peak_host_mb - plain.peak_host_mb > 280, (spiked.peak_host_mb, plain.peak_host_mb)


# slow: a real trial; by default the warm-up rules are tested against scripted windows (the three tests below) and a
# real trial warms up in test_ok
@pytest.mark.slow
def test_a_slow_first_step_does_not_end_the_warm_up():
    """The first step (0.5 s here, as compiling would be) is timed on its own; the warm-up limit (0.05 s) starts
    after it, and the warm-up still runs the steps that show it settled."""
    events = []
    spec = SPEC.replace(warmup_max_s=0.05)
    r = run_trial(wl("slow_first_step"), TrialConfig(batch_size=8), spec, on_event=events.append)
    assert r.ok, (r.reason, r.traceback)
    warm = next(e for e in events if e["event"] == "warmup")
    assert r.warmup_steps == warm["warmup_steps"] >= 3  # the first step and 2k = 2 settled ones at least
    assert warm["first_step_s"] >= 0.5 > 0.1 > warm["step_s"]
    assert r.warmup_s >= 0.5 and r.compile_s is None  # not compiling: the first step's excess is not compile_s


def _run_in_process(fixture: str, spec: MeasureSpec, monkeypatch) -> tuple[dict, list[dict]]:
    """``_worker.run`` in this process (no spawn) on a virtual clock that only the fixture's steps move
    (``workloads_fixtures.VirtualClock``): the warm-up event and the window events it sent."""
    from tests.workloads_fixtures import VirtualClock

    monkeypatch.setattr(time, "perf_counter", VirtualClock())
    seen: list[tuple[str, dict]] = []
    payload = {"workload": wl(fixture).to_dict(), "config": TrialConfig(batch_size=8).to_dict(),
               "measure": spec.to_dict(), "spawned_at": time.time()}
    _worker.run(payload, lambda ev: seen.append((ev.NAME, to_dict(ev))))
    return next(f for e, f in seen if e == "warmup"), [f for e, f in seen if e == "window"]


WINDOWS = MeasureSpec(windows=3, window_s=0.3, warmup_min_steps=1, timeout_s=120)


def test_a_warm_up_longer_than_the_first_step_is_found_by_the_windows_and_not_measured(monkeypatch):
    """Steps of 100 ms for 0.3 s, then 10 ms: the first window (two slow steps after the first, then fast
    ones: ~330 samples/s) lies far outside the later windows' range (800) and is re-labelled warm-up, its rate
    kept; the 3 windows kept are the fast steps, and the warm-up ends where they begin."""
    warm, windows = _run_in_process("late_warm_up", WINDOWS, monkeypatch)
    assert [w["index"] for w in windows] == [0, 1, 2]
    assert len(warm["warmup_windows"]) == 1 and 300 < warm["warmup_windows"][0] < 0.5 * 800, warm
    assert [round(w["samples_per_s"]) for w in windows] == [800, 800, 800]  # 8 samples / 0.01 s
    assert warm["settled"] is True and warm["step_s"] == pytest.approx(0.01)
    assert warm["warmup_s"] == pytest.approx(0.1 + 0.3, abs=0.02)  # the first step and the re-labelled window
    assert warm["warmup_steps"] >= 1 + 2 + 10


def test_steady_windows_are_all_measured_and_an_unchecked_first_window_is_said(monkeypatch):
    warm, windows = _run_in_process("steady_steps", WINDOWS, monkeypatch)
    assert warm["warmup_windows"] == [] and warm["settled"] is True and warm["warmup_steps"] == 1
    assert [round(w["samples_per_s"]) for w in windows] == [160, 160, 160]
    warm, windows = _run_in_process("late_warm_up", WINDOWS.replace(windows=1), monkeypatch)
    assert warm["settled"] is None and warm["warmup_windows"] == [] and len(windows) == 1
    # settle_windows=0: the first window is not checked (the rule before), slow phase and all
    warm, windows = _run_in_process("late_warm_up", WINDOWS.replace(settle_windows=0), monkeypatch)
    assert warm["settled"] is None and warm["warmup_windows"] == [] and warm["warmup_steps"] == 1
    assert windows[0]["samples_per_s"] < 0.5 * windows[1]["samples_per_s"]


def test_a_first_window_that_never_settles_is_kept_after_two_tries_and_said(monkeypatch):
    """Every window slower than the one before (a machine slowing down): no first window is confirmed; after
    two re-labelled the trial measures on, and says its windows never settled."""
    warm, windows = _run_in_process("slowing_down", WINDOWS, monkeypatch)
    assert len(warm["warmup_windows"]) == 2 and warm["settled"] is False, warm
    rates = warm["warmup_windows"] + [w["samples_per_s"] for w in windows]
    assert rates == sorted(rates, reverse=True) and len(windows) == 3


# slow: a real trial; by default the re-labelling is tested against scripted windows
# (test_a_warm_up_longer_than_the_first_step_is_found_by_the_windows_and_not_measured)
@pytest.mark.slow
def test_the_trial_result_keeps_the_re_labelled_windows_and_says_so():
    """Through the real runner (a child, real sleeps): the parent keeps the warm-up windows apart from the
    measured ones, in the result, its figures and its description."""
    r = run_trial(wl("late_warm_up_by_steps"), TrialConfig(batch_size=8), WINDOWS)
    assert r.ok, (r.reason, r.traceback)
    assert r.warmup_windows and r.settled is True, (r.warmup_windows, r.samples_per_s)
    # the first re-labelled window is the slow phase (a second one, when a loaded machine kept the next from
    # confirming, can be as fast as the measured ones)
    assert len(r.samples_per_s) == 3 and r.warmup_windows[0] < min(r.samples_per_s)
    assert r.figures()["warmup_windows"] == [round(x, 3) for x in r.warmup_windows]
    assert "counted as warm-up, not measured" in r.describe()


@pytest.mark.slow
def test_compile_time_is_the_first_steps_excess_even_past_the_warm_up_limit(tmp_path):
    """torch.compile's first step is far past a 0.05 s warm-up limit: it is still compile_s.

    A fresh inductor cache keeps the compile cold: with the default cache warmed by earlier tests, CI measured
    a whole compile of 1.0 s, where a cold one takes 5-20 s on these VMs."""
    spec = SPEC.replace(warmup_max_s=0.05)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8, compile_mode="default"), spec,
                  compile_cache_dir=tmp_path / "inductor")
    assert r.ok, (r.reason, r.traceback)
    assert r.compile_s > 10 * spec.warmup_max_s, r.compile_s
    assert r.warmup_steps >= 3 and r.warmup_s > r.compile_s, (r.warmup_steps, r.warmup_s, r.compile_s)


def test_oom():
    r = run_trial(wl("alloc_oom"), TrialConfig(batch_size=4), SPEC)
    assert r.status == "oom", (r.status, r.reason, r.traceback)
    assert "DefaultCPUAllocator" in r.reason
    assert r.traceback and "_alloc" in r.traceback
    assert r.samples_per_s == () and r.median_samples_per_s is None


# slow: waits out a 15 s limit; by default real hangs are killed at their limit in test_forkserver (a crash, an OOM
# and a hang) and test_parity, and the parent's timing in test_timeout_kills_promptly
@pytest.mark.slow
def test_timeout():
    spec = SPEC.replace(timeout_s=15)
    r = run_trial(wl("hang"), TrialConfig(batch_size=4), spec)
    assert r.status == "timeout", (r.status, r.reason, r.traceback)
    assert "15 s" in r.reason
    assert r.startup_s is not None  # it hung in a step, not in start-up
    assert 15 <= r.wall_s < 15 + 15


def test_crashed():
    r = run_trial(wl("abort"), TrialConfig(batch_size=4), SPEC)
    assert r.status == "crashed", (r.status, r.reason, r.traceback)
    assert r.signal == "SIGABRT"
    assert "SIGABRT" in r.reason


def test_error_keeps_the_traceback():
    r = run_trial(wl("raises"), TrialConfig(batch_size=4), SPEC)
    assert r.status == "error"
    assert r.reason == "ValueError: boom"
    assert r.traceback and "boom" in r.traceback and "Traceback" in r.traceback


# slow: a real trial; by default a step that fails is an error with its reason in test_error_keeps_the_traceback
@pytest.mark.slow
def test_nan_loss_is_an_error():
    r = run_trial(wl("nan_loss"), TrialConfig(batch_size=4), SPEC)
    assert r.status == "error", (r.status, r.reason)
    assert "loss" in r.reason and "nan" in r.reason


def test_pruned_after_the_first_window():
    calls = []

    def on_window(index, sps):
        calls.append((index, sps))
        return True

    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC.replace(windows=4), on_window=on_window)
    assert r.status == "pruned"
    assert len(r.samples_per_s) == 1
    assert len(calls) == 1 and calls[0][0] == 0 and calls[0][1] == r.samples_per_s[0]
    assert "1 window" in r.reason


# =============================================================================================================
# The worker's timing through the device seam, in this process: CUDA's code paths without a GPU
# =============================================================================================================

class _HostEvent:
    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


class _CountingCUDA(CUDADevice):
    """A CUDADevice whose tensors stay on the CPU and whose events read the host clock; counts synchronisations."""

    def __init__(self) -> None:
        super().__init__("cuda")
        self.syncs = 0

    def torch_device(self):
        return torch.device("cpu")

    def prepare(self, config, **kw) -> None:
        pass

    def to_device(self, tensor, **kw):
        return CPUDevice.to_device(self, tensor, **kw)

    def synchronize(self) -> None:
        self.syncs += 1

    def new_event(self):
        return _HostEvent()

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_mb(self) -> float | None:
        return None

    def peak_allocated_mb(self) -> float | None:
        return None


def test_a_cuda_window_synchronises_once_not_per_step():
    dev = _CountingCUDA()
    seen = []
    payload = {"workload": wl("tiny").to_dict(), "config": TrialConfig(batch_size=8).to_dict(),
               "measure": SPEC.replace(windows=3, warmup_min_steps=1).to_dict(), "spawned_at": time.time()}
    out = _worker.run(payload, lambda ev: seen.append((ev.NAME, dev.syncs, to_dict(ev))), device=dev)
    warm = next(f for e, _, f in seen if e == "warmup")
    windows = [f for e, _, f in seen if e == "window"]
    assert len(windows) == 3
    # one for the first step (timed alone), then one per window measured: the 3 kept, and any that the
    # check of the first window re-labelled warm-up, however many steps each window ran
    assert seen[-1][1] == 1 + 3 + len(warm["warmup_windows"]), (seen[-1][1], warm)
    # warm-up steps: the first, plus those of the re-labelled windows (2 at least each)
    assert (warm["warmup_steps"] == 1) == (not warm["warmup_windows"]), warm
    assert all(w["steps"] >= 2 for w in windows)
    for w in windows:  # the events' split adds up to the window's time
        step_s = 8 / w["samples_per_s"]
        assert 0.9 * step_s <= w["data_wait_s"] + w["compute_s"] <= step_s
        assert w["data_wait_s"] > 0 and w["compute_s"] > 0
    assert out["compute_s_per_step"] > 0


# =============================================================================================================
# Refusals before any child starts
# =============================================================================================================

@pytest.fixture
def no_spawn(monkeypatch):
    def popen(*a, **k):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(runner.subprocess, "Popen", popen)


def test_refuses_tiny_memory_cap(no_spawn):
    with pytest.raises(ConfigError, match="at least 1GiB"):
        run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC.replace(memory_cap_mb=100.0))


def test_refuses_fp16_on_cpu(no_spawn):
    with pytest.raises(ConfigError, match="fp16"):
        run_trial(wl("tiny"), TrialConfig(batch_size=8, amp="fp16"), SPEC)


def test_child_env():
    env = child_env(TrialConfig(intra_op_threads=3), base={"PATH": "/bin", "PYTHONPATH": "/elsewhere"})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__))))
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
    assert os.path.isfile(os.path.join(root, "autotune", "__init__.py"))  # the folder that holds the package
    assert env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
    # pytest's per-test variable would give every test a fork server of its own
    assert child_env(TrialConfig(), base={"PYTEST_CURRENT_TEST": "a.py::t (call)"}) == child_env(TrialConfig(), base={})


def test_a_trial_child_imports_this_autotune_and_none_of_its_modules_as_top_level_names(tmp_path):
    """The child's PYTHONPATH holds the folder above the package: `import autotune` is this one, and `config`,
    `search`, `trial`... (autotune's own sub-modules) are not top-level names shadowing the user's (a real child)."""
    import subprocess

    env = child_env(TrialConfig(), base={"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": str(tmp_path)})
    code = ("import importlib.util, json, autotune\n"
            "print(json.dumps([autotune.__file__, [n for n in ('config', 'search', 'trial', 'measure', 'errors')"
            " if importlib.util.find_spec(n)]]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    where, shadowing = __import__("json").loads(out.stdout)
    import autotune

    assert where == autotune.__file__ and shadowing == []
    assert "OMP_NUM_THREADS" not in child_env(TrialConfig(), base={})
    assert not [k for k in child_env(TrialConfig(), base={}) if k.startswith("MALLOC_")]
    retain = child_env(TrialConfig(malloc="retain"), base={})
    assert int(retain["MALLOC_MMAP_THRESHOLD_"]) == 32 << 20 and int(retain["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 31


# slow: two real trials of 0.5 s windows; by default the malloc knob reaches a real trial in
# test_a_preloaded_allocator_and_pinned_threads_reach_the_trial[jemalloc], retain's environment is test_child_env's,
# and glibc's retain behaviour is checked for real in
# test_recommend.py::test_apply_sets_glibc_malloc_in_the_running_process[retain-heap]
@pytest.mark.slow
def test_malloc_retain_stops_the_page_fault_churn():
    """A step that writes and frees 40 MiB: glibc's defaults map it afresh and fault it in again each step,
    retain reuses it. Measured with getrusage in the child: faults per step and the kernel's CPU share."""
    spec = SPEC.replace(window_s=0.5)
    default = run_trial(wl("churn"), TrialConfig(batch_size=8), spec)
    retain = run_trial(wl("churn"), TrialConfig(batch_size=8, malloc="retain"), spec)
    assert default.ok and retain.ok, (default.reason, retain.reason)
    # 40 MiB is 10,240 pages of 4 KiB; the defaults fault all of them in every step, retain almost none
    assert default.minor_faults_per_step > 9000, default.minor_faults_per_step
    assert retain.minor_faults_per_step < default.minor_faults_per_step / 10, (retain.minor_faults_per_step,
                                                                               default.minor_faults_per_step)
    assert 0 <= retain.kernel_cpu_share < default.kernel_cpu_share <= 1
    assert "page faults per step" in default.describe()


def test_child_env_for_hugepages_is_retain_plus_pytorchs_thp_switch():
    retain = child_env(TrialConfig(malloc="retain"), base={})
    huge = child_env(TrialConfig(malloc="hugepages"), base={})
    assert huge.pop("THP_MEM_ALLOC_ENABLE") == "1" and huge == retain
    assert "THP_MEM_ALLOC_ENABLE" not in retain


# slow: two 768 MiB-per-step trials; by default the malloc knob reaches a real trial in
# test_malloc_retain_stops_the_page_fault_churn and hugepages' environment in
# test_child_env_for_hugepages_is_retain_plus_pytorchs_thp_switch
@pytest.mark.slow
@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="the kernel's transparent huge pages are off")
def test_malloc_hugepages_faults_what_retain_cannot_keep():
    """A 768 MiB block per step does not fit retain's heap top, so glibc maps and faults it in every step
    (196,608 pages of 4 KiB); with hugepages PyTorch asks for 2 MiB pages: a few hundred faults."""
    spec = SPEC.replace(window_s=0.5)
    retain = run_trial(wl("churn_big"), TrialConfig(batch_size=8, malloc="retain"), spec)
    huge = run_trial(wl("churn_big"), TrialConfig(batch_size=8, malloc="hugepages"), spec)
    assert retain.ok and huge.ok, (retain.reason, huge.reason)
    assert retain.minor_faults_per_step > 100_000, retain.minor_faults_per_step
    assert huge.minor_faults_per_step < retain.minor_faults_per_step / 20, (huge.minor_faults_per_step,
                                                                            retain.minor_faults_per_step)


# =============================================================================================================
# The parent's bookkeeping, against scripted fake children
# =============================================================================================================

PRELUDE = """\
import json, os, signal, sys, time
_AT = sys.argv.index("autotune.trial.worker")  # argv: script -c BOOTSTRAP autotune.trial.worker FD PAYLOAD (_launch)
FD = int(sys.argv[_AT + 1])
PAYLOAD = json.loads(sys.argv[_AT + 2])
chan = os.fdopen(FD, "w")
def line(event, **f):
    return json.dumps({"event": event, **f}) + "\\n"
def send(event, **f):
    chan.write(line(event, **f)); chan.flush()
def window(i, sps):
    return line("window", index=i, samples_per_s=sps, steps=3, data_wait_s=0.001, compute_s=0.01)
def done(**f):  # the figures the parent does not check here, as autotune.trial.events.Done requires them
    send("done", **{"kernel_cpu_share": None, "minor_faults_per_step": 0.0, "samples_per_step": 8.0, **f})
"""


@pytest.fixture
def fake(tmp_path):
    def make(body: str) -> str:
        path = tmp_path / "fake_python"
        path.write_text(f"#!{sys.executable}\n" + PRELUDE + textwrap.dedent(body))
        path.chmod(0o755)
        return str(path)

    return make


FAST = MeasureSpec(windows=2, window_s=0.1, timeout_s=30)


def test_parent_parses_events_and_ignores_noise(fake, tmp_path):
    py = fake("""
        print("hello from the child", flush=True)
        chan.write("this is not json\\n")
        send("started", pid=os.getpid())
        send("built", startup_s=0.5, steps_per_epoch=10)
        send("warmup", warmup_s=0.25, warmup_steps=6, compile_s=None, step_s=0.01, first_step_s=0.05)
        chan.write(window(0, 100.0) + window(1, 110.0))
        done(final_loss=1.25, data_wait_s_per_step=0.002, compute_s_per_step=0.02, peak_device_mb=None)
        os._exit(0)
    """)
    events, log = [], tmp_path / "logs" / "t.log"
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, on_event=events.append, log_path=log, python=py)
    assert r.status == "ok", (r.reason, r.traceback)
    assert r.samples_per_s == (100.0, 110.0) and r.window_steps == (3, 3)
    assert r.median_samples_per_s == 105.0
    assert (r.startup_s, r.warmup_s, r.warmup_steps, r.final_loss) == (0.5, 0.25, 6, 1.25)
    assert (r.data_wait_s_per_step, r.compute_s_per_step) == (0.002, 0.02)
    assert [e["event"] for e in events] == ["started", "built", "warmup", "window", "window", "done"]
    assert "hello from the child" in log.read_text()


# one event of each type, as Python source: built in the fake child (and encoded there by the real encoder),
# and in the test, to compare with what the parent decoded from the pipe
EVERY_EVENT = """from autotune.trial import events as E
EVERY = [
    E.Started(pid=4242),
    E.Ranks(world_size=2, pids=(4243, 4244)),
    E.Built(startup_s=0.5, steps_per_epoch=10, accumulation_steps=2, user_parts=("optimizer",),
            device_memory_cap_mb=None, world_size=2),
    E.Warmup(warmup_s=0.25, warmup_steps=6, compile_s=1.5, step_s=0.01, first_step_s=0.3, warmup_windows=(90.0,),
             settled=True),
    E.Window(index=0, samples_per_s=100.0, steps=3, data_wait_s=0.001, compute_s=0.01, tokens_per_s=4000.0),
    E.Window(index=1, samples_per_s=110.0, steps=3, data_wait_s=0.001, compute_s=0.01,
             rank_samples_per_s=(55.0, 56.0)),
    E.Turn(index=7),
    E.Profiled(trace="/p/trace.pt.trace.json", top_ops="/p/top_ops.json", steps=5),
    E.Done(kernel_cpu_share=0.1, minor_faults_per_step=12.0, final_loss=1.25, data_wait_s_per_step=0.002,
           compute_s_per_step=0.02, peak_device_mb=None, samples_per_step=8.0,
           profile={"trace": "/p/trace.pt.trace.json", "top_ops": "/p/top_ops.json", "steps": 5}, world_size=2,
           ranks=({"rank": 0, "median_samples_per_s": 55.0}, {"rank": 1, "median_samples_per_s": 56.0})),
    E.Failed(kind="oom", message="OutOfMemoryError: out of memory", traceback="Traceback: (after done: not read)"),
]
"""


def test_every_event_type_round_trips_through_the_pipe(fake, tmp_path):
    """The child's encoder and the parent's decoder are one schema (autotune.trial.events): each event type, every
    field, crosses the real pipe unchanged, and the figures land in the result."""
    from autotune.trial import events

    src = tmp_path / "every_event.py"
    src.write_text(EVERY_EVENT)
    ns: dict = {}
    exec(EVERY_EVENT, ns)
    sent = ns["EVERY"]
    assert {type(e) for e in sent} == set(events.EVENTS.values())
    py = fake(f"""
        from autotune.trial import events as E
        ns = {{}}
        exec(open({str(src)!r}).read(), ns)
        for ev in ns["EVERY"]:
            chan.write(E.encode(ev).decode())
        chan.flush()
        os._exit(0)
    """)
    got: list[dict] = []
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, on_event=got.append, python=py)
    assert [events.from_dict(d) for d in got] == sent
    assert r.status == "ok" and r.samples_per_s == (100.0, 110.0) and r.tokens_per_s == (4000.0,)
    assert (r.startup_s, r.user_parts, r.warmup_s, r.compile_s, r.warmup_windows, r.settled) == (
        0.5, ("optimizer",), 0.25, 1.5, (90.0,), True)
    assert (r.kernel_cpu_share, r.minor_faults_per_step, r.samples_per_step, r.final_loss) == (0.1, 12.0, 8.0, 1.25)
    assert r.world_size == 2 and [x["median_samples_per_s"] for x in r.ranks] == [55.0, 56.0]


def test_an_event_field_renamed_on_one_side_fails_loudly(fake):
    """A child whose window says ``samples_per_sec`` is not read as a window without a rate: the parent raises
    ``EventError`` naming the fields, and the child is killed."""
    from autotune.trial.events import EventError

    py = fake("""
        send("started", pid=os.getpid())
        send("window", index=0, samples_per_sec=100.0, steps=3, data_wait_s=0.001, compute_s=0.01)
        time.sleep(300)
    """)
    pids = []
    with pytest.raises(EventError, match=r"'window' has unknown fields \['samples_per_sec'\] and lacks "
                                         r"\['samples_per_s'\]"):
        run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, on_event=lambda d: pids.append(d["pid"]), python=py)
    assert pids and _wait_gone(pids) == []


def test_parent_falls_back_to_window_medians_without_done(fake):
    py = fake("""
        chan.write(window(0, 100.0) + window(1, 110.0))
        send("failed", kind="error", message="RuntimeError: late failure", traceback="Traceback: late")
        os._exit(1)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, python=py)
    assert r.status == "error" and r.reason == "RuntimeError: late failure"
    assert r.traceback == "Traceback: late"
    assert r.samples_per_s == (100.0, 110.0)
    assert r.data_wait_s_per_step == 0.001 and r.compute_s_per_step == 0.01


def test_parent_reports_oom_from_the_child(fake):
    py = fake("""
        send("failed", kind="oom", message="OutOfMemoryError: CUDA out of memory.", traceback="tb")
        os._exit(1)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, python=py)
    assert r.status == "oom" and "CUDA out of memory" in r.reason and r.traceback == "tb"


def test_exit_without_result_is_crashed_and_keeps_the_log_tail(fake, tmp_path, monkeypatch):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    py = fake("""
        sys.stderr.write("the last words of the child\\n"); sys.stderr.flush()
        os._exit(3)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, python=py)
    assert r.status == "crashed"
    assert r.reason == "exited with code 3 without a result"
    assert r.signal is None
    assert "the last words of the child" in r.traceback
    assert list(tmpdir.iterdir()) == []  # its own temporary log is removed


def test_killed_by_a_signal_is_crashed(fake):
    py = fake("""
        send("started", pid=os.getpid())
        os.kill(os.getpid(), signal.SIGSEGV)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, python=py)
    assert r.status == "crashed" and r.signal == "SIGSEGV" and "SIGSEGV" in r.reason


def test_timeout_kills_promptly(fake):
    py = fake("""
        send("started", pid=os.getpid())
        time.sleep(300)
    """)
    pids = []
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST.replace(timeout_s=1.0),
                  on_event=lambda ev: pids.append(ev["pid"]), python=py)
    assert r.status == "timeout"
    assert r.wall_s >= 1.0 and r.wall_s < 6  # killed at the 1 s limit, promptly
    assert _wait_gone(pids) == []


def test_prune_kills_without_waiting_for_the_next_window(fake):
    py = fake("""
        chan.write(window(0, 100.0)); chan.flush()
        time.sleep(300)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST.replace(windows=5), on_window=lambda i, s: True,
                  python=py)
    assert r.status == "pruned" and r.samples_per_s == (100.0,)
    assert r.wall_s < 6


def test_on_window_false_lets_the_trial_finish(fake):
    py = fake("""
        chan.write(window(0, 100.0)); chan.flush()
        chan.write(window(1, 90.0)); chan.flush()
        done(final_loss=1.0, data_wait_s_per_step=0.0, compute_s_per_step=0.01, peak_device_mb=None)
        os._exit(0)
    """)
    calls = []
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, on_window=lambda i, s: calls.append(i) or False,
                  python=py)
    assert r.status == "ok" and calls == [0, 1] and r.samples_per_s == (100.0, 90.0)


def test_pruned_result_holds_only_the_windows_seen_before_pruning(fake):
    py = fake("""
        chan.write(window(0, 100.0) + window(1, 50.0)); chan.flush()   # one write: one read in the parent
        time.sleep(300)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST.replace(windows=5), on_window=lambda i, s: True,
                  python=py)
    assert r.status == "pruned"
    assert r.samples_per_s == (100.0,), f"reason says {r.reason!r} but samples are {r.samples_per_s}"


def test_forked_helpers_holding_the_channel_are_killed(fake, tmp_path):
    """Like DataLoader workers: forked, holding the event pipe open, outliving the child unless killed."""
    pidfile = tmp_path / "helper.pid"
    py = fake(f"""
        pid = os.fork()
        if pid == 0:
            time.sleep(300)
            os._exit(0)
        open({str(pidfile)!r}, "w").write(str(pid))
        done(final_loss=1.0, data_wait_s_per_step=0.0, compute_s_per_step=0.01, peak_device_mb=None)
        os._exit(0)
    """)
    r = run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, python=py)
    assert r.status == "ok"
    assert r.wall_s < 10  # did not wait for the helper to let go of the pipe
    helper = int(pidfile.read_text())
    assert _wait_gone([helper]) == []


def test_parent_interrupted_kills_the_child(fake):
    py = fake("""
        send("started", pid=os.getpid())
        time.sleep(300)
    """)
    pids = []

    def on_event(ev):
        pids.append(ev["pid"])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_trial(wl("tiny"), TrialConfig(batch_size=8), FAST, on_event=on_event, python=py)
    assert pids and _wait_gone(pids) == []


# tcmalloc: the same preload path as jemalloc, another library (slow: ~5 s a trial)
@pytest.mark.parametrize("mode", ["jemalloc", pytest.param("tcmalloc", marks=pytest.mark.slow)])
def test_a_preloaded_allocator_and_pinned_threads_reach_the_trial(mode):
    """malloc=jemalloc/tcmalloc preloads the library into the trial's process (fork server or not) and
    affinity=close pins OpenMP's threads; the same workload fails without them (its check can fail)."""
    from autotune.machine.malloc import install_hint, preload_path

    if preload_path(mode) is None:
        pytest.skip(f"{mode} is not installed here ({install_hint(mode)}; .ci/run installs it)")
    env = child_env(TrialConfig(malloc=mode, affinity="close"), base={})
    assert env["LD_PRELOAD"] == preload_path(mode) and env["OMP_PROC_BIND"] == "close"
    assert ("MALLOC_CONF" in env) is (mode == "jemalloc")
    r = run_trial(wl("launch_check"), TrialConfig(batch_size=8, malloc=mode, affinity="close"), SPEC)
    assert r.ok, r.reason
    plain = run_trial(wl("launch_check"), TrialConfig(batch_size=8), SPEC)
    assert plain.status == "error" and "no preloaded allocator mapped" in plain.reason


def test_a_preloaded_allocator_that_is_not_installed_is_trimmed_and_refused(monkeypatch):
    from autotune.machine.malloc import PRELOAD_LIBS
    from autotune.errors import ConfigError
    from autotune.machine.hardware import detect
    from autotune.search.space.search_space import space_from_dict

    monkeypatch.setitem(PRELOAD_LIBS, "jemalloc", ("libnot-installed-allocator.so.9",))
    hw = dataclasses.replace(detect(with_torch=False), libc="glibc 2.36")
    space = space_from_dict({"parameters": {"malloc": {"type": "categorical",
                                                       "choices": ["default", "retain", "jemalloc"]}}}, hardware=hw)
    assert space.params[0].choices == ("default", "retain")
    assert any("malloc=jemalloc dropped: not installed here (apt-get install libjemalloc2 on Debian/Ubuntu)" in n
               for n in space.notes), space.notes
    with pytest.raises(ConfigError, match="malloc=jemalloc: libnot-installed-allocator.so.9 is not installed here"):
        run_trial(wl("tiny"), TrialConfig(batch_size=8, malloc="jemalloc"), SPEC)
