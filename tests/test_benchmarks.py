"""Smoke test of benchmarks/spread.py at tiny settings (two fresh child processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.machine.malloc import preload_path

from tests.helpers import REPO_ROOT, TINY


def _spread(tmp_path, *extra: str) -> tuple[list[str], dict]:
    out = tmp_path / "spread.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "spread.py"), "--model", TINY, "--image-size", "32",
         "--batch-size", "8", "--runs", "2", "--windows", "2", "--window-seconds", "0.2", "--timeout", "120",
         "--out", str(out), *extra],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout.splitlines(), json.loads(out.read_text())


# slow: a real run of a benchmark script (a tool, not the product); by default the script's argument check runs
# in test_spread_script_refuses_a_bad_model and its drift arithmetic in test_common_drift_removes_what_every_...
@pytest.mark.slow
def test_spread_script_runs_and_writes_json(tmp_path):
    lines, data = _spread(tmp_path)
    assert lines[0].startswith("machine: ") and "fingerprint" in lines[0]
    runs = [ln for ln in lines if ln.startswith("run ") and "median" in ln]
    assert len(runs) == 2 and all("faults/step" in ln and "kernel" in ln for ln in runs)
    verdict = next(ln for ln in lines if "(max-min)/median" in ln)
    within = data["configs"]["default"]["spread"]["range_rel"] <= 0.05  # the verdict says what was measured
    assert verdict.endswith(("within" if within else "NOT within") + " the 5% target") and \
        (" NOT within" in verdict) != within
    one = data["configs"]["default"]
    assert len(one["runs"]) == 2
    assert all(r["status"] == "ok" and len(r["samples_per_s"]) == 2 for r in one["runs"])
    assert len(one["medians"]) == 2 and all(m > 0 for m in one["medians"])
    assert one["spread"]["runs_ok"] == 2 and one["spread"]["range_rel"] >= 0
    assert data["workload"]["model"] == TINY and one["config"]["batch_size"] == 8
    assert data["machine"]["fingerprint"] and data["target"] == 0.05
    assert data["common_drift"] is None  # one config alone cannot tell the machine's drift from its own
    assert data["complete"] is True


# slow: a real run of the script; by default it runs and writes its JSON in test_spread_script_runs_and_writes_json
@pytest.mark.slow
def test_spread_script_killed_keeps_the_runs_it_finished(tmp_path):
    out = tmp_path / "spread.json"
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "spread.py"), "--model", TINY, "--image-size", "32",
         "--batch-size", "8", "--runs", "50", "--windows", "2", "--window-seconds", "0.2", "--out", str(out)],
        cwd=str(REPO_ROOT), stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("run 1/50"):
                break
        proc.kill()  # SIGKILL: nothing runs after this in the benchmark
    finally:
        proc.kill()
        proc.wait(timeout=60)
    data = json.loads(out.read_text())
    assert data["complete"] is False
    runs = data["configs"]["default"]["runs"]
    assert len(runs) >= 1 and runs[0]["status"] == "ok" and len(runs[0]["samples_per_s"]) == 2


# slow: several real runs of the script; by default it runs and writes its JSON in
# test_spread_script_runs_and_writes_json
@pytest.mark.slow
def test_spread_script_interleaves_several_malloc_modes_in_rotating_order(tmp_path):
    lines, data = _spread(tmp_path, "--malloc", "default", "retain", "--target", "0.5")
    order = [ln.split("malloc=")[1].split()[0] for ln in lines if ln.startswith("run ")]
    assert order == ["default", "retain", "retain", "default"]  # A B, then B A
    assert sorted(data["configs"]) == ["default", "retain"]
    assert data["configs"]["retain"]["config"]["malloc"] == "retain"
    assert all(len(c["runs"]) == 2 for c in data["configs"].values())
    assert sum("50% target" in ln for ln in lines) == 2  # one verdict per mode
    # interleaved: the machine's drift common to both is measured and taken out of each mode's spread
    assert sorted(data["common_drift"]) == ["default", "retain"]
    assert all(len(d) == 2 and all(x > 0 for x in d) for d in data["common_drift"].values())
    assert sum("without the drift the other configs saw" in ln for ln in lines) == 2
    assert all("without_common_drift" in c["spread"] for c in data["configs"].values())


def _benchmark(name: str):
    """benchmarks/<name>.py as a module (the folder is scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_common_drift_removes_what_every_config_shares_and_never_a_configs_own_noise():
    spread = _benchmark("spread")
    machine = [0.9, 1.0, 1.1, 1.0]  # the VM slows and speeds up; every config follows it
    runs = {"a": [10 * m for m in machine], "b": [20 * m for m in machine], "c": [5 * m for m in machine]}
    drift = spread.common_drift(runs)
    for name, ms in runs.items():
        adjusted = [x / d for x, d in zip(ms, drift[name])]
        assert max(adjusted) - min(adjusted) < 1e-9 * max(adjusted)  # pure drift: nothing left
    # no drift, but "a" is noisy on its own: its spread must stay (an estimate that included "a" would shrink it)
    own = {"a": [10.0, 11.0, 10.0, 11.0], "b": [20.0] * 4, "c": [5.0] * 4}
    assert spread.common_drift(own)["a"] == [1.0] * 4
    assert spread.common_drift({"a": [10.0, None], "b": [1.0, 1.0]}) is None  # a failed run: not estimated
    assert spread.common_drift({"a": [10.0, 11.0]}) is None


def test_spread_script_refuses_a_bad_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "spread.py"), "--model", "resnet81", "--runs", "1",
         "--out", str(tmp_path / "x.json")],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "resnet81" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_quality_grid_script_runs_on_a_tiny_space(tmp_path):
    out = tmp_path / "quality.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "quality_grid.py"), "--quick", "--model", TINY, "--image-size",
         "16", "--rounds", "1", "--out", str(out)],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "recommendation / grid best" in proc.stdout and "share of the grid's time used" in proc.stdout
    assert "re-labelled warm-up / never settled" in proc.stdout
    data = json.loads(out.read_text())
    assert len(data["grid"]) == 8 and all(g["status"] == "ok" for g in data["grid"])
    assert data["medians"]["recommendation"] > 0 and data["flops_per_sample"] > 0
    assert out.with_suffix(".md").read_text().startswith("Machine:")


