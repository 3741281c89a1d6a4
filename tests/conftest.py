"""Shared set-up: the repo root is importable here and in every child process the tests start."""

from __future__ import annotations

import os
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
# Under pytest-xdist each worker is a session of its own: the controller's lock is inherited through the
# environment, so a worker takes a file of its own beside it (two workers' runs would refuse each other).
if not os.environ.get("AUTOTUNE_MACHINE_LOCK"):
    import tempfile

    os.environ["AUTOTUNE_MACHINE_LOCK"] = os.path.join(tempfile.mkdtemp(prefix="autotune-tests-"), "machine.lock")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and not os.environ["AUTOTUNE_MACHINE_LOCK"].endswith(f"-{_WORKER}.lock"):
    os.environ["AUTOTUNE_MACHINE_LOCK"] = os.environ["AUTOTUNE_MACHINE_LOCK"].removesuffix(".lock") + f"-{_WORKER}.lock"


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config):
    """The tests' folders in RAM (a fresh folder in /dev/shm, removed at the end) unless --basetemp is given.

    The suite commits thousands of SQLite transactions (each trial writes its attributes one by one), and on this
    project's shared VMs every fsync waits behind the other jobs' disk writes: two search modules took 112 s with
    their folders on disk and 28 s in RAM, at the same load. It is the same SQLite either way, and a killed
    process loses nothing in RAM that it would keep on disk (the page cache outlives it); only a power cut differs,
    which no test simulates. To keep the folders of a failed run, pass --basetemp."""
    shm = Path("/dev/shm")
    if config.option.basetemp is None and shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        import tempfile

        config.option.basetemp = config._autotune_ram_basetemp = tempfile.mkdtemp(prefix="autotune-tests-",
                                                                                 dir=shm)


def pytest_unconfigure(config):
    ram = getattr(config, "_autotune_ram_basetemp", None)
    if ram:  # RAM, not disk: nothing of it may outlive the session
        import shutil

        shutil.rmtree(ram, ignore_errors=True)


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def report_study(tmp_path_factory):
    """One tiny study made through the real CLI `run`, then `autotune report` on it: shared by the report,
    browser and security tests (``report_fixtures.ensure_study``)."""
    from tests import report_fixtures

    base = tmp_path_factory.getbasetemp()
    if not _WORKER:
        return report_fixtures.ensure_study(base / "report-study")
    # under pytest-xdist: made once for all workers, in the folder their own folders share, under a file lock
    from filelock import FileLock

    root = base.parent / "report-study"
    with FileLock(str(root) + ".lock"):
        return report_fixtures.ensure_study(root)


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
