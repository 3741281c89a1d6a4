"""The real `autotune` CLI in a subprocess: usage errors are one line and exit 2; env and trial work."""

from __future__ import annotations

import json

import pytest

from tests.helpers import TINY, run_cli


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _one_line_usage_error(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stderr.endswith("\n")
    assert lines[0].startswith("autotune")
    assert "error" in lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, words", [
    (["--batch-size", "0"], ["batch_size=0"]),
    (["--batch-size", "abc"], ["--batch-size", "'abc'"]),
    (["--model", "resnet81"], ["resnet81", "resnet18"]),
    (["--model", "nosuchpkg.mod:fn"], ["nosuchpkg"]),
    (["--memory-cap", "100MB"], ["memory cap", "1GiB"]),
    (["--memory-cap", "100TB"], ["memory cap", "larger than this machine"]),
    (["--memory-cap", "lots"], ["--memory-cap", "'lots'"]),
    (["--trial-timeout", "soon"], ["--trial-timeout", "'soon'"]),
    (["--image-size", "8"], ["image_size=8"]),
    (["--windows", "0"], ["windows=0"]),
    (["--amp", "fp32"], ["--amp", "'fp32'"]),
    (["--trial-timeout", "30"], ["--trial-timeout '30' has no unit"]),
    (["--malloc", "mimalloc"], ["--malloc", "'mimalloc'"]),
])
def test_trial_usage_errors(args, words):
    _one_line_usage_error(run_cli("trial", "--device", "cpu", *args), *words)


def test_trial_fp16_on_cpu():
    _one_line_usage_error(run_cli("trial", "--device", "cpu", "--amp", "fp16"), "fp16")


@pytest.mark.skipif(torch_cuda_available(), reason="a CUDA GPU is visible")
def test_trial_cuda_without_gpu():
    _one_line_usage_error(run_cli("trial", "--device", "cuda", "--model", TINY, "--image-size", "32",
                                  "--batch-size", "8", "--windows", "1", "--window-seconds", "0.1"), "cuda")


def test_trial_missing_data_dir(tmp_path):
    missing = tmp_path / "no-such-dir"
    _one_line_usage_error(run_cli("trial", "--device", "cpu", "--data", str(missing)), str(missing), "does not exist")


# slow: a CLI process; the same refusal as test_trial_missing_data_dir, and the empty folder is refused in-process
# in workloads/test_workloads.py::test_check_empty_data_dir
@pytest.mark.slow
def test_trial_empty_data_dir(tmp_path):
    _one_line_usage_error(run_cli("trial", "--device", "cpu", "--data", str(tmp_path)), str(tmp_path), "no images")


@pytest.mark.parametrize("args, words", [
    (["trial", "--bach-size", "8"], ["did you mean --batch-size?", "(see autotune trial --help)"]),
    (["run", "--trails", "3"], ["did you mean --trials?", "(see autotune run --help)"]),
    (["show", "--zzz"], ["unrecognized argument: --zzz (see autotune show --help)"]),
])
def test_a_mistyped_option_names_the_closest_and_the_subcommand_help(args, words):
    _one_line_usage_error(run_cli(*args), *words)


def test_unknown_command():
    _one_line_usage_error(run_cli("frobnicate"), "frobnicate")


# slow: a CLI process importing torch; by default `autotune env` runs in test_env_json (the same detection, as JSON)
@pytest.mark.slow
def test_env_text():
    proc = run_cli("env")
    assert proc.returncode == 0, proc.stderr
    assert "fingerprint" in proc.stdout and "gpu" in proc.stdout and "cores" in proc.stdout


def test_env_json():
    proc = run_cli("env", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["fingerprint"]) == 10
    assert data["usable_cores"] >= 1 and data["ram_total_mb"] > 0
    # torch's facts come from the collect_env child (the command imports torch once, there): the real ones
    import torch

    assert data["torch"] == torch.__version__ == data["collect_env"]["torch_version"]
    assert data["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    # what a DataLoader may hold here (machine.loader_memory): /dev/shm by statvfs, the limits by getrlimit, torch's
    # sharing strategy from the child that imported torch
    import os
    import resource

    lm = data["loader_memory"]
    if os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        assert lm["shm_path"] == "/dev/shm" and lm["shm_total_bytes"] == st.f_blocks * st.f_frsize
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert lm["nofile_soft"] == (None if soft == resource.RLIM_INFINITY else soft)
    assert lm["sharing_strategy"] == torch.multiprocessing.get_sharing_strategy()


def test_help():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "trial" in proc.stdout and "env" in proc.stdout and "exit codes" in proc.stdout


def test_trial_help():
    proc = run_cli("trial", "--help")
    assert proc.returncode == 0
    for opt in ("--memory-cap", "--trial-timeout", "--batch-size", "--num-workers", "--amp", "--format"):
        assert opt in proc.stdout


def test_models():
    proc = run_cli("models")
    assert proc.returncode == 0
    assert "resnet18" in proc.stdout.split()


def test_no_command_prints_help_and_exits_2():
    proc = run_cli()
    assert proc.returncode == 2
    assert "usage:" in proc.stdout


# slow: a CLI trial; by default test_security.py::test_a_trial_does_not_import_modules_planted_in_the_working_folder
# runs `autotune trial --format json` for real and reads the same result fields
@pytest.mark.slow
def test_trial_runs_for_real_with_json_output():
    proc = run_cli("trial", "--model", TINY, "--image-size", "32", "--batch-size", "8", "--windows", "2",
                   "--window-seconds", "0.2", "--device", "cpu", "--memory-cap", "4GiB", "--trial-timeout", "2m",
                   "--format", "json")
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    out = json.loads(proc.stdout)
    assert out["result"]["status"] == "ok"
    assert len(out["result"]["samples_per_s"]) == 2
    assert out["figures"]["median_samples_per_s"] > 0
    assert out["config"]["batch_size"] == 8
    assert out["workload"]["model"] == TINY and out["workload"]["device"] == "cpu"


def test_a_reader_that_goes_away_is_not_a_traceback():
    """`autotune env | head -0`: the pipe closes early; the command ends quietly (a real pipe, a real child)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "env"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    # closed before the child writes a byte (it collects the environment for seconds first): its first write, or
    # the flush at exit, meets a broken pipe for certain (reading a line first would let a short output fit the
    # pipe's buffer and never meet one)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and proc.returncode == 0, err.decode()[-2000:]
