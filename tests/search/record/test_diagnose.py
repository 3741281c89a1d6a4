"""Bottleneck diagnosis: the thresholds exactly, the order of the checks, and two real trials whose bottleneck
is known by construction (a heavy transform with 0 workers; convolutions over in-memory tensors)."""

from __future__ import annotations

import math

import pytest

from autotune.search.record import diagnose as dg
from autotune.search.record.diagnose import Diagnosis, diagnose

OK = {"status": "ok", "median_samples_per_s": 100.0, "wall_s": 10.0}


def test_input_bound_at_the_threshold_and_the_lever_names_workers():
    at = diagnose({**OK, "data_wait_share": dg.INPUT_BOUND_SHARE, "config": {"num_workers": 0}})
    below = diagnose({**OK, "data_wait_share": dg.INPUT_BOUND_SHARE - 0.01, "config": {"num_workers": 0}})
    assert at.label == "input-bound" and below.label == "compute-bound"
    d = diagnose({**OK, "data_wait_share": 0.62, "config": {"num_workers": 0}})
    assert d.explanation.startswith("waiting for data 62% of the step: more DataLoader workers")
    assert "lighter transforms" in d.explanation
    with_workers = diagnose({**OK, "data_wait_share": 0.62, "config": {"num_workers": 2}})
    assert "prefetch_factor" in with_workers.explanation


def test_memory_bound_near_the_cap_and_for_memory_failures():
    cap = 1000.0
    near = diagnose({**OK, "data_wait_share": 0.05, "peak_host_mb": dg.MEMORY_BOUND_FRACTION * cap}, memory_cap_mb=cap)
    far = diagnose({**OK, "data_wait_share": 0.05, "peak_host_mb": 0.89 * cap}, memory_cap_mb=cap)
    assert near.label == "memory-bound" and "90% of the 1000 MiB cap" in near.explanation
    assert far.label == "compute-bound"
    assert diagnose({**OK, "data_wait_share": 0.05, "peak_host_mb": 990.0}).label == "compute-bound"  # no cap known
    for status in ("oom", "over_memory", "skipped"):
        d = diagnose({"status": status, "reason": "x"}, memory_cap_mb=cap)
        assert d.label == "memory-bound" and "smaller batch" in d.explanation, status


def test_compile_dominated_at_the_threshold_and_before_input():
    at = diagnose({**OK, "compile_s": dg.COMPILE_DOMINATED_SHARE * 10.0, "data_wait_share": 0.9})
    below = diagnose({**OK, "compile_s": dg.COMPILE_DOMINATED_SHARE * 10.0 - 0.1, "data_wait_share": 0.1})
    assert at.label == "compile-dominated" and "compiling took 5.0 s of the 10.0 s trial" in at.explanation
    assert below.label == "compute-bound"
    # 'default' over max-autotune is advice for a max-autotune trial only, not for one already on 'default'
    slow = {**OK, "compile_s": 9.0}
    assert "'default' over max-autotune" in diagnose({**slow, "config": {"compile_mode": "max-autotune"}}).explanation
    assert "max-autotune" not in diagnose({**slow, "config": {"compile_mode": "default"}}).explanation


def test_compute_bound_levers_are_the_unused_knobs():
    d = diagnose({**OK, "data_wait_share": 0.02, "config": {"amp": "bf16", "channels_last": True,
                                                              "compile_mode": "none"}})
    assert d.label == "compute-bound" and d.explanation.startswith("waiting for data only 2% of the step")
    assert "torch.compile" in d.explanation and "bf16" not in d.explanation and "channels_last" not in d.explanation
    assert "bf16 AMP" in diagnose({**OK, "data_wait_share": 0.02}).explanation


def test_failures_and_missing_figures_never_raise():
    assert diagnose({"status": "error", "reason": "ValueError: boom"}) == Diagnosis("failed", "error: ValueError: boom")
    assert diagnose({"status": "timeout"}).label == "failed"
    assert diagnose({"status": "running"}).label == "unmeasured"
    assert diagnose({}).label == "unmeasured"
    # pandas turns missing numbers into NaN: still missing, not a share of NaN%
    nan = diagnose({"status": "ok", "median_samples_per_s": 5.0, "data_wait_share": math.nan,
                    "peak_host_mb": math.nan}, memory_cap_mb=math.nan)
    assert nan.label == "compute-bound" and "not measured" in nan.explanation
    pruned = diagnose({"status": "pruned", "data_wait_share": 0.7, "samples_per_s": [3.0]})
    assert pruned.label == "input-bound"  # classified from the windows it ran


@pytest.mark.parametrize("share", [0.0, 0.29, 0.3, 0.99, None])
def test_every_answer_is_a_known_label_and_one_line(share):
    d = diagnose({**OK, "data_wait_share": share, "compile_s": 1.0, "peak_host_mb": 10.0}, memory_cap_mb=100.0)
    assert d.label in dg.LABELS and "\n" not in d.explanation and d.line().startswith(d.label + ": ")


