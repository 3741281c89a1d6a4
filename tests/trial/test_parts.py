"""Each ceiling alone in a real trial child (autotune.trial.parts): the data path with no model, the model on one
batch already on the device, over JPEGs really decoded by PIL (tests/heavy_data_workloads.py); a data path that
fails alone is the workload's failure, with its own message, named as the data path's."""

from __future__ import annotations

import pytest

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig
from autotune.trial.runner import run_trial

SPEC = MeasureSpec(windows=2, window_s=0.3, settle_windows=0, timeout_s=120, memory_cap_mb=4096.0)
HEAVY = Workload(model="tests.heavy_data_workloads:build", image_size=32)


@pytest.fixture(scope="module")
def alone():
    """The model alone and the data path alone (one worker, persistent), each in its own child."""
    model = run_trial(HEAVY, TrialConfig(batch_size=16, intra_op_threads=1), SPEC.replace(part="model"))
    data = run_trial(HEAVY, TrialConfig(batch_size=16, num_workers=1, persistent_workers=True, intra_op_threads=1),
                     SPEC.replace(part="data"))
    return model, data


def test_the_model_alone_never_waits_for_data_and_outruns_the_data_path(alone):
    model, data = alone
    assert model.status == "ok" and data.status == "ok", (model.reason, data.reason)
    assert len(model.samples_per_s) == 2 and len(data.samples_per_s) == 2  # the trial's own windows
    assert model.data_wait_share < 0.2  # the batch is on the device already: no loader in its steps
    # a few hundred parameters against a JPEG decode per sample: the model alone is many times faster
    assert model.median_samples_per_s > 5 * data.median_samples_per_s


def test_the_data_path_alone_reports_the_cores_its_workers_kept_busy(alone):
    _, data = alone
    assert data.data_wait_share > 0.5  # its "step" only copies the batch: nearly all of it is the loader
    assert data.cpu_cores_used is not None and 0.3 < data.cpu_cores_used < 2.5  # the one worker decoding


def test_a_data_path_that_fails_alone_says_so_with_the_workloads_message():
    r = run_trial(Workload(model="tests.heavy_data_workloads:bad_collate", image_size=32),
                  TrialConfig(batch_size=8, intra_op_threads=1), SPEC.replace(part="data"))
    assert r.status == "error" and r.user_error
    assert r.reason.startswith("WorkloadError: the data path alone (the workload's DataLoader, 0 worker(s), no model) "
                               "failed: ValueError: labels of mixed types: cannot stack"), r.reason


def test_a_worker_that_dies_is_a_failed_point_not_the_workloads_error():
    """A DataLoader worker killed by a signal (the OOM killer's way) may be the config's doing (more workers, more
    memory): the data path's point fails, and nothing says the workload is wrong."""
    r = run_trial(Workload(model="tests.study_fixtures:worker_killer", image_size=16),
                  TrialConfig(batch_size=8, num_workers=1, intra_op_threads=1), SPEC.replace(part="data"))
    assert r.status in ("error", "crashed") and not r.user_error, (r.status, r.reason)
    assert "DataLoader worker" in r.reason