@pytest.mark.slow
def test_quality_script_runs_each_workload_against_its_ground_truth(tmp_path):
    """The several-workload benchmark on the tiny fixture: its ground truth (bf16 where the CPU has it x
    channels_last x the allocators x 2 batch sizes), an autotune run that stops by itself, the interleaved
    re-measurement, one table row."""
    out = tmp_path / "multi.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "quality.py"), "--quick", "--workloads", TINY, "--image-size",
         "16", "--batches", "8,16", "--rounds", "1", "--window-seconds", "0.2", "--out", str(out)],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert ("| recommendation / best | recommendation / best other, per round: median [low, high] | "
            "trials (s) to 95% of best |") in proc.stdout
    (row,) = json.loads(out.read_text())["workloads"]
    mallocs = 3 if preload_path("tcmalloc") else 2  # default, retain, and tcmalloc where installed
    assert len(row["grid"]) in (4 * mallocs, 8 * mallocs) and row["recommendation"] and row["stop_reason"]
    assert row["measured_trials"] >= 3 and "grid #1" in row["medians"]
    # each round's windows kept apart, for the ratios within a round
    assert all(isinstance(r, list) for rounds in row["remeasured"].values() for r in rounds)
    assert out.with_suffix(".md").read_text().startswith("Machine:")


# slow: a process of the script; by default the benchmark scripts' one-line refusal is
# test_spread_script_refuses_a_bad_model
@pytest.mark.slow
def test_quality_script_refuses_a_bad_model_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "quality.py"), "--quick", "--workloads", "resnet81",
         "--out", str(tmp_path / "x.json")],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "resnet81" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()


# slow: two trials of 2 real gloo ranks and one process each (~1 min on 2 cores); the ranks themselves are tested
# by default in tests/trial/test_ddp.py
@pytest.mark.slow
def test_ddp_vs_threads_script_runs_both_interleaved_and_writes_json(tmp_path):
    out = tmp_path / "ddp.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "ddp_vs_threads.py"), "--model", TINY, "--image-size", "32",
         "--global-batch", "16", "--rounds", "2", "--windows", "2", "--window-seconds", "0.2", "--out", str(out)],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    rounds = [line for line in proc.stdout.splitlines() if line.strip().startswith("round ")]
    assert len(rounds) == 4 and "2 ranks" in rounds[0] and "1 process" in rounds[2]  # the order rotates
    assert "ranks / one process:" in proc.stdout
    raw = json.loads(out.read_text())["windows"]
    assert [len(runs) for runs in raw.values()] == [2, 2] and all(len(w) == 2 for runs in raw.values() for w in runs)


