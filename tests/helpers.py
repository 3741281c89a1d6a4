"""Plain helpers the test modules share: constants, the CLI runner, and factories for tuners, spaces and
recommendations. Not a test module and no fixtures (those are in conftest.py): child processes the tests start
import it too (``tests.helpers.make_rec``), so it must not import pytest."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY = "tests.workloads_fixtures:tiny"


def run_cli(*args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `autotune` CLI in a subprocess (repo root as cwd and on PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=str(cwd or REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=timeout,
    )


def assert_queued_are_walk_steps_or_reruns(trials) -> None:
    """What a run leaves queued (WAITING) for the next: the planned search's next trials (batch walk steps,
    one-knob steps, a repeat of a config measured within the noise of the best, the baseline moved to the walk's batch
    or fed: ``coordinate``), compile tried
    last, or the one re-run of a trial pruned far below its neighbours (``study_queue.requeue_far_pruned``; on a
    noisy VM a short trial is sometimes pruned that way, and the re-run is right)."""
    by_number = {t.number: t for t in trials}
    for t in trials:
        if t.state.name == "WAITING":
            ua = t.user_attrs
            rerun_of = by_number.get(ua.get("requeue_of"))
            planned = ua.get("batch_line") or ua.get("knob_step") or ua.get("compile_last") or ua.get("plan_step") \
                or by_number.get(ua.get("repeat_of")) is not None
            assert planned or (rerun_of is not None and rerun_of.state.name == "PRUNED"), (t.number, ua)


# --- tuners on the tiny workload (real child processes unless a fake ``runner=`` is given) -----------------

def _quick():
    from autotune import MeasureSpec

    return MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=120)


QUICK = _quick()


# the logs of the runs after the search (``choose``): the finalists' rounds and extra rounds, the confirmation, the
# worst case; a search trial's is ``trial-N.log``
_AFTER_SEARCH_LOGS = ("finalist-", "confirm-", "worst-case")


def search_run(measure, kw: dict) -> bool:
    """Whether a fake runner's call is a search trial, not a run after it (a finalist's, the confirmation's, the
    worst case's): those measure with the search's window length too (fewer windows), so their log names them."""
    name = Path(str(kw.get("log_path") or "")).name
    return not name.startswith(_AFTER_SEARCH_LOGS)


def finalist_run(measure, kw: dict) -> bool:
    """Whether a fake runner's call is one of the finalists' rounds (or their extra rounds)."""
    return Path(str(kw.get("log_path") or "")).name.startswith("finalist-")


@lru_cache(maxsize=1)
def hardware():
    """This machine, detected once per process."""
    from autotune.machine.hardware import detect

    return detect()


def tiny_space(**over):
    """Batch 8 or 16, channels_last or not (4 configs); ``over`` replaces top-level keys of the space."""
    from autotune.search.space.search_space import space_from_dict

    doc = {
        "name": "tiny", "device": "cpu",
        "parameters": {"batch_size": {"type": "int", "choices": [8, 16]},
                       "channels_last": {"type": "bool"}},
        "baseline": {"batch_size": 8, "channels_last": False},
    }
    doc.update(over)
    return space_from_dict(doc, hardware=hardware())


def make_tuner(tmp_path, model=TINY, space=None, measure=QUICK, **kw):
    """A tuner on ``model`` at 16 px with its SQLite study in ``tmp_path/t.db``."""
    from autotune import Workload
    from autotune.search.tuner import Tuner

    return Tuner(Workload(model=model, image_size=16), space=space or tiny_space(), measure=measure,
                 storage=f"sqlite:///{tmp_path}/t.db", hardware=hardware(), progress=False,
                 log=kw.pop("log", lambda m: None), finalists=kw.pop("finalists", 2),
                 finalist_rounds=kw.pop("finalist_rounds", 1), seed=0, parity_steps=kw.pop("parity_steps", 5), **kw)


# --- spaces on a chosen (fake) machine ------------------------------------------------------------------------

def fake_hw(cores: int = 4, flags: tuple[str, ...] = ("avx2", "fma"), compiler: str | None = "/usr/bin/g++",
            gpus: tuple[dict, ...] = (), visible: str | None = None, order: str | None = None):
    """The real ``Hardware`` of this machine (detected without torch) with chosen fields. Python's headers are
    there (``python_headers``), so ``compiler`` alone decides whether torch.compile is offered, whatever this
    machine has (python3-dev)."""
    return dataclasses.replace(_real_without_torch(), usable_cores=cores, affinity_cores=cores,
                               logical_cores=cores, cpu_flags=tuple(flags), compiler=compiler, gpus=tuple(gpus),
                               cuda_visible_devices=visible, cuda_device_order=order, python_headers=True)


@lru_cache(maxsize=1)
def _real_without_torch():
    from autotune.machine.hardware import detect

    return detect(with_torch=False)


def names(space) -> list[str]:
    return [p.name for p in space.params]


# --- recommendations ----------------------------------------------------------------------------------------

def plain_versions() -> dict:
    """This process's versions as plain strings (see test_fresh_versions_can_be_written_as_yaml)."""
    from autotune.provenance import versions_of

    return {k: None if v is None else str(v) for k, v in versions_of(None).items()}


def make_rec(config=None, workload=None, **over):
    """A complete Recommendation with made-up figures; ``over`` replaces fields."""
    from autotune.config import TrialConfig, Workload
    from autotune.provenance import reproduce_command
    from autotune.recommendation import Recommendation

    config = config or TrialConfig(batch_size=32, num_workers=2, prefetch_factor=4, persistent_workers=True,
                                   channels_last=True, intra_op_threads=1, inter_op_threads=1)
    workload = workload or Workload(model="resnet18", image_size=64)
    runner_up = TrialConfig(batch_size=16)
    fields = dict(
        config=config, workload=workload,
        median_samples_per_s=120.5, iqr_samples_per_s=3.25, samples_per_s=(118.0, 120.5, 123.0),
        baseline_samples_per_s=80.0, speedup_vs_baseline=1.506, peak_host_mb=1500.5, memory_cap_mb=8192.0,
        margin_vs_runner_up=0.05, noisy=False,
        hardware={"summary": "Fake CPU (2 usable cores)", "cpu": "Fake CPU", "usable_cores": 2,
                  "ram_total_mb": 16000, "gpus": []},
        fingerprint="abc123def0", versions=plain_versions(), study_name="resnet18-train-64px-synthetic-cpu-abc123def0",
        storage="sqlite:///trials/autotune.db", trial_number=7,
        runners_up=({"config": runner_up.to_dict(), "short": runner_up.short(), "median_samples_per_s": 114.7,
                     "iqr_samples_per_s": 2.0, "trial": 3},),
        notes=("a note",), reproduce=reproduce_command(workload, config, 8192.0),
        created="2025-01-02T03:04:05+00:00", provisional=False,
    )
    fields.update(over)
    return Recommendation(**fields)


def store_recommendation(tmp_path, rec) -> str:
    """A SQLite study under the name ``recommend()`` looks up for ``rec``'s workload, holding ``rec``."""
    import optuna

    from autotune.machine.hardware import detect
    from autotune.recommendation import stored_recommendation
    from autotune.search.record.storage import open_storage, study_name_for

    url = f"sqlite:///{tmp_path}/rec.db"
    name = study_name_for(rec.workload, detect().fingerprint)
    study = optuna.create_study(study_name=name, storage=open_storage(url), direction="maximize")
    study.set_user_attr("recommendation", rec.to_dict())
    assert stored_recommendation(study) == rec
    return url


def alive_pids(pids):
    """The pids still running (a zombie has exited: it is only waiting to be reaped)."""
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive
