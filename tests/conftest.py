"""Shared set-up: the repo root is importable here and in every child process the tests start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Children (trial workers, CLI subprocesses, the benchmark script) must resolve `tests.workloads_fixtures`.
_pp = os.environ.get("PYTHONPATH", "")
if str(REPO_ROOT) not in _pp.split(os.pathsep):
    os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + _pp if _pp else "")

# One machine lock per test session (runs the session starts share it), not the machine's: several sessions
# (a developer's and a helper's) may run on one machine, and their trials' timings matter less than finishing.
if not os.environ.get("AUTOTUNE_MACHINE_LOCK"):
    import tempfile

    os.environ["AUTOTUNE_MACHINE_LOCK"] = os.path.join(tempfile.mkdtemp(prefix="autotune-tests-"), "machine.lock")

TINY = "tests.workloads_fixtures:tiny"


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def run_cli(*args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `autotune` CLI in a subprocess (repo root as cwd and on PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=str(cwd or REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=timeout,
    )


def assert_queued_are_walk_steps_or_reruns(trials) -> None:
    """What a run leaves queued (WAITING) for the next: the planned search's next trials (batch walk steps,
    one-knob steps, a repeat of a config measured within the noise of the best: ``coordinate``), compile tried
    last, or the one re-run of a trial pruned far below its neighbours (``study_queue.requeue_far_pruned``; on a
    noisy VM a short trial is sometimes pruned that way, and the re-run is right)."""
    by_number = {t.number: t for t in trials}
    for t in trials:
        if t.state.name == "WAITING":
            ua = t.user_attrs
            rerun_of = by_number.get(ua.get("requeue_of"))
            planned = ua.get("batch_line") or ua.get("knob_step") or ua.get("compile_last") \
                or by_number.get(ua.get("repeat_of")) is not None
            assert planned or (rerun_of is not None and rerun_of.state.name == "PRUNED"), (t.number, ua)


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests run the real CUDA path; where torch sees no GPU each is skipped, saying why."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    from autotune.machine.device import nvml_gpus

    gpus, status = nvml_gpus()
    reason = (f"no CUDA GPU visible to torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}); NVML: "
              + (", ".join(g.name for g in gpus) if gpus else status))
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
