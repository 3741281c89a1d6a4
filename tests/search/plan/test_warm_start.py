"""The warm start: a new study's first trials include the winners of earlier studies on the same hardware,
mapped into its space; other machines' studies are never read; a resumed study queues nothing twice."""

from __future__ import annotations

import dataclasses
import shutil
from types import SimpleNamespace

import optuna
import pytest

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig, TrialResult
from autotune.machine.hardware import detect
from autotune.search.space.search_space import space_from_dict
from autotune.search.tuner import Tuner
from autotune.search.plan.warm_start import earlier_winners, params_for

QUICK = MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=120,
                    memory_cap_mb=4096.0)
HW = detect()


def _space(batches, baseline_batch, *, cudnn=False):
    params = {"batch_size": {"type": "int", "choices": list(batches)}, "channels_last": {"type": "bool"}}
    baseline = {"batch_size": baseline_batch, "channels_last": False}
    if cudnn:  # a bool no CPU trims away: a knob study A searches and study B does not
        params["cudnn_benchmark"] = {"type": "bool"}
        baseline["cudnn_benchmark"] = False
    return space_from_dict({"name": "t", "device": "cpu", "parameters": params, "baseline": baseline}, hardware=HW)


def _fake(workload, config, measure, **kw):
    """Larger batches are faster, channels_last slower, cudnn_benchmark a little faster: A's best is
    batch 32, channels_last off, cudnn_benchmark on (neither the baseline nor the likely winner)."""
    v = config.batch_size - 10.0 * config.channels_last + 5.0 * config.cudnn_benchmark + 100.0
    return TrialResult(status="ok", samples_per_s=(v, v, v), wall_s=1.0, peak_host_mb=10.0,
                       batch_size=config.batch_size)


def _tuner(tmp_path, image_size, space, hardware=HW, **kw):
    return Tuner(Workload(model="tests.workloads_fixtures:tiny", image_size=image_size), space=space,
                 measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db", hardware=hardware, progress=False,
                 log=kw.pop("log", lambda m: None), finalists=2, finalist_rounds=1, seed=0, parity_steps=0,
                 patience=0, runner=_fake, **kw)


@pytest.fixture(scope="module")
def study_a_db(tmp_path_factory):
    """Workload A (16 px) run once to a recommendation over batch 8/16/32 x channels_last x cudnn_benchmark; each
    test gets a copy of its database (``_study_a``), as B's study is written into the same storage."""
    root = tmp_path_factory.mktemp("study-a")
    a = _tuner(root, 16, _space((8, 16, 32), 8, cudnn=True))
    rec = a.run(trials=12)
    assert rec.config.key() == TrialConfig(batch_size=32, channels_last=False, cudnn_benchmark=True).key()
    return root / "t.db", SimpleNamespace(study_name=a.study_name), rec


def _study_a(tmp_path, study_a_db):
    """Study A in ``tmp_path/t.db`` (a copy of the one made once): ``(a, rec)``, ``a.study_name`` its name."""
    db, a, rec = study_a_db
    shutil.copyfile(db, tmp_path / "t.db")
    return a, rec


def _space_b():
    return _space((12, 24, 48), 12)  # no cudnn_benchmark here; 32 is not a choice


def _first(study, n):
    out = []
    for t in study.trials[:n]:
        params = t.params or t.system_attrs["fixed_params"]
        out.append((params, t.user_attrs.get("warm_start_from")))
    return out


def test_a_new_study_on_the_same_hardware_queues_the_earlier_winner_mapped_into_its_space(tmp_path, study_a_db):
    a, rec = _study_a(tmp_path, study_a_db)
    logs: list[str] = []
    b = _tuner(tmp_path, 32, _space_b(), log=logs.append)  # workload B: another image size, another space
    b.prepare(b.study())
    label = f"{a.study_name} #{rec.trial_number}"
    # baseline, likely winner, then A's winner: batch 32 -> 24 (nearest; 48 is farther), channels_last kept,
    # cudnn_benchmark not searched here: left out; the planned search queues the rest (the batch walk from the
    # best config so far) once the baseline and the likely winner are measured
    assert _first(b.study(), 4) == [({"batch_size": 12, "channels_last": False}, None),
                                    ({"batch_size": 12, "channels_last": True}, None),
                                    ({"batch_size": 24, "channels_last": False}, label)]
    warm = b.study().trials[2]
    assert warm.user_attrs["queued_config"] == TrialConfig(batch_size=24, channels_last=False).to_dict()
    assert any("warm start" in m and a.study_name in m for m in logs)
    b.run(trials=3)  # measured like any trial; `show` names its role
    from autotune.search.record.trials import trial_rows

    row = next(r for r in trial_rows(b.study()) if r["trial"] == 2)
    assert row["status"] == "ok" and row["role"] == f"warm start: {a.study_name[: -len(HW.fingerprint) - 1]} " \
                                                   f"#{rec.trial_number}"