def test_claims_independent_loop_measures_a_config_in_a_fresh_process(tmp_path):
    """benchmarks/claims.py's own loop (no code of autotune's): a config's windows, in samples/s, with the knobs a
    user following the YAML applies (inter-op threads, accumulation, channels_last), and its own text model with
    length bucketing and a worker."""
    import json

    specs = [{"workload": {"model": "tests.workloads_fixtures:tiny", "image_size": 16},
              "config": {"batch_size": 8, "intra_op_threads": 1, "inter_op_threads": 1, "channels_last": True},
              "accumulation_steps": 2, "windows": 2, "window_s": 0.2, "warmup_s": 0.2},
             {"workload": {"model": "transformer_tiny", "image_size": 32, "num_classes": 2, "dataset_size": 256},
              "config": {"batch_size": 16, "bucket_by_length": True, "num_workers": 1, "prefetch_factor": 2},
              "windows": 2, "window_s": 0.2, "warmup_s": 0.2}]
    for i, spec in enumerate(specs):
        path = tmp_path / f"spec{i}.json"
        path.write_text(json.dumps(spec))
        out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "claims.py"), "--one", str(path)],
                             capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        windows = json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"]
        assert len(windows) == 2 and all(w > 0 for w in windows)


def test_claims_is_independent_refuses_what_it_cannot_reproduce_and_analyses_with_its_own_interval():
    """claims.py imports nothing of autotune (the CLI it tunes with runs in a child); a recommendation it cannot
    apply as its user would is refused with the reason, never measured without the knob; its own paired t-interval
    agrees with autotune's ``ratio_interval`` (two implementations of one statistic)."""
    import ast
    import math

    from autotune.search.choose.settle import ratio_interval

    tree = ast.parse((REPO_ROOT / "benchmarks" / "claims.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in imported if m.split(".")[0] == "autotune"], imported
    claims = _benchmark("claims")
    plain = {"workload": {"model": "resnet18"}, "config": {"batch_size": 32, "amp": "bf16", "compile_mode": "default",
                                                          "inter_op_threads": 2, "static_graph": False}}
    assert claims.refusal(plain) is None
    assert "DDP ranks" in claims.refusal({**plain, "workload": {"model": "resnet18", "nproc_per_node": 2}})
    assert "the workload's own step" in claims.refusal({**plain, "user_parts": ["step", "optimizer"]})
    # the built-in text workload's token count and lengths are autotune's, which claims.py builds itself
    text = {**plain, "workload": {"model": "transformer_tiny"}, "user_parts": ["collate_fn", "count", "length"]}
    assert claims.refusal(text) is None
    assert "own count" in claims.refusal({**text, "workload": {"model": "my.module:build"}})
    assert "does not know" in claims.refusal({**plain, "config": {"batch_size": 8, "quantize": "int8"}})
    assert "a DDP knob" in claims.refusal({**plain, "config": {"batch_size": 8, "static_graph": True}})
    a, b = [[150.0, 152.0], [140.0, 139.0], [160.0, 158.0]], [[100.0, 101.0], [97.0, 96.0], [104.0, 105.0]]
    mine, theirs = claims.paired_interval(a, b), ratio_interval(a, b)
    assert all(math.isclose(x, y, rel_tol=1e-3) for x, y in zip(mine, theirs)), (mine, theirs)
    env = claims.clean({"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2", "PATH": "/bin"})
    assert env == {"PATH": "/bin"}


def test_claims_clean_room_is_the_trials_clean_room():
    """benchmarks/claims.py keeps its own copy of the variables autotune's trials clear from the shell (it imports
    nothing of autotune), so this ties the copy to the product: a shell that exports every name and prefix either
    list knows is cleared by claims.py exactly as a trial child's environment (``runner.child_env`` for PyTorch's
    defaults, the claim's baseline) clears it. A name added on one side only fails here."""
    from autotune.config import TrialConfig
    from autotune.machine.launch_env import INHERITED_PREFIXES, INHERITED_VARS, launch_env
    from autotune.trial.runner import child_env

    claims = _benchmark("claims")
    names = set(INHERITED_VARS) | set(claims.SHELL_VARS)
    names |= {p + "PROBE" for p in (*INHERITED_PREFIXES, *claims.SHELL_PREFIXES)}
    shell = {**{n: "1" for n in names}, "PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    baseline = TrialConfig(batch_size=64)
    assert launch_env(baseline) == {}  # the baseline's child adds none of them back: what is missing was cleared
    cleared_by_trials = set(shell) - set(child_env(baseline, base=shell))
    cleared_by_claims = set(shell) - set(claims.clean(shell))
    assert cleared_by_claims == cleared_by_trials, {"claims.py only": sorted(cleared_by_claims - cleared_by_trials),
                                                    "trials only": sorted(cleared_by_trials - cleared_by_claims)}
    assert {"PATH", "HOME", "LANG"}.isdisjoint(cleared_by_trials)
