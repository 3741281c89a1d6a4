"""A fixed global batch (issue 14 item 3): micro-batches that divide it, gradient accumulation in the trial,
both numbers in the recommendation, and a one-line error when no candidate divides it."""

from __future__ import annotations

import json
import textwrap

import pytest

from autotune import MeasureSpec, Recommendation, Workload
from autotune.config import TrialConfig, TrialResult
from autotune.errors import ConfigError
from autotune.workloads.global_batch import accumulation_steps, describe, restrict_space
from autotune.machine.hardware import detect
from autotune.provenance import reproduce_command
from autotune.search.space.search_space import space_from_dict
from autotune.search.record.storage import study_name_for
from autotune.search.tuner import Tuner

from tests.helpers import run_cli

HW = detect()
QUICK = MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=300)


def _space(batch: dict, baseline: int | None = None):
    doc = {"name": "tiny", "device": "cpu",
           "parameters": {"batch_size": {"type": "int", **batch}, "channels_last": {"type": "bool"}}}
    if baseline is not None:
        doc["baseline"] = {"batch_size": baseline}
    return space_from_dict(doc, hardware=HW)


# --- the space and the records -------------------------------------------------------------------------------

def test_the_space_keeps_only_the_batch_sizes_that_divide_the_global_batch():
    sp = restrict_space(_space({"choices": [4, 8, 12, 16, 32]}, baseline=12), 16)
    p = next(p for p in sp.params if p.name == "batch_size")
    assert p.choices == (4, 8, 16)
    assert sp.baseline["batch_size"] == 8  # the largest divisor below the file's baseline
    assert any("batch_size [12, 32] dropped" in n and "global batch 16" in n for n in sp.notes)
    assert restrict_space(sp, 16).to_dict() == sp.to_dict()  # idempotent
    assert restrict_space(sp, None) is sp
    # the batch walk steps through the divisors only
    assert sp.batch_step({"batch_size": 8}, +1) == {"batch_size": 16}
    assert sp.batch_step({"batch_size": 16}, +1) is None
    assert sp.batch_step({"batch_size": 4}, -1) is None
    # a low/high range keeps the divisors inside it
    ranged = restrict_space(_space({"low": 2, "high": 40}), 24)
    assert next(p for p in ranged.params if p.name == "batch_size").choices == (2, 3, 4, 6, 8, 12, 24)
    assert ranged.batch_step({"batch_size": 6}, +1) == {"batch_size": 8}


def test_no_batch_size_that_divides_the_global_batch_is_a_one_line_error():
    with pytest.raises(ConfigError) as e:
        restrict_space(_space({"choices": [32, 64]}), 48)
    msg = str(e.value)
    assert "global batch 48" in msg and "32, 64" in msg and "\n" not in msg
    # a fixed batch size that does not divide it
    doc = {"name": "f", "device": "cpu", "parameters": {"channels_last": {"type": "bool"}},
           "fixed": {"batch_size": 12}}
    with pytest.raises(ConfigError, match="batch_size=12 does not divide the global batch 16"):
        restrict_space(space_from_dict(doc, hardware=HW), 16)


def test_accumulation_steps_and_the_workload_field():
    assert accumulation_steps(256, 32) == 8 and accumulation_steps(None, 32) == 1 and accumulation_steps(8, 8) == 1
    with pytest.raises(ConfigError, match="does not divide"):
        accumulation_steps(16, 5)
    assert describe(32, 256) == "micro-batch 32 \u00d7 8 accumulation steps = global batch 256"
    with pytest.raises(ConfigError, match="global_batch"):
        Workload(global_batch=0)
    with pytest.raises(ConfigError, match="only with task=train"):
        Workload(task="infer", global_batch=64)
    w = Workload(model="resnet18", image_size=32, global_batch=256)
    assert Workload.from_dict(w.to_dict()) == w
    assert Workload.from_dict({"model": "resnet18"}).global_batch is None  # records from before the field
    # part of the study's identity: never mixed with the study without it
    assert study_name_for(w, "fp") == "resnet18-train-32px-synthetic-cpu-gb256-fp"
    assert study_name_for(w.replace(global_batch=None), "fp") == "resnet18-train-32px-synthetic-cpu-fp"