def test_explain_study_one_line_per_trial_in_the_given_order():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("memory_cap_mb", 1000.0)
    for attrs in ({**OK, "data_wait_share": 0.5}, {**OK, "data_wait_share": 0.01, "peak_host_mb": 950.0},
                  {"status": "oom", "reason": "CUDA out of memory"}):
        t = study.ask()
        for k, v in attrs.items():
            t.set_user_attr(k, v)
        study.tell(t, 1.0)
    lines = dg.explain_study(study, [2, 0, 1])
    assert [ln.split()[0] for ln in lines] == ["#2", "#0", "#1"]
    assert "memory-bound" in lines[0] and "input-bound" in lines[1] and "memory-bound" in lines[2]


# --- real trials, one child process each ------------------------------------------------------------------

def _measure(model: str, image_size: int):
    from autotune import MeasureSpec, TrialConfig, Workload, run_trial

    # One intra-op thread: on a busy 2-core box, spinning OpenMP threads would make compute time erratic.
    result = run_trial(Workload(model=model, image_size=image_size, device="cpu"),
                       TrialConfig(batch_size=8, num_workers=0, intra_op_threads=1),
                       MeasureSpec(windows=2, window_s=0.3, warmup_min_steps=2, warmup_min_s=0.0, timeout_s=180))
    assert result.ok, (result.status, result.reason, result.traceback)
    return result


def test_heavy_transform_with_no_workers_is_input_bound():
    result = _measure("tests.report_fixtures:input_bound", 16)
    figures = {**result.figures(), "config": {"num_workers": 0}}
    d = diagnose(figures)
    assert d.label == "input-bound", (d, result.data_wait_s_per_step, result.compute_s_per_step)
    assert "more DataLoader workers" in d.explanation


# slow: a real trial; by default a real trial is diagnosed in test_heavy_transform_with_no_workers_is_input_bound
# and the rules are unit-tested on given figures
@pytest.mark.slow
def test_convolutions_on_in_memory_tensors_are_compute_bound():
    result = _measure("tests.report_fixtures:compute_bound", 32)
    d = diagnose(result.figures())
    assert d.label == "compute-bound", (d, result.data_wait_s_per_step, result.compute_s_per_step)


def test_kernel_heavy_compute_bound_trial_names_the_allocator_first():
    figs = {"status": "ok", "data_wait_share": 0.02, "median_samples_per_s": 30.0, "kernel_cpu_share": 0.15,
            "config": {"malloc": "default", "amp": "off"}}
    d = diagnose(figs)
    assert d.label == "compute-bound"
    assert d.explanation.split(": ", 1)[1].startswith("malloc hugepages (15% of CPU time in the kernel)")
    # hugepages outside the space (or measured slower): retain is the lever
    no_thp = diagnose(figs, allowed=lambda knob, value: (knob, value) != ("malloc", "hugepages"))
    assert no_thp.explanation.split(": ", 1)[1].startswith("malloc retain (15%")
    # retain still faulting blocks over glibc's 32 MiB mmap limit: hugepages is the step left
    on_retain = diagnose({**figs, "config": {"malloc": "retain"}}).explanation
    assert "malloc hugepages" in on_retain and "malloc retain" not in on_retain
    assert "malloc" not in diagnose({**figs, "config": {"malloc": "hugepages"}}).explanation
    assert "malloc" not in diagnose({**figs, "kernel_cpu_share": 0.03}).explanation


def test_levers_outside_the_space_or_measured_slower_are_not_suggested(tmp_path):
    """explain_study: bf16 is not in this study's space; channels_last was measured slower for this config."""
    import optuna

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("space", {"parameters": {
        "batch_size": {"type": "int", "choices": [8, 16]}, "amp": {"type": "categorical", "choices": ["off"]},
        "channels_last": {"type": "bool", "choices": [False, True]},
        "intra_op_threads": {"type": "int", "choices": [1, 2]}}})
    base = {"batch_size": 8, "amp": "off", "channels_last": False, "compile_mode": "none", "intra_op_threads": 2}
    for config, value in ((base, 100.0), ({**base, "channels_last": True}, 90.0)):
        t = study.ask()
        t.set_user_attr("config", config)
        for k, v in {"status": "ok", "data_wait_share": 0.01, "median_samples_per_s": value}.items():
            t.set_user_attr(k, v)
        study.tell(t, value)
    first, second = dg.explain_study(study)
    assert first.startswith("#0    compute-bound:")
    assert "bf16" not in first and "torch.compile" not in first
    assert "more intra-op threads" not in first  # 2 is the space's most
    # channels_last was measured (slower) with everything else equal: said, not suggested
    assert first.endswith("no untried compute knob of the search space left "
                          "(channels_last measured in trial 1 (0.90x): no gain here)"), first
    assert "bf16" not in second and "channels_last" not in second  # it has channels_last; no bf16 in the space


