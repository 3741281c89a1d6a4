"""Memory judged on the worst case, not the average batch (issue 28, item 2): before a config is recommended it
runs, in a real child under the real memory cap, on the largest batch its data can produce."""

from __future__ import annotations

import pytest
import torch

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.errors import WorkloadError
from autotune.machine.hardware import detect
from autotune.machine.limits import MIN_MEMORY_CAP_MB
from autotune.recommendation import Recommendation
from autotune.search.choose.final_checks import worst_case_measure
from autotune.workloads.build import Built, check
from autotune.workloads.worst_case import make_batch, needs_child

from tests import limits_workloads as lw
from tests.helpers import run_cli

LONG_TAIL = "tests.limits_workloads:long_tail"


# --- the batch (in this process: autotune's code over the workload's parts) ---------------------------------

def _built(**parts) -> Built:
    wl = lw.long_tail()
    return Built(wl["model"], wl["dataset"], wl["loss_fn"], collate_fn=lw.pad, length=wl["length"], **parts)


def test_the_worst_case_is_the_longest_items_by_length_padded_as_the_collate_pads():
    batch, seen = make_batch(_built(), 8)
    assert tuple(batch[0].shape) == (8, lw.LONG)  # every long item, whatever order a sampler would give them in
    assert seen["source"] == "longest" and seen["lengths"] == {"min": lw.LONG, "max": lw.LONG}
    assert seen["what"] == f"the 8 longest items (lengths {lw.LONG} to {lw.LONG})"
    _, more = make_batch(_built(), 10)  # more than the long ones: the next longest fill it
    assert more["lengths"] == {"min": lw.SHORT, "max": lw.LONG}


def test_a_workloads_own_worst_case_batch_wins_and_fixed_shapes_are_a_normal_batch():
    own = _built(worst_case_batch=lambda bs: (torch.zeros(bs, 99, dtype=torch.long), torch.zeros(bs)))
    batch, seen = make_batch(own, 3)
    assert seen["what"] == "worst_case_batch(3)" and tuple(batch[0].shape) == (3, 99)
    fixed = Built(None, torch.utils.data.TensorDataset(torch.randn(20, 3, 8, 8), torch.zeros(20)), None)
    batch, seen = make_batch(fixed, 4)
    assert seen["source"] == "normal" and tuple(batch[0].shape) == (4, 3, 8, 8)
    # only a workload with length or worst_case_batch can make a batch larger than its trials drew
    assert needs_child({"lengths": {"min": 1, "max": 9}}) and needs_child({"lengths": None, "worst_case_batch": True})
    assert not needs_child({"lengths": None, "worst_case_batch": False}) and not needs_child(None)
    with pytest.raises(WorkloadError, match=r"worst_case_batch\(2\) returned NoneType with no tensor"):
        make_batch(_built(worst_case_batch=lambda bs: None), 2)


def test_the_worst_case_run_keeps_the_trials_caps_and_is_short():
    m = MeasureSpec(memory_cap_mb=2048.0, memory_margin=0.2, device_memory_cap_mb=4096.0, windows=5, window_s=3.0)
    wc = worst_case_measure(m)
    assert wc.worst_case and (wc.memory_cap_mb, wc.memory_margin, wc.device_memory_cap_mb) == (2048.0, 0.2, 4096.0)
    assert wc.windows == 1 and wc.window_s <= 0.5 and wc.settle_windows == 0


def test_the_yaml_records_the_worst_case_and_reads_it_back():
    wc = {"source": "longest", "what": "the 8 longest items (lengths 1024 to 1024)", "peak_host_mb": 900.0,
          "usable_mb": 990.0, "fits": True, "checked_by": "a child on this batch, under the trials' caps"}
    rec = lw.make_rec(worst_case=wc)
    d = rec.to_dict()
    assert d["worst_case"] == wc and Recommendation.from_dict(d) == rec
    assert "worst case: the 8 longest items (lengths 1024 to 1024): peak 900 MiB" in rec.summary()


# --- bad input: one line, exit 2, from the real CLI -----------------------------------------------------------

