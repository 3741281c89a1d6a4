"""What of benchmarks/gpu_host.sh (the next GPU session's one script) runs without a GPU: its arguments, its plan
and time limits (--dry-run), its steps' time limits and interrupt for real (the script sourced: functions only),
its refusal where torch sees no GPU; benchmarks/make_jpegs.py; benchmarks/gpu_reference.py's reading of an exported
recommendation, its interleaved order, its table, and one config measured on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_host.sh"
REFERENCE = REPO_ROOT / "benchmarks" / "gpu_reference.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bash(script: str, *args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_HOST_")}
    return subprocess.run(["bash", script, *args], cwd=str(REPO_ROOT), env={**full, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _sourced(body: str, tmp_path, timeout: float = 60) -> subprocess.CompletedProcess:
    """``body`` run by bash after sourcing the script (which then defines its functions and runs nothing)."""
    head = f'source "{SCRIPT}"; OUT="{tmp_path}"; BUDGET=100; DRY=0; MIN_STEP_S=1\n'
    return subprocess.run(["bash", "-c", head + body], capture_output=True, text=True, timeout=timeout)


# --- gpu_host.sh ------------------------------------------------------------------------------------------------------

def test_the_script_parses_and_says_how_to_run_it():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    out = _bash(str(SCRIPT), "--help")
    assert out.returncode == 0 and "bash benchmarks/gpu_host.sh [--dry-run] [WHEEL_DIR]" in out.stdout


@pytest.mark.parametrize("args, env, said", [
    (["/no/such/folder"], {}, "WHEEL_DIR /no/such/folder is not a folder"),
    (["benchmarks"], {}, "holds no .whl file"),
    (["--bogus"], {}, "unknown option --bogus"),
    (["--dry-run", "a", "b"], {}, "one WHEEL_DIR at most"),
    (["--dry-run"], {"GPU_HOST_BUDGET_S": "9m"}, "GPU_HOST_BUDGET_S must be a whole number, got '9m'"),
    (["--dry-run"], {"GPU_HOST_DATA": "/no/such/jpegs"}, "GPU_HOST_DATA /no/such/jpegs is not a folder"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, env, said, tmp_path):
    out = _bash(str(SCRIPT), *args, env={"OUT": str(tmp_path), **env})
    assert out.returncode == 2 and said in out.stderr, (out.stdout, out.stderr)


def _plan(tmp_path, *args: str, **env: str) -> tuple[str, list[tuple[str, int, int]]]:
    out = _bash(str(SCRIPT), "--dry-run", *args, env={"OUT": str(tmp_path / "out"), **env})
    assert out.returncode == 0, (out.stdout, out.stderr)
    steps = [(m[1], int(m[2]), int(m[3])) for m in re.finditer(r"^== (\w+) \[time limit (\d+) s, at (\d+) s\]",
                                                                 out.stdout, re.M)]
    return out.stdout, steps


def test_the_dry_run_shows_every_step_and_the_worst_case_fits_the_budget(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "optuna-5.0.0-py3-none-any.whl").write_bytes(b"")
    text, steps = _plan(tmp_path, str(wheels))
    names = [s[0] for s in steps]
    # the run, its export and the comparison first; the gpu tests get what is left (none in the worst case)
    assert names == ["wheels", "install", "env", "jpegs", "run", "export", "show", "compare"], text
    assert all(at + limit <= 520 for _, limit, at in steps), steps  # each step ends within the budget
    assert f"pip install --no-index --no-deps {wheels}/optuna-5.0.0-py3-none-any.whl" in text
    assert "pip install --no-deps --no-build-isolation -e ." in text
    assert re.search(r"-m autotune.cli run --model resnet18 --device cuda --data \S+/jpegs --timeout \d+s "
                     rf"--storage sqlite:///{tmp_path}/out/gpu.db", text), text  # the study, and its logs, in $OUT
    assert "export --storage sqlite:///" in text and f"-o {tmp_path}/out/rec.yaml" in text
    assert re.search(r"gpu_reference.py --data \S+ --rec \S+/rec.yaml --device cuda --rounds \d --budget-s \d+", text)
    assert "pytest_issue35: skipped" in text and "pytest_rest: skipped" in text  # each line says how to get it
    assert (tmp_path / "out" / "gpu_host.log").read_text() == text  # everything printed is kept under $OUT


def test_the_run_may_end_by_its_own_budget_rule_before_its_step_is_cut(tmp_path):
    """The run ends by its --timeout plus 5%, plus what a tuner overshoots (the H200's run of 2026-11-26 ended 27%
    late: 178 s of 140): its step's limit allows both and its start, so the export after it has a study to read."""
    text, steps = _plan(tmp_path, GPU_HOST_BUDGET_S="1200")
    timeout = int(re.search(r"autotune.cli run .*--timeout (\d+)s", text)[1])
    limit = dict((name, limit) for name, limit, _ in steps)["run"]
    assert timeout == 180 and limit >= timeout * 1.32 + 20, (timeout, limit)


