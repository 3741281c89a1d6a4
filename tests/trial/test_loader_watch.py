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


# --- issue 52: variable lengths whose first items are short (items 1 and 13) ---------------------------------------

TAIL = "tests.long_tail_workloads"


def test_the_probe_sizes_a_padded_batch_by_its_longest_items_not_its_first():
    """Item 1: lengths ``[10] * 4 + [512] * 1000`` with a padding collate. The first 4 items made a batch of 64 look
    1/50 of its size; the probe now sizes it on the longest items, which bound every real batch of 64."""
    import torch

    from autotune.workloads.build import build
    from autotune.workloads.probe import probe
    from tests.long_tail_workloads import pad

    built = build(Workload(model=f"{TAIL}:short_first"))
    data = probe(built)
    estimate, tensors = footprint_at(data, 64)
    real = next(iter(torch.utils.data.DataLoader(built.dataset, batch_size=64, shuffle=True, collate_fn=pad,
                                                 generator=torch.Generator().manual_seed(0))))
    assert batch_footprint(real) == (64 * 512 * 256 * 4 + 64 * 8, 2)  # 32 MiB: padded to 512
    assert (estimate, tensors) == batch_footprint(real)
    assert data["footprint"]["source"] == "longest" and data["lengths"] == {"min": 10, "max": 10}
    unsized = probe(build(Workload(model=f"{TAIL}:short_first_unsized")))
    assert unsized["footprint"]["source"] == "first"  # no length: a floor only, the trial measures a full batch


_TAIL_TRIALS = f"""
import json, time
from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig
from autotune.trial.runner import run_trial
out = []
for name in ("short_first_unsized", "short_batch_first"):
    t = time.monotonic()
    r = run_trial(Workload(model="{TAIL}:" + name), TrialConfig(batch_size=64, num_workers=2, prefetch_factor=2),
                  MeasureSpec(windows=2, window_s=0.3, timeout_s=120))
    out.append([r.status, r.reason, r.wall_s])
print(json.dumps(out))
"""


@pytest.mark.slow  # two real trials under unshare (~8 s alone, ~30 s loaded)
def test_a_loader_that_overflows_dev_shm_ends_the_trial_as_shm_within_seconds():
    """Item 13, under a real 64 MiB /dev/shm: 2 workers x prefetch 2 of padded batches of 32 MiB.

    * no ``length``, the first items short: the trial collates a full batch of 64 before its workers start and
      ends ``shm`` there (was: its workers filled /dev/shm and the trial hung until its time limit);
    * a full batch of the first items short as well (``[10] * 64 + [512] * 1000``): only a batch the shuffled loader
      draws overflows; its worker's queue prints the error and drops the batch, and the parent, reading the log,
      ends the trial ``shm`` 2 s later (was: 0% CPU until the 120 s limit, status timeout)."""
    import json

    out = under_small_shm(f"{sys.executable} -c '{_TAIL_TRIALS}'")
    assert out.returncode == 0, out.stderr[-2000:]
    (pre, pre_reason, pre_s), (lost, lost_reason, lost_s) = json.loads(out.stdout.strip().splitlines()[-1])
    assert pre == "shm" and pre_reason.startswith(
        "DataLoader worker ran out of shared memory (/dev/shm 64.0 MiB free; this loader needs ~160 MiB in flight: "
        "2 worker(s) x prefetch_factor 2 + 1 batches of 32.0 MiB): a full batch of 64"), pre_reason
    assert lost == "shm" and "a worker's queue lost a batch" in lost_reason, lost_reason
    assert "unable to allocate shared memory(shm)" in lost_reason and "No space left on device" in lost_reason
    assert max(pre_s, lost_s) < 60, (pre_s, lost_s)  # the child's start and torch's import, then seconds


_USER_LOOP = f"""
import time, torch
import autotune.machine.loader_memory as rule
from autotune.config import TrialConfig
from tests.helpers import make_rec
from {TAIL} import pad, short_batch_first
rule.LOADER_TIMEOUT_S = 5  # patience for a test; the product waits 300 s
kw = make_rec(config=TrialConfig(batch_size=64, num_workers=2, prefetch_factor=2)).dataloader_kwargs()
loader = torch.utils.data.DataLoader(short_batch_first()["dataset"], shuffle=True, collate_fn=pad, **kw)
t = time.monotonic()
try:
    for batch in loader:
        pass
    print("FINISHED")
except RuntimeError as exc:
    print(f"RAISED after {{time.monotonic() - t:.0f}} s: {{exc}}")
"""


@pytest.mark.slow  # a loop that waits out a 5 s DataLoader timeout
def test_the_users_loop_with_dataloader_kwargs_ends_instead_of_hanging_on_a_lost_batch():
    """Item 13, the user's side: the same overflow in a plain loop over ``rec.dataloader_kwargs()`` (whose estimate
    the first items made too small to refuse it) raises torch's "DataLoader timed out" (was: waited for ever)."""
    out = under_small_shm(f"{sys.executable} -c '{_USER_LOOP}'", timeout=120)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert last.startswith("RAISED after") and "DataLoader timed out after 5 seconds" in last, last