# --- the child: an optimizer step every accumulation_steps micro-batches ---------------------------------------

def test_a_user_step_accumulates_through_the_context():
    """In-process: the contract's ctx counts the micro-batches; optimizer_step acts on the last one only."""
    import torch

    from autotune.machine.device import CPUDevice
    from autotune.trial.worker import make_step

    seen: list[int] = []

    def step(model, batch, optimizer, ctx):
        seen.append(ctx.micro_batch)
        loss = model(batch[0]).pow(2).mean()
        ctx.backward(loss)
        ctx.optimizer_step(optimizer)
        return loss

    class Parts:  # the parts of a built workload (workloads.Built), duck-typed
        optimizer = collate_fn = sampler = count = None

    Parts.step = staticmethod(step)
    model = torch.nn.Linear(3, 1)
    run = make_step(model, None, TrialConfig(batch_size=2), CPUDevice(), train=True, parts=Parts,
                    accumulation_steps=3)
    batch = (torch.ones(2, 3), torch.zeros(2))
    changed = []
    for _ in range(6):
        before = model.weight.detach().clone()
        out = run(batch)
        changed.append(not torch.equal(before, model.weight.detach()))
        # the gradients add up until the step, which zeroes them (set to None)
        assert (model.weight.grad is None) == changed[-1]
    assert seen == [0, 1, 2, 0, 1, 2] and out.samples == 2
    assert changed == [False, False, True, False, False, True]


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29: the suite at 317-342 s)
def test_a_real_trial_steps_the_optimizer_once_per_global_batch(tmp_path, monkeypatch):
    """A trial in a child with global batch 16, micro-batch 4: the workload's optimizer stepped once every 4
    micro-batches and zeroed the gradients only after a step; samples per step is the global batch."""
    from autotune.trial.runner import run_trial

    counts = tmp_path / "counts.json"
    monkeypatch.setenv("AUTOTUNE_TEST_COUNTS", str(counts))  # the child inherits it; the fixture writes there
    result = run_trial(Workload(model="tests.workloads_fixtures:counted", image_size=32, global_batch=16),
                       TrialConfig(batch_size=4), QUICK)
    assert result.status == "ok", result.reason
    assert result.samples_per_step == 16
    c = json.loads(counts.read_text())  # written right after an optimizer step, before its zero_grad
    assert c["optimizer_steps"] >= 4
    assert c["micro_batches"] == 4 * c["optimizer_steps"]
    assert c["zero_grads"] == c["optimizer_steps"] - 1


# --- the tuner and the recommendation ----------------------------------------------------------------------------

def test_the_tuner_tries_only_divisors_and_recommends_both_numbers(tmp_path):
    ran: list[TrialConfig] = []
    speed = {4: 10.0, 8: 20.0, 16: 30.0}

    def fake(workload, config, measure, **kw):
        assert workload.global_batch == 16
        ran.append(config)
        v = speed[config.batch_size]  # a KeyError here would be a non-divisor tried
        return TrialResult(status="ok", samples_per_s=(v, v, v), wall_s=1.0, peak_host_mb=10.0,
                           batch_size=config.batch_size)

    workload = Workload(model="tests.workloads_fixtures:tiny", image_size=16, global_batch=16)
    tuner = Tuner(workload, space=_space({"choices": [4, 8, 12, 16, 32]}, baseline=4), measure=QUICK,
                  storage=f"sqlite:///{tmp_path}/t.db", hardware=HW, progress=False, log=lambda m: None,
                  finalists=2, finalist_rounds=1, seed=0, parity_steps=0, runner=fake)
    assert tuner.study_name.endswith(f"-gb16-{HW.fingerprint}")
    rec = tuner.run(trials=6)
    assert ran and {c.batch_size for c in ran} <= {4, 8, 16}
    assert rec.global_batch == 16 and rec.config.batch_size == 16 and rec.accumulation_steps == 1
    assert "--global-batch 16" in rec.reproduce
    path = tmp_path / "rec.yaml"
    rec.to_yaml(path)
    back = Recommendation.from_yaml(path)
    assert back.global_batch == 16 and back.accumulation_steps == rec.accumulation_steps
    assert back.to_dict()["batch"] == {"micro_batch": 16, "accumulation_steps": 1, "global_batch": 16}