def test_the_dry_run_says_what_is_missing_and_the_logs_it_keeps(tmp_path):
    """On this machine (no GPU, maybe a bare PATH): what the steps need and lack, found without importing anything,
    listed before any step; and the logs a run leaves in $OUT: every trial's, every ceiling's, the reference loop's."""
    import shutil

    text, steps = _plan(tmp_path)
    head = text.split("== install")[0]
    assert "== needs (found without importing anything" in head and "found: " in head
    if shutil.which("nvidia-smi") is None:
        assert "missing: nvidia-smi: no NVIDIA driver here" in head
    keeps = re.search(r"^== keeps in (\S+): (.*)$", text, re.M)
    assert keeps[1] == str(tmp_path / "out")
    for log in ("gpu_host.log", "<step>.log", "gpu.db", "trial-<n>.log", "ceiling-model.log", "ceiling-data-w<n>.log",
                "finalist-<r>-*.log", "confirm-<r>-*.log", "rec.yaml", "reference_table.txt",
                "reference_results.jsonl", "<config>-round<r>.log"):
        assert log in keeps[2], log
    # the study's database (and its folder of trial and ceiling logs) is in $OUT, not in a folder deleted at exit
    assert all(f"sqlite:///{tmp_path}/out/gpu.db" in line for line in text.splitlines() if "--storage" in line)


def test_on_a_bare_path_it_finds_python3_and_names_what_that_python_lacks(tmp_path):
    """A bare Ubuntu has python3 and no `python`: the plan runs every step with python3 (PYTHON unset)."""
    import shutil

    bare = "/usr/bin:/bin"
    python3 = shutil.which("python3", path=bare)
    if python3 is None or shutil.which("python", path=bare) is not None:
        pytest.skip("this machine's /usr/bin is not a bare one (no python3, or a `python`)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_HOST_") and k != "PYTHON"}
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=str(REPO_ROOT), capture_output=True, text=True,
                         env={**env, "PATH": bare, "OUT": str(tmp_path / "out")}, timeout=60)
    assert out.returncode == 0, (out.stdout, out.stderr)
    commands = re.findall(r"^== \w+ \[time limit \d+ s, at \d+ s\]: (\S+)", out.stdout, re.M)
    assert commands and set(commands) == {python3}, commands
    assert f"python: {python3}" in out.stdout
    missing = re.findall(r"^   missing: (.*)$", out.stdout, re.M)
    found = re.search(r"^   found: (.*)$", out.stdout, re.M)[1]
    for dep in ("optuna", "PyYAML", "psutil", "pandas", "tqdm"):  # each said once: found or missing
        assert (dep in found) != any(m.startswith(f"{dep} ") for m in missing), (dep, found, missing)


def test_with_a_longer_budget_the_run_gets_its_3_minutes_and_the_rest_of_the_tests_run(tmp_path):
    text, steps = _plan(tmp_path, GPU_HOST_BUDGET_S="1200")
    assert [s[0] for s in steps] == ["install", "env", "jpegs", "run", "export", "show", "compare", "pytest_issue35",
                                     "pytest_rest"]
    assert "--timeout 180s" in text and "--rounds 2" in text and "--count 8192" in text
    assert all(at + limit <= 1200 for _, limit, at in steps), steps
    ids = re.search(r"== pytest_issue35 .*", text)[0]
    rest = re.search(r"== pytest_rest .*", text)[0]
    assert "-m pytest -m gpu -n 0" in ids and "-m pytest -m gpu -n 0" in rest
    # together, the one command `pytest -m gpu -n 0 tests/machine/test_gpu.py`, each test once: the new ones first
    new = re.findall(r"tests/machine/test_gpu.py::(\w+)", ids)
    assert len(new) == 4 and re.findall(r"--deselect tests/machine/test_gpu.py::(\w+)", rest) == new
    assert rest.split(" --deselect")[0].endswith(" tests/machine/test_gpu.py")