def _add(study, number_config_value_status):
    """Add finished trials to ``study`` as the tuner stores them (config, status, figures as user attributes)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    for config, value, status in number_config_value_status:
        attrs = {"config": config, "status": status, "data_wait_share": 0.02}
        if value is not None:
            attrs["median_samples_per_s"] = value
        state = {"ok": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED}[status]
        study.add_trial(optuna.trial.create_trial(
            state=state, value=value if status == "ok" else None, user_attrs=attrs,
            params={"compile_mode": config["compile_mode"]},
            distributions={"compile_mode": CategoricalDistribution(["none", "default", "max-autotune"])},
            intermediate_values={0: 40.0} if status == "pruned" else None))


def test_a_lever_the_study_measured_near_the_config_is_not_suggested_but_reported():
    """The recommended config's diagnosis does not say torch.compile when the same study measured compile
    (default: slower; max-autotune: pruned) with everything else equal; it names those trials instead."""
    import optuna

    from autotune.config import TrialConfig

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    rec = TrialConfig(batch_size=32, channels_last=True).to_dict()
    far = TrialConfig(batch_size=64, compile_mode="default").to_dict()  # two knobs apart: not evidence
    _add(study, [(rec, 100.0, "ok"), ({**rec, "compile_mode": "default"}, 80.0, "ok"),
                 ({**rec, "compile_mode": "max-autotune"}, None, "pruned"), (far, 150.0, "ok")])
    plain = diagnose(study.trials[0].user_attrs)  # without the study: the old advice
    assert "torch.compile" in plain.explanation
    line = dg.explain_study(study, [0])[0]
    assert line.startswith("#0    compute-bound:") and "bf16 AMP" in line
    assert ("torch.compile measured in trials 1 (0.80x) and 2 (pruned as slow): no gain here" in line), line
    assert "or torch.compile" not in line and "channels_last" not in line
    # the figure a trial stores when it is recorded takes the same evidence
    d = diagnose(study.trials[0].user_attrs, trials=study.trials)
    assert "torch.compile measured in trials 1" in d.explanation and ", torch.compile" not in d.explanation

    # measured faster but not the answer (e.g. it failed the numerics check): says so, with the trial
    faster = optuna.create_study(direction="maximize")
    _add(faster, [(rec, 100.0, "ok"), ({**rec, "compile_mode": "max-autotune"}, 130.0, "ok")])
    d = diagnose(faster.trials[0].user_attrs, trials=faster.trials)
    assert d.explanation.endswith("(torch.compile measured 1.3x faster in trial 1)"), d.explanation
    # an input-bound trial whose extra workers were measured: no gain, so the lever left is the transforms
    slow_in = {**rec, "num_workers": 0}
    d = diagnose({"status": "ok", "median_samples_per_s": 100.0, "data_wait_share": 0.5, "config": slow_in},
                 trials=[_frozen(TrialConfig(batch_size=32, channels_last=True, num_workers=4).to_dict(), 7, 98.0)])
    assert d.label == "input-bound"
    assert d.explanation.endswith("lighter transforms (more DataLoader workers measured in trial 7 (0.98x): "
                                  "no gain here)"), d.explanation



def test_an_input_bound_trial_at_the_most_workers_offered_is_not_told_to_add_workers():
    at_most = {"status": "ok", "median_samples_per_s": 100.0, "data_wait_share": 0.6,
               "config": {"batch_size": 32, "num_workers": 2}}
    two = diagnose(at_most, allowed=lambda knob, v: knob != "num_workers" or v in (0, 1, 2))
    assert two.label == "input-bound" and "more DataLoader workers" not in two.explanation
    assert "2 worker(s) is the most the search space offers here: lighter transforms" in two.explanation
    four = diagnose(at_most, allowed=lambda knob, v: knob != "num_workers" or v in (0, 2, 4))  # 4 still there
    assert "more DataLoader workers" in four.explanation
    # the study's own judge: 4 workers measured slower is a lever not to suggest, but not one the space lacks
    import optuna

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("space", {"parameters": {"num_workers": {"type": "int", "choices": [0, 2, 4]}}})
    config = at_most["config"]
    _add(study, [({**config, "compile_mode": "none"}, 100.0, "ok"),
                 ({**config, "compile_mode": "none", "num_workers": 4}, 90.0, "ok")])
    judged = dg.levers_allowed(study, {**config, "compile_mode": "none"}, 100.0)
    assert not judged("num_workers", 4) and judged.offers("num_workers", 4)
    line = diagnose({**at_most, "config": {**config, "compile_mode": "none"}}, allowed=judged).explanation
    assert "is the most the search space offers" not in line, line


def _frozen(config, number, value):
    from types import SimpleNamespace

    return SimpleNamespace(number=number, constraints={}, user_attrs={
        "config": config, "status": "ok", "median_samples_per_s": value})