def test_the_recommendation_and_apply_give_the_accumulation_steps(tmp_path):
    workload = Workload(model="resnet18", image_size=32, global_batch=256)
    config = TrialConfig(batch_size=32)
    rec = Recommendation(
        config=config, workload=workload, median_samples_per_s=100.0, iqr_samples_per_s=1.0,
        samples_per_s=(100.0,), baseline_samples_per_s=None, speedup_vs_baseline=None, peak_host_mb=None,
        memory_cap_mb=None, margin_vs_runner_up=None, noisy=False, hardware={}, fingerprint="fp", versions={},
        study_name="s", storage="", trial_number=0, reproduce=reproduce_command(workload, config, None))
    assert rec.accumulation_steps == 8
    assert "micro-batch 32 \u00d7 8 accumulation steps = global batch 256" in rec.summary()
    assert "--global-batch 256" in rec.reproduce
    text = rec.to_yaml(tmp_path / "r.yaml")
    assert "accumulation_steps: 8" in text and "global_batch: 256" in text
    assert Recommendation.from_yaml(tmp_path / "r.yaml").accumulation_steps == 8
    with rec.apply() as run:
        assert run.accumulation_steps == 8
    plain = Recommendation.from_dict({**rec.to_dict(), "workload": {"model": "resnet18", "image_size": 32}})
    assert plain.global_batch is None and plain.accumulation_steps == 1
    with plain.apply() as run:
        assert run.accumulation_steps == 1


# --- the CLI: bad input is one line, exit 2 ------------------------------------------------------------------------

def test_a_global_batch_no_candidate_divides_is_one_line_exit_2(tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text(textwrap.dedent("""\
        name: tiny
        device: cpu
        parameters:
          batch_size: {type: int, choices: [4, 8]}
        """))
    cases = [("run", "--model", "tests.workloads_fixtures:tiny", "--image-size", "16", "--device", "cpu",
              "--global-batch", "10", "--space", str(space), "--storage", f"sqlite:///{tmp_path}/t.db",
              "--trials", "1"),
             ("trial", "--model", "tests.workloads_fixtures:tiny", "--image-size", "16", "--device", "cpu",
              "--global-batch", "16", "--batch-size", "5")]
    for args in cases:
        out = run_cli(*args, timeout=300)
        assert out.returncode == 2, (args, out.stderr[-1500:])
        assert "Traceback" not in out.stderr, args
        last = out.stderr.strip().splitlines()[-1]
        assert "global batch" in last and ("10" in last if args[0] == "run" else "batch_size=5" in last), last


# --- the integrations accumulate as measured ------------------------------------------------------------------------

def _rec_with_global_batch():
    from tests.helpers import make_rec

    rec = make_rec(config=TrialConfig(batch_size=16), workload=Workload(global_batch=64))
    assert rec.accumulation_steps == 4
    return rec


def test_lightning_accumulates_as_measured():
    pytest.importorskip("lightning")
    assert _rec_with_global_batch().lightning().trainer_kwargs["accumulate_grad_batches"] == 4


def test_hf_training_arguments_accumulate_as_measured():
    pytest.importorskip("transformers")
    assert _rec_with_global_batch().training_arguments()["gradient_accumulation_steps"] == 4