def test_the_tests_it_runs_first_exist_in_test_gpu():
    names = re.search(r"NEW_TESTS=\(\n(.*?)\n\)", SCRIPT.read_text(), re.S)[1].split()
    defined = set(re.findall(r"^def (test_\w+)", (REPO_ROOT / "tests" / "machine" / "test_gpu.py").read_text(), re.M))
    assert len(names) == 4 and set(names) <= defined, set(names) - defined


def test_it_downloads_nothing():
    code = [ln for ln in SCRIPT.read_text().splitlines() if not ln.lstrip().startswith("#")]
    pips = [ln for ln in code if "pip install" in ln]
    assert pips and all("--no-deps" in ln for ln in pips)
    assert all("--no-index" in ln for ln in pips if "WHEELS" in ln)
    assert not [ln for ln in code if re.search(r"\b(curl|wget|pip download)\b", ln)]


def test_a_step_is_logged_and_one_past_its_limit_is_cut(tmp_path):
    t0 = time.monotonic()
    out = _sourced('step quick 5 bash -c "echo hello; exit 3"; echo "rc=$?"\n'
                   'step slow 2 bash -c "echo started; sleep 30"; echo "rc=$?"\n'
                   'step none 0 true; echo "rc=$?"\n'
                   'echo "limits $(limit_for 50 70) $(limit_for 10 0)"', tmp_path)
    assert time.monotonic() - t0 < 15  # the sleep was cut at 2 s
    lines = out.stdout.splitlines()
    assert "hello" in lines and "rc=3" in lines and (tmp_path / "quick.log").read_text() == "hello\n"
    assert any(ln.startswith("-- slow: CUT by its 2 s time limit") for ln in lines) and "rc=124" in lines
    assert any(ln.startswith("== none: skipped") for ln in lines) and "rc=125" in lines
    assert re.search(r"^limits (2[0-9]|30) 10$", out.stdout, re.M), out.stdout  # 100 s budget less 70 kept back