def test_warm_start_reads_only_studies_of_this_hardware_and_device(tmp_path):
    other_hw = dataclasses.replace(HW, cpu_model=HW.cpu_model + " (another machine)")
    assert other_hw.fingerprint != HW.fingerprint
    elsewhere = _tuner(tmp_path, 16, _space((8, 16, 32), 8, cudnn=True), hardware=other_hw)
    elsewhere.run(trials=12)  # a recommendation measured on another machine, in the same storage
    assert elsewhere.study().user_attrs["recommendation"] is not None
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/t.db")
    gpu = optuna.create_study(storage=storage, study_name="gpu-study")  # this machine, but a GPU study
    gpu.set_user_attr("fingerprint", HW.fingerprint)
    gpu.set_user_attr("workload", Workload(device="cuda").to_dict())
    gpu.set_user_attr("recommendation", {"config": TrialConfig(batch_size=48).to_dict(),
                                         "hardware": {"fingerprint": HW.fingerprint}, "provenance": {"trial": 0}})
    b = _tuner(tmp_path, 32, _space_b())
    b.prepare(b.study())
    assert earlier_winners(b.storage, fingerprint=HW.fingerprint, device="cpu", exclude=b.study_name) == []
    assert not any(t.user_attrs.get("warm_start_from") for t in b.study().trials)


def test_a_resumed_study_queues_its_warm_start_once(tmp_path, study_a_db):
    a, _ = _study_a(tmp_path, study_a_db)
    b = _tuner(tmp_path, 32, _space_b())
    study = b.study()
    b.prepare(study)
    n = len(study.trials)
    study.set_user_attr("batch_walk_anchor", None)  # as if killed before the first trials were all queued
    b.prepare(study)
    assert len(study.trials) == n
    b.run(trials=4)
    again = _tuner(tmp_path, 32, _space_b())  # a later run of the same study (another process would do this)
    again.run(trials=1)
    warm = [t for t in again.study().trials if t.user_attrs.get("warm_start_from")]
    assert len(warm) == 1 and warm[0].state.name == "COMPLETE"


def test_warm_start_off_queues_none(tmp_path, study_a_db):
    _study_a(tmp_path, study_a_db)
    b = _tuner(tmp_path, 32, _space_b(), warm_start=False)
    b.prepare(b.study())
    assert not any(t.user_attrs.get("warm_start_from") for t in b.study().trials)


def test_a_winner_equal_to_a_queued_trial_is_not_queued_again(tmp_path, study_a_db):
    """A's winner (batch 32) mapped into a space of batch 12 or 64 without channels_last is batch 12: the
    baseline, so it is not queued a second time."""
    _study_a(tmp_path, study_a_db)
    only = space_from_dict({"name": "t", "device": "cpu",
                            "parameters": {"batch_size": {"type": "int", "choices": [12, 64]}},
                            "baseline": {"batch_size": 12}}, hardware=HW)
    b = _tuner(tmp_path, 32, only)
    b.prepare(b.study())
    assert [t.user_attrs.get("warm_start_from") for t in b.study().trials].count(None) == len(b.study().trials)


def test_params_for_maps_each_knob_to_the_nearest_allowed_value():
    space = space_from_dict({"name": "t", "device": "cpu", "oversubscribe": True, "parameters": {
        "batch_size": {"type": "int", "choices": [16, 64, 256]},
        "num_workers": {"type": "int", "choices": [0, 1]},
        "prefetch_factor": {"type": "int", "choices": [2, 4], "when": "num_workers > 0"},
        "amp": {"type": "categorical", "choices": ["off"]},
        "inter_op_threads": {"type": "int", "choices": [1]}},
        "baseline": {"batch_size": 64, "num_workers": 0, "amp": "off", "inter_op_threads": 1}}, hardware=HW)
    # 40 is as near 16 as 64: the smaller; bf16 is not offered; None threads: the baseline's
    assert params_for(TrialConfig(batch_size=40, num_workers=3, prefetch_factor=4, amp="bf16"), space) == \
        {"batch_size": 16, "num_workers": 1, "prefetch_factor": 4, "amp": "off", "inter_op_threads": 1}
    assert params_for(TrialConfig(batch_size=1000, num_workers=0), space) == \
        {"batch_size": 256, "num_workers": 0, "amp": "off", "inter_op_threads": 1}