@pytest.mark.slow  # a check child: ~5-10 s on 2 shared cores
@pytest.mark.parametrize("model, says", [
    ("tests.limits_workloads:rejected_worst_case", "the model rejects the workload's worst_case_batch(4): IndexError"),
    ("tests.limits_workloads:unlike_worst_case", "worst_case_batch(4) gives a batch unlike its data's"),
])
def test_a_worst_case_batch_the_model_rejects_is_one_line_and_exit_2(model, says):
    out = run_cli("trial", "--model", model, "--batch-size", "4", "--device", "cpu", "--windows", "1")
    err = out.stderr.strip()
    assert out.returncode == 2 and says in err and "\n" not in err, err
    assert err.startswith("autotune trial: error:")


@pytest.mark.slow  # one real child: ~5 s
def test_a_worst_case_batch_rejected_inside_the_users_step_fails_the_worst_case_child_as_the_workloads_fault():
    from autotune.trial.runner import run_trial

    res = run_trial(Workload(model="tests.limits_workloads:rejected_in_the_step", image_size=32),
                    TrialConfig(batch_size=2, intra_op_threads=1),
                    worst_case_measure(MeasureSpec(window_s=0.2, timeout_s=120)))
    assert res.user_error and "the model rejects worst_case_batch(2)" in res.reason and "IndexError" in res.reason


# --- the tuner: refused on the worst case, what the average batch allows ---------------------------------------

@pytest.mark.slow  # 6-7 real children: ~40-60 s on 2 shared cores
def test_a_config_whose_longest_batch_is_over_the_cap_is_refused_though_its_trials_fit(tmp_path):
    from autotune.search.space.search_space import space_from_dict
    from autotune.search.tuner import Tuner
    from autotune.trial.runner import run_trial

    hw = detect()
    workload = check(Workload(model=LONG_TAIL, image_size=32))
    assert workload.data["lengths"] == {"min": lw.SHORT, "max": lw.SHORT}  # the first batch shows short ones only
    quick = MeasureSpec(windows=2, window_s=0.3, timeout_s=120)
    # the cap from this machine's own child: room for a normal batch of 8 and the longest batch of 1 (~60 MiB
    # more), not for the longest batch of 8 (~550 MiB more)
    normal = run_trial(workload, TrialConfig(batch_size=8, intra_op_threads=1), quick)
    assert normal.ok, normal.reason
    cap = max(MIN_MEMORY_CAP_MB, normal.peak_host_mb + 300.0)
    space = space_from_dict({"name": "t", "device": "cpu",
                             "parameters": {"batch_size": {"type": "int", "choices": [1, 8]}},
                             "fixed": {"intra_op_threads": 1, "num_workers": 0}, "baseline": {"batch_size": 1}},
                            hardware=hw)
    logs: list[str] = []
    tuner = Tuner(workload, space=space, measure=quick.replace(memory_cap_mb=cap, memory_margin=0.1),
                  storage=f"sqlite:///{tmp_path}/t.db", hardware=hw, progress=False, log=logs.append, finalists=2,
                  finalist_rounds=1, seed=0, parity_steps=0)
    rec = tuner.run(trials=2)
    study = tuner.study()
    by_bs = {t.user_attrs["config"]["batch_size"]: t for t in study.trials if t.user_attrs.get("status") == "ok"}
    from autotune.search.record.trials import is_feasible

    # the average batch allows batch 8 (feasible, and faster), its longest batch does not: batch 1 is recommended
    assert is_feasible(by_bs[8], tuner.limit) and by_bs[8].value > by_bs[1].value, logs
    assert rec is not None and rec.config.batch_size == 1, logs
    out = [r for r in rec.runners_up if r.get("out")]
    assert any(r["config"]["batch_size"] == 8 and "worst case: on the 8 longest items" in r["out"] for r in out), out
    assert rec.worst_case["source"] == "longest" and rec.worst_case["fits"] and rec.worst_case["status"] == "ok"
    assert rec.worst_case["peak_host_mb"] <= cap * 0.9
    assert rec.worst_case["what"] == f"the 1 longest items (lengths {lw.LONG} to {lw.LONG})"
    assert Recommendation.from_dict(rec.to_dict()).worst_case == rec.worst_case