def test_an_interrupt_stops_the_running_step_and_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    body = (f'echo $$ > "{tmp_path}/bash.pid"; trap on_signal INT TERM\n'
            f'step long 60 bash -c \'echo $$ > "{pid_file}"; exec sleep 60\'; echo after')
    proc = subprocess.Popen(["bash", "-c", f'source "{SCRIPT}"; OUT="{tmp_path}"; BUDGET=100; DRY=0\n' + body],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the step never started"
            time.sleep(0.1)
        os.kill(int((tmp_path / "bash.pid").read_text()), signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted; stopping the running step" in out and "after" not in out
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}"), "the step's command outlived the interrupt"


def test_pytest_line_reads_the_closing_line_or_counts_a_cut_run(tmp_path):
    done, cut = tmp_path / "done.log", tmp_path / "cut.log"
    done.write_text("tests/machine/test_gpu.py::test_a PASSED\n"
                    "==== 3 passed, 1 failed, 2 deselected, 7 warnings in 239.69s (0:03:59) ====\n")
    cut.write_text("tests/machine/test_gpu.py::test_a issue35: figure\nPASSED [ 25%]\n"
                   "tests/machine/test_gpu.py::test_b[cuda] PASSED [ 50%]\n"
                   "tests/machine/test_gpu.py::test_c FAILED [ 75%]\ntests/machine/test_gpu.py::test_d ")
    out = _sourced(f'pytest_line "{done}"; pytest_line "{cut}"; pytest_line "{tmp_path}/none.log"', tmp_path)
    assert out.stdout.splitlines() == ["==== 3 passed, 1 failed, 2 deselected, 7 warnings in 239.69s (0:03:59) ====",
                                       "cut before its end: 2 passed, 1 failed so far", "not run"], out.stdout


def test_without_a_gpu_it_says_so_and_exits_3_before_installing_anything(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would run for real")
    out = _bash(str(SCRIPT), env={"OUT": str(tmp_path)}, timeout=180)
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert "torch sees no CUDA GPU here" in out.stdout and "== install" not in out.stdout
    assert "torch sees no CUDA GPU here" in (tmp_path / "gpu_host.log").read_text()


# --- make_jpegs.py ---------------------------------------------------------------------------------------------------

def test_make_jpegs_writes_an_image_folder_the_same_each_time(tmp_path):
    from PIL import Image
    from torchvision.datasets import ImageFolder

    mj = _load("make_jpegs")
    assert mj.make(tmp_path / "a", count=7, classes=3, size=(40, 30)) == 7
    mj.make(tmp_path / "b", count=7, classes=3, size=(40, 30))
    ds = ImageFolder(str(tmp_path / "a"))
    assert len(ds) == 7 and ds.classes == ["class_00", "class_01", "class_02"]
    with Image.open(ds.samples[0][0]) as img:
        assert img.format == "JPEG" and img.size == (40, 30)
    for path, _ in ds.samples:  # the same arguments give the same bytes
        rel = os.path.relpath(path, tmp_path / "a")
        assert (tmp_path / "b" / rel).read_bytes() == open(path, "rb").read()
    with pytest.raises(ValueError, match="ImageFolder refuses an empty class"):
        mj.make(tmp_path / "c", count=2, classes=3)


def test_make_jpegs_refuses_a_bad_size_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "make_jpegs.py"), str(tmp_path),
                          "--size", "320by240"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "expected WIDTHxHEIGHT" in out.stderr


# --- gpu_reference.py ----------------------------------------------------------------------------------------------

def test_the_reference_reads_an_exported_recommendation_as_autotune_writes_it(tmp_path):
    """The keys come from autotune's own records (TrialConfig, Workload, launch_env), so a rename there fails
    here; the reference itself never imports autotune."""
    import yaml

    from autotune.config import TrialConfig, Workload
    from autotune.machine.launch_env import launch_env

    config = TrialConfig(batch_size=256, num_workers=14, prefetch_factor=4, pin_memory=True, persistent_workers=True,
                         amp="bf16", channels_last=True, cudnn_benchmark=True, intra_op_threads=2, malloc="retain")
    rec = tmp_path / "rec.yaml"
    rec.write_text(yaml.safe_dump({"config": config.to_dict(), "environment": launch_env(config),
                                   "workload": Workload(model="resnet50", image_size=160, device="cuda").to_dict()}))
    ref = _load("gpu_reference")
    cfg, workload, env = ref.from_recommendation(str(rec))
    assert cfg == {"bs": 256, "workers": 14, "prefetch": 4, "pin": 1, "persistent": 1, "amp": "bf16", "cl": 1,
                   "cudnn": 1, "compile": "none", "threads": 2, "interop": 0}
    assert workload == {"model": "resnet50", "task": "train", "res": 160, "classes": 1000}
    assert env["OMP_NUM_THREADS"] == "2" and "MALLOC_MMAP_THRESHOLD_" in env
    assert ref.describe(cfg) == ("bs 256, 14 workers, pin, persistent, prefetch 4, cudnn.benchmark, channels_last, "
                                 "bf16, 2 threads")
    assert ref.describe(ref.SEEDS) == "bs 64, 4 workers, pin, persistent, prefetch 2, cudnn.benchmark, fp16+GradScaler"
    assert ref.describe(ref.DEFAULTS) == "bs 64, 0 workers, fp32"


def test_the_reference_plans_interleaved_rounds_without_running_anything(tmp_path):
    ref = _load("gpu_reference")
    assert ref.order(3, 3) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    rec = tmp_path / "rec.yaml"
    rec.write_text("config: {batch_size: 128, num_workers: 6, pin_memory: true, amp: fp16}\n"
                   "workload: {model: resnet18, image_size: 224}\nenvironment: {OMP_NUM_THREADS: '10'}\n")
    out = subprocess.run([sys.executable, str(REFERENCE), "--data", str(tmp_path), "--rec", str(rec), "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert [c["name"] for c in plan["configs"]] == ["recommended", "pytorch_defaults", "seeds_recipe"]
    assert plan["order"] == [[1, "recommended"], [1, "pytorch_defaults"], [1, "seeds_recipe"],
                             [2, "seeds_recipe"], [2, "pytorch_defaults"], [2, "recommended"]]
    first = plan["configs"][0]
    assert first["env"] == {"OMP_NUM_THREADS": "10"} and first["cfg"]["bs"] == 128 and first["cfg"]["device"] == "cuda"
    assert plan["configs"][1]["cfg"]["workers"] == 0 and plan["configs"][1]["cfg"]["amp"] == "off"
    missing = subprocess.run([sys.executable, str(REFERENCE), "--device", "cpu"], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "--data DIR is required" in missing.stderr


def test_the_reference_table_marks_cut_and_failed_cells():
    ref = _load("gpu_reference")
    entries = [{"name": "recommended", "what": "bs 256"}, {"name": "pytorch_defaults", "what": "bs 64"}]
    results = {(0, "recommended"): {"ok": True, "sps_median": 3000.0}, (1, "recommended"): {"ok": False},
               (0, "pytorch_defaults"): {"ok": True, "sps_median": 400.0},
               (1, "pytorch_defaults"): {"ok": True, "sps_median": 500.0}}
    rows = ref.table(entries, results, 3).splitlines()
    assert [c.strip() for c in rows[0].split("|")] == ["config", "round 1", "round 2", "round 3", "median",
                                                       "vs defaults", "what"]
    assert [c.strip() for c in rows[2].split("|")] == ["recommended", "3000.0", "fail", "cut", "3000.0", "x6.67",
                                                       "bs 256"]
    assert [c.strip() for c in rows[3].split("|")] == ["pytorch_defaults", "400.0", "500.0", "cut", "450.0", "x1.00",
                                                       "bs 64"]


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29: the suite at 317-342 s)
def test_the_reference_measures_one_config_on_the_cpu(tmp_path):
    _load("make_jpegs").make(tmp_path / "jpegs", count=8, classes=2, size=(48, 40))
    one = {"data": str(tmp_path / "jpegs"), "device": "cpu", "res": 32, "bs": 4, "classes": 10, "windows": 2,
           "window_s": 0.2, "warmup_s": 0.2}
    out = subprocess.run([sys.executable, str(REFERENCE), "--one", json.dumps(one)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert r["sps_median"] > 0 and len(r["sps_windows"]) == 2 and r["finite"] and r["gpu"] == "cpu"
    bad = subprocess.run([sys.executable, str(REFERENCE), "--one", json.dumps({**one, "batch": 4})],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown key(s) batch" in bad.stderr


# slow: three fresh processes, each importing torch and training a resnet18; by default one runs in
# test_the_reference_measures_one_config_on_the_cpu, and the plan and table are checked without running
@pytest.mark.slow
def test_the_reference_driver_runs_a_quick_comparison_on_the_cpu(tmp_path):
    _load("make_jpegs").make(tmp_path / "jpegs", count=8, classes=2, size=(48, 40))
    rec = tmp_path / "rec.yaml"
    rec.write_text("config: {batch_size: 8, num_workers: 1, pin_memory: false, amp: 'off', intra_op_threads: 1}\n"
                   "workload: {model: resnet18, image_size: 32, num_classes: 10}\n"
                   "environment: {OMP_NUM_THREADS: '1'}\n")
    out = subprocess.run([sys.executable, str(REFERENCE), "--data", str(tmp_path / "jpegs"), "--rec", str(rec),
                          "--device", "cpu", "--quick", "--budget-s", "240", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    table = (tmp_path / "out" / "reference_table.txt").read_text()
    assert table.strip() in out.stdout
    for name in ("recommended", "pytorch_defaults", "seeds_recipe"):
        row = next(ln for ln in table.splitlines() if ln.startswith(name))
        assert float(row.split("|")[1]) > 0, row
    results = [json.loads(ln) for ln in (tmp_path / "out" / "reference_results.jsonl").read_text().splitlines()]
    assert [r["name"] for r in results] == ["recommended", "pytorch_defaults", "seeds_recipe"]
    assert results[0]["env"] == {"OMP_NUM_THREADS": "1"} and all(r["ok"] for r in results)
