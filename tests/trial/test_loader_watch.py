"""A trial's loader and its memory (autotune.trial.loader_watch): the first batch's bytes measured in a real trial
child with real DataLoader workers, and a loader that really runs out of a small /dev/shm named as such.

The small /dev/shm is real: a private mount namespace (``unshare -m``) with a 64 MiB tmpfs on /dev/shm, what
``docker run`` gives a container. It needs root (or user namespaces); elsewhere those tests skip, saying why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache

import pytest

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig
from autotune.trial.runner import run_trial
from autotune.workloads.probe import batch_footprint, footprint_at

from tests.helpers import REPO_ROOT

BIG = "tests.heavy_data_workloads:big_batches"  # ready-made float images: a batch's bytes grow with its pixels
SPEC = MeasureSpec(windows=2, window_s=0.2, settle_windows=0, timeout_s=120, memory_cap_mb=4096.0)


@lru_cache(maxsize=1)
def small_shm_refused() -> str | None:
    """Why a private 64 MiB /dev/shm cannot be made here (None: it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm && df -k /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"a private mount namespace with its own /dev/shm is not permitted here: {probe.stderr.strip()[:200]}"
    return None


def under_small_shm(command: str, *, size: str = "64m", timeout: float = 300) -> subprocess.CompletedProcess:
    """``command`` (a shell line, run from the repo root) in a private mount namespace whose /dev/shm is a ``size``
    tmpfs; skips where that cannot be made."""
    why = small_shm_refused()
    if why:
        pytest.skip(why)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs /dev/shm && {command}"],
                          cwd=str(REPO_ROOT), env=env, capture_output=True, text=True, timeout=timeout)


def test_a_batch_footprint_counts_each_storage_once_in_any_structure():
    import torch

    ids = torch.zeros(4, 57, dtype=torch.long)
    text = {"input_ids": ids, "attention_mask": ids.ne(0), "labels": ids[:, 1:], "source": ["a", "b", "c", "d"]}
    # the labels are a view of the ids (no storage of their own); strings travel pickled, not shared
    assert batch_footprint(text) == (4 * 57 * 8 + 4 * 57, 2)
    nested = ((torch.zeros(2, 3), [torch.zeros(5, dtype=torch.uint8)]), {"k": torch.zeros(1, dtype=torch.float16)})
    assert batch_footprint(nested) == (24 + 5 + 2, 3)
    per_item = [torch.zeros(3) for _ in range(4)]  # a collate that keeps a list: a descriptor per item
    assert batch_footprint(per_item) == (48, 4)


def test_the_probe_extrapolates_stacked_and_per_item_batches():
    stacked = {"footprint": {"items": [2, 4], "bytes": [2 * 600, 4 * 600], "tensors": [2, 2]}}
    listed = {"footprint": {"items": [2, 4], "bytes": [2 * 600, 4 * 600], "tensors": [2, 4]}}
    assert footprint_at(stacked, 64) == (64 * 600, 2) and footprint_at(listed, 64) == (64 * 600, 64)
    assert footprint_at({"footprint": {"items": [1], "bytes": [600], "tensors": [2]}}, 8) == (4800, 2)
    assert footprint_at(None, 8) is None and footprint_at({}, 8) is None


@pytest.fixture(scope="module")
def with_workers():
    """A real trial with one DataLoader worker over 32 px images, batch 16."""
    return run_trial(Workload(model=BIG, image_size=32),
                     TrialConfig(batch_size=16, num_workers=1, prefetch_factor=2, intra_op_threads=1), SPEC)


def test_a_trial_measures_its_first_batch_as_the_worker_shares_it(with_workers):
    r = with_workers
    assert r.status == "ok", r.reason
    # 16 x 3 x 32 x 32 float32 images and 16 int64 labels, two shared tensors
    assert (r.batch_bytes, r.batch_tensors) == (16 * 3 * 32 * 32 * 4 + 16 * 8, 2)
    assert r.figures()["batch_bytes"] == r.batch_bytes
    assert "first batch   192 MiB" not in r.describe() and "in 2 tensor(s)" in r.describe()


# the trial as `autotune trial` runs it, without the CLI's workload check (its child costs seconds): the slow test in
# tests/search/test_loader_memory_run.py goes through the CLI, whose exit code is 1 for it (a measured failure)
_TRIAL = f"""
import json
from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig
from autotune.trial.runner import run_trial
r = run_trial(Workload(model="{BIG}", image_size=224),
              TrialConfig(batch_size=64, num_workers=2, prefetch_factor=2, persistent_workers=True),
              MeasureSpec(windows=2, window_s=0.3, timeout_s=120))
print(json.dumps([r.status, r.reason]))
"""


def test_a_loader_out_of_shared_memory_is_named_with_its_own_message():
    """The issue's loader (2 workers, prefetch 2, batch 64 at 224 px: 38.5 MB a batch) in a real trial under a real
    64 MiB /dev/shm: its workers cannot hand over two batches at once. The trial ends ``shm``, its one line saying
    what ran out, how much the loader needs (the probe's estimate: it died before its first batch) and torch's own
    message."""
    import json

    out = under_small_shm(f"{sys.executable} -c '{_TRIAL}'")
    assert out.returncode == 0, out.stderr[-2000:]
    status, reason = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == "shm", reason
    assert reason.startswith("DataLoader worker ran out of shared memory (/dev/shm 64.0 MiB free; this loader needs "
                             "~184 MiB in flight: 2 worker(s) x prefetch_factor 2 + 1 batches of 36.8 MiB): "
                             "RuntimeError: "), reason
    assert "No space left on device" in reason and "RuntimeError: RuntimeError" not in reason
