"""The examples run, on tiny settings, so they never rot.

* ``examples/custom_workload.py`` through the real CLI (``autotune trial`` in a subprocess);
* ``examples/train_with_recommend.py`` answering from a seeded study (fast, always run), and end to end: a
  real tiny study, then a second run that must answer from the stored recommendation (slow: > 60 s);
* ``examples/adamw_dict_batches.py`` (the user's own AdamW step, dict batches, collate and count): one trial
  through the CLI, and tuned end to end through ``autotune.tune()`` (slow). That AdamW's peak is above SGD's
  and that the count is what the throughput counts is asserted in ``test_contract.py``;
* a global batch: ``train_with_recommend.py --global-batch`` accumulating from a seeded study (fast), and
  ``examples/custom_workload.py`` measured with ``--global-batch 16 --batch-size 4`` through the CLI (slow).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import optuna
import pytest

from autotune.config import TrialConfig, Workload
from autotune.machine.hardware import detect

from tests.helpers import REPO_ROOT, run_cli

EXAMPLE = REPO_ROOT / "examples" / "train_with_recommend.py"
FINAL_LOSS = re.compile(r"final loss (\d+\.\d+|nan) after (\d+) steps; [\d.]+ steps/s")
EVAL = re.compile(r"eval: (\d+)/(\d+) held-out images right \(model\.eval\(\), torch\.inference_mode\(\)\)")


def run_example(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE), *args], cwd=str(REPO_ROOT), env=dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def n_trials(url: str) -> int:
    names = optuna.study.get_all_study_names(url)
    assert len(names) == 1, names
    return len(optuna.load_study(study_name=names[0], storage=url).trials)


# --- custom_workload ---------------------------------------------------------------------------------------

def test_custom_workload_builds_model_dataset_and_loss():
    import torch

    from examples.custom_workload import build

    model, dataset, loss_fn = build(image_size=32, task="train")
    x, y = dataset[5]
    assert x.shape == (3, 32, 32) and 0 <= y < 10
    assert torch.equal(dataset[5][0], x)  # an item is always the same image
    out = model(x.unsqueeze(0))
    assert out.shape == (1, 10)
    assert loss_fn(out, torch.tensor([y])).item() > 0
    with pytest.raises(ValueError, match="task"):
        build(image_size=32, task="eval")


# slow: a CLI trial of the example (12 s); by default the example builds in
# test_custom_workload_builds_model_dataset_and_loss and a real `autotune trial --format json` of a user's
# module:callable runs in test_security.py::test_a_trial_does_not_import_modules_planted_in_the_working_folder
@pytest.mark.slow
def test_custom_workload_trial_via_the_cli():
    r = run_cli("trial", "--model", "examples.custom_workload:build", "--image-size", "32", "--batch-size", "8",
                "--windows", "2", "--window-seconds", "0.2", "--device", "cpu", "--format", "json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["result"]["status"] == "ok", out["result"].get("reason")
    assert len(out["result"]["samples_per_s"]) == 2
    assert out["workload"]["model"] == "examples.custom_workload:build"
    assert out["result"]["final_loss"] is not None


# --- train_with_recommend ----------------------------------------------------------------------------------

# slow: the example whole (resnet18 built, a restart with the launch environment, 15 s); by default recommend()
# answering from the store is test_recommend.py::test_recommend_answers_from_the_stored_recommendation and what
# to export before start test_recommend.py::test_launch_env_and_yaml_say_what_to_export_before_start
@pytest.mark.slow
@pytest.mark.skipif(bool(detect(with_torch=False).gpus), reason="the seeded study is for the CPU")
def test_train_example_answers_from_a_stored_recommendation(tmp_path):
    """Seed the study the example will look up with a recommendation: no trial runs, the loop trains."""
    from autotune.provenance import reproduce_command, versions_of
    from autotune.recommendation import Recommendation
    from autotune.search.record.storage import open_storage, study_name_for

    workload = Workload(model="resnet18", image_size=32, device="cpu")
    config = TrialConfig(batch_size=4, num_workers=1, prefetch_factor=2, channels_last=True, intra_op_threads=1,
                         malloc="hugepages")
    hw = detect()
    rec = Recommendation(
        config=config, workload=workload, median_samples_per_s=100.0, iqr_samples_per_s=1.0,
        samples_per_s=(99.0, 100.0, 101.0), baseline_samples_per_s=50.0, speedup_vs_baseline=2.0,
        peak_host_mb=900.0, memory_cap_mb=4096.0, margin_vs_runner_up=None, noisy=False,
        hardware={"summary": hw.summary_line()}, fingerprint=hw.fingerprint,
        versions={k: None if v is None else str(v) for k, v in versions_of(None).items()},
        study_name=study_name_for(workload, hw.fingerprint), storage="", trial_number=0,
        reproduce=reproduce_command(workload, config, 4096.0), created="2025-01-01T00:00:00+00:00")
    url = f"sqlite:///{tmp_path}/seeded.db"
    study = optuna.create_study(study_name=rec.study_name, storage=open_storage(url), direction="maximize")
    study.set_user_attr("recommendation", rec.to_dict())

    r = run_example("--model", "resnet18", "--image-size", "32", "--steps", "3", "--storage", url, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recommendation from cache (no new trials)" in r.stdout
    assert "recommended: bs=4 w=1 pf=2 cl malloc=hugepages t=1/-" in r.stdout
    # settings read at start-up (threads, glibc malloc, PyTorch's huge-page switch): restarted once with them,
    # so apply() had nothing left to warn about
    restarts = [ln for ln in r.stdout.splitlines() if ln.startswith("restarting with ")]
    assert len(restarts) == 1, r.stdout
    assert "OMP_NUM_THREADS=1" in restarts[0] and "THP_MEM_ALLOC_ENABLE=1" in restarts[0]
    assert "not fully applied" not in r.stderr, r.stderr[-2000:]
    m = FINAL_LOSS.search(r.stdout)
    assert m and m.group(2) == "3", r.stdout
    m = EVAL.search(r.stdout)  # and then predicted in eval mode without autograd: two held-out batches of 4
    assert m and m.group(2) == "8" and 0 <= int(m.group(1)) <= 8, r.stdout
    assert n_trials(url) == 0


TINY_SPACE = """\
    name: tiny
    device: cpu
    parameters:
      batch_size: {type: int, choices: [4, 8]}
      num_workers: {type: int, low: 0, high: 0}
      amp: {type: categorical, choices: ["off"]}
      channels_last: {type: bool}
    baseline:
      batch_size: 4
    """


# 40-90 s on 2 cores (two trials + two finalist rounds of resnet18); the seeded test above covers the loop
@pytest.mark.slow
def test_train_example_tunes_then_answers_from_the_cache(tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(textwrap.dedent(TINY_SPACE))
    url = f"sqlite:///{tmp_path}/a.db"
    args = ("--model", "resnet18", "--image-size", "32", "--trials", "2", "--steps", "3", "--storage", url,
            "--space", str(space), "--quick")

    r = run_example(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recommendation freshly measured" in r.stdout
    assert "recommended: bs=" in r.stdout
    assert FINAL_LOSS.search(r.stdout) and EVAL.search(r.stdout), r.stdout
    before = n_trials(url)
    assert before >= 2

    t0 = time.monotonic()
    r2 = run_example(*args, timeout=300)
    took = time.monotonic() - t0
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "recommendation from cache (no new trials)" in r2.stdout
    assert FINAL_LOSS.search(r2.stdout), r2.stdout
    assert n_trials(url) == before  # the stored recommendation was reused: no new trial
    # same recommendation both times
    assert r.stdout.splitlines()[1] == r2.stdout.splitlines()[1]
    assert took < 120, took


# --- adamw_dict_batches --------------------------------------------------------------------------------------

ADAMW = REPO_ROOT / "examples" / "adamw_dict_batches.py"


@pytest.mark.slow  # a child and the CLI: 10-26 s on 2 shared cores; test_contract checks the parts in-process
def test_adamw_example_trial_measures_the_users_parts_via_the_cli():
    r = run_cli("trial", "--model", "examples.adamw_dict_batches:build", "--image-size", "32", "--batch-size", "8",
                "--windows", "2", "--window-seconds", "0.2", "--device", "cpu", "--format", "json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)["result"]
    assert result["status"] == "ok", result.get("reason")
    assert result["user_parts"] == ["optimizer", "collate_fn", "step", "count"]
    assert result["samples_per_step"] == 8  # the example's count: the labels in a batch
    assert result["final_loss"] is not None


@pytest.mark.slow  # a child and the CLI, ~10 s
def test_a_bad_part_is_a_one_line_usage_error_in_the_cli():
    r = run_cli("trial", "--model", "tests.workloads_fixtures:step_returns_none", "--image-size", "32",
                "--batch-size", "8", "--windows", "1", "--window-seconds", "0.2", "--device", "cpu", timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    last = r.stderr.strip().splitlines()[-1]
    assert "step returned NoneType, not a tensor" in last and "Traceback" not in r.stderr


ADAMW_SPACE = """\
    name: tiny
    device: cpu
    parameters:
      batch_size: {type: int, choices: [8, 16]}
      num_workers: {type: int, low: 0, high: 0}
      amp: {type: categorical, choices: ["off"]}
    baseline:
      batch_size: 8
    """


@pytest.mark.slow  # a tiny study (2 trials and the finalists' rounds): 40-90 s on 2 shared cores
def test_adamw_example_tunes_its_own_step_through_tune(tmp_path):
    from autotune.recommendation import stored_recommendation

    space = tmp_path / "tiny.yaml"
    space.write_text(textwrap.dedent(ADAMW_SPACE))
    url = f"sqlite:///{tmp_path}/adamw.db"
    r = subprocess.run([sys.executable, str(ADAMW), "--trials", "2", "--steps", "3", "--storage", url,
                        "--space", str(space), "--quick"], cwd=str(REPO_ROOT), env=dict(os.environ),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "user parts: optimizer, collate_fn, step, count" in r.stdout
    assert "measured with the workload's own optimizer, collate_fn, step, count" in r.stdout
    assert re.search(r"final loss \d+\.\d+ after 3 steps", r.stdout), r.stdout
    names = optuna.study.get_all_study_names(url)
    study = optuna.load_study(study_name=names[0], storage=url)
    rec = stored_recommendation(study)
    assert rec.workload.model == "examples.adamw_dict_batches:build"  # named by reference from __main__
    assert rec.user_parts == ("optimizer", "collate_fn", "step", "count")
    measured = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert measured and all(t.user_attrs["user_parts"] == list(rec.user_parts) for t in measured)


# --- a global batch (issue 14 item 3) -------------------------------------------------------------------------

# slow: a real run of the example; by default the example runs in
# test_train_example_answers_from_a_stored_recommendation and a real trial accumulates to the global batch in
# workloads/test_global_batch.py
@pytest.mark.slow
@pytest.mark.skipif(bool(detect(with_torch=False).gpus), reason="the seeded study is for the CPU")
def test_train_example_accumulates_to_the_global_batch(tmp_path):
    """A stored recommendation for global batch 32 with micro-batch 16 (the shipped space's smallest): the
    example's loop takes an optimizer step every run.accumulation_steps (2) micro-batches."""
    from autotune.provenance import reproduce_command, versions_of
    from autotune.recommendation import Recommendation
    from autotune.search.record.storage import open_storage, study_name_for

    workload = Workload(model="resnet18", image_size=32, device="cpu", global_batch=32)
    config = TrialConfig(batch_size=16)
    hw = detect()
    rec = Recommendation(
        config=config, workload=workload, median_samples_per_s=100.0, iqr_samples_per_s=1.0,
        samples_per_s=(100.0,), baseline_samples_per_s=None, speedup_vs_baseline=None, peak_host_mb=900.0,
        memory_cap_mb=4096.0, margin_vs_runner_up=None, noisy=False, hardware={"summary": hw.summary_line()},
        fingerprint=hw.fingerprint, versions={k: None if v is None else str(v) for k, v in versions_of(None).items()},
        study_name=study_name_for(workload, hw.fingerprint), storage="", trial_number=0,
        reproduce=reproduce_command(workload, config, 4096.0), created="2025-01-01T00:00:00+00:00")
    url = f"sqlite:///{tmp_path}/seeded.db"
    study = optuna.create_study(study_name=rec.study_name, storage=open_storage(url), direction="maximize")
    study.set_user_attr("recommendation", rec.to_dict())

    r = run_example("--model", "resnet18", "--image-size", "32", "--steps", "3", "--global-batch", "32",
                    "--storage", url, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recommendation from cache (no new trials)" in r.stdout
    assert "micro-batch 16 \u00d7 2 accumulation steps = global batch 32" in r.stdout
    assert "3 optimizer steps of 2 micro-batches of 16 = 32 samples each" in r.stdout
    m = FINAL_LOSS.search(r.stdout)
    assert m and m.group(2) == "3", r.stdout
    assert n_trials(url) == 0


@pytest.mark.slow  # a child and the CLI: 10-30 s on 2 shared cores; test_global_batch runs a real trial in-process
def test_custom_workload_global_batch_trial_via_the_cli():
    r = run_cli("trial", "--model", "examples.custom_workload:build", "--image-size", "32", "--batch-size", "4",
                "--global-batch", "16", "--windows", "2", "--window-seconds", "0.2", "--device", "cpu",
                "--format", "json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["workload"]["global_batch"] == 16
    assert out["result"]["status"] == "ok", out["result"].get("reason")
    assert out["result"]["samples_per_step"] == 16  # a step is an optimizer step: 4 micro-batches of 4
