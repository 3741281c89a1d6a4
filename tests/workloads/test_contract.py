"""The workload contract (``autotune.workloads.contract``): each part checked in this process, fast; then through the
real runner (a child process per trial), which is slow.

In-process tests build steps with ``_worker.make_step`` on the CPU device, as a trial's child does.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

from autotune.workloads import contract
from autotune.machine.device import CPUDevice
from autotune.trial.worker import make_step
from autotune.config import MeasureSpec, TrialConfig, TrialResult, Workload
from autotune.workloads.contract import StepContext, count_batch, loader_kwargs, move, reference
from autotune.errors import WorkloadError
from autotune.workloads.build import build

FIX = "tests.workloads_fixtures:"
Pair = collections.namedtuple("Pair", "image mask")


def top_level_workload(image_size: int = 32):
    """A workload function at module top level: importable by reference."""
    from tests.workloads_fixtures import tiny

    return tiny(image_size)


# --- reference(): the workload function by name ------------------------------------------------------------

def test_reference_names_a_top_level_function_and_passes_strings_through():
    assert reference(top_level_workload) == "tests.workloads.test_contract:top_level_workload"
    assert reference("pkg.mod:fn") == "pkg.mod:fn"


def test_reference_refuses_a_lambda_a_closure_and_an_object_in_one_line():
    with pytest.raises(WorkloadError, match="lambda") as e:
        reference(lambda: None)
    assert "\n" not in str(e.value)

    def nested():
        pass

    with pytest.raises(WorkloadError, match="inside a function"):
        reference(nested)
    with pytest.raises(WorkloadError, match="not a function"):
        reference(42)


def test_reference_refuses_what_main_does_not_hold():
    def fn():
        pass

    fn.__qualname__, fn.__module__ = "fn", "__main__"  # as if typed into an interactive session
    with pytest.raises(WorkloadError, match="__main__"):
        reference(fn)


def test_tune_refuses_a_lambda_and_a_model_name_before_anything_runs():
    import autotune

    with pytest.raises(WorkloadError, match="lambda"):
        autotune.tune(lambda image_size: None)
    with pytest.raises(WorkloadError, match="recommend"):
        autotune.tune("resnet18")
    with pytest.raises(WorkloadError, match="lambda"):
        autotune.recommend(lambda: None)


# --- batches: moved recursively, channels_last where it applies ------------------------------------------

def test_move_walks_any_structure_and_makes_4d_float_tensors_channels_last():
    img, ids = torch.randn(2, 3, 8, 8), torch.zeros(2, 1, 4, 4, dtype=torch.long)
    batch = {"a": [img, (ids, "text")], "b": Pair(img, torch.ones(2, 5)), "n": 3,
             "o": collections.OrderedDict(x=img)}
    out = move(batch, CPUDevice(), channels_last=True)
    cl = torch.channels_last
    assert out["a"][0].is_contiguous(memory_format=cl) and not img.is_contiguous(memory_format=cl)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple) and out["a"][1][1] == "text"
    assert out["a"][1][0].is_contiguous()  # an integer tensor keeps its layout
    assert isinstance(out["b"], Pair) and out["b"].image.is_contiguous(memory_format=cl)
    assert out["n"] == 3 and isinstance(out["o"], collections.OrderedDict)
    assert move(img, CPUDevice()) is img  # nothing asked, nothing done


# --- count ------------------------------------------------------------------------------------------------

def test_count_gives_samples_and_tokens():
    batch = {"ids": torch.zeros(4, 16, dtype=torch.long), "mask": torch.ones(4, 16)}
    assert count_batch(lambda b: 4, batch) == (4, None)
    assert count_batch(lambda b: (4, int(b["mask"].sum())), batch) == (4, 64)
    assert count_batch(lambda b: (torch.tensor(3), b["mask"].long().sum()), batch) == (3, 64)
    # a [T, B] layout: the samples are not the first tensor's rows, but no more than the largest
    assert count_batch(lambda b: 16, (torch.zeros(16, 4), torch.zeros(16))) == (16, None)


@pytest.mark.parametrize("count, words", [
    (lambda b: 9, "9 samples"), (lambda b: 0, "0 samples"), (lambda b: 4.0, "must be an int"),
    (lambda b: True, "must be an int"), (lambda b: (4, 2, 1), "tuple of 3"), (lambda b: (4, -1), "-1 tokens"),
    (lambda b: b["missing"], "count raised KeyError"),
])
def test_a_count_that_disagrees_with_the_batch_is_a_workload_error(count, words):
    with pytest.raises(WorkloadError, match=words) as e:
        count_batch(count, {"x": torch.zeros(4, 3)})
    assert "\n" not in str(e.value) and "count" in str(e.value)


# --- step and optimizer -----------------------------------------------------------------------------------

def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)


def _parts(**kw):
    from autotune.workloads.build import Built

    return Built(None, None, None, **kw)


def test_the_default_step_is_todays_sgd_step():
    """No parts, or a Built without any: the same losses and weights as autotune's SGD-with-momentum step."""
    cfg = TrialConfig(batch_size=4)
    models = [_model(), _model()]
    a = make_step(models[0], nn.CrossEntropyLoss(), cfg, CPUDevice(), train=True)
    b = make_step(models[1], nn.CrossEntropyLoss(), cfg, CPUDevice(), train=True, parts=_parts())
    for _ in range(3):
        ra, rb = a(_batch()), b(_batch())
        assert torch.equal(ra.loss, rb.loss) and ra.samples == rb.samples == 4 and rb.tokens is None
    assert all(torch.equal(p, q) for p, q in zip(models[0].parameters(), models[1].parameters()))


def test_a_users_step_gets_the_prepared_batch_its_optimizer_and_the_context():
    seen = {}

    def step(model, batch, optimizer, ctx):
        seen.update(batch=batch, optimizer=optimizer, ctx=ctx)
        with ctx.autocast():
            loss = nn.functional.cross_entropy(model(batch["pixels"]), batch["label"])
        ctx.backward(loss)
        ctx.optimizer_step(optimizer)
        return loss

    parts = _parts(step=step, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
                   count=lambda b: (len(b["label"]), 10 * len(b["label"])))
    run = make_step(_model(), None, TrialConfig(batch_size=4, channels_last=True), CPUDevice(), train=True,
                    parts=parts)
    x, y = _batch()
    out = run({"pixels": x, "label": y})
    assert (out.samples, out.tokens) == (4, 40) and out.loss.dim() == 0 and not out.loss.requires_grad
    assert isinstance(seen["optimizer"], torch.optim.AdamW) and len(seen["optimizer"].state) > 0  # it stepped
    assert seen["batch"]["pixels"].is_contiguous(memory_format=torch.channels_last)
    assert isinstance(seen["ctx"], StepContext) and seen["ctx"].scaler is None


@pytest.mark.parametrize("returns, words", [(lambda loss: None, "returned NoneType, not a tensor"),
                                            (lambda loss: loss.item(), "returned float"),
                                            (lambda loss: loss.expand(2), "shape \\(2,\\), not a scalar")])
def test_a_step_that_returns_no_scalar_tensor_is_a_workload_error(returns, words):
    def step(model, batch, optimizer, ctx):
        return returns(nn.functional.cross_entropy(model(batch[0]), batch[1]))

    run = make_step(_model(), None, TrialConfig(batch_size=4), CPUDevice(), train=True, parts=_parts(step=step))
    with pytest.raises(WorkloadError, match=words):
        run(_batch())


def test_an_optimizer_factory_that_raises_or_returns_junk_is_a_workload_error():
    for factory, words in [(lambda p: 1 / 0, "optimizer factory raised ZeroDivisionError"),
                           (lambda p: "adam", "returned str, not a torch.optim.Optimizer")]:
        with pytest.raises(WorkloadError, match=words):
            make_step(_model(), nn.CrossEntropyLoss(), TrialConfig(batch_size=4), CPUDevice(), train=True,
                      parts=_parts(optimizer=factory))


def test_accumulation_steps_divide_the_loss_and_step_on_the_last_micro_batch_only():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = StepContext(TrialConfig(batch_size=4), CPUDevice(), None, accumulation_steps=2)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _batch()
    ctx.backward(nn.functional.cross_entropy(model(x), y))
    ctx.optimizer_step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # micro-batch 0: no step
    ctx.micro_batch = 1
    ctx.optimizer_step(opt)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


# --- data: sampler, IterableDataset, collate --------------------------------------------------------------

def test_loader_kwargs_shuffle_only_a_map_style_dataset_without_a_sampler():
    cfg = TrialConfig(batch_size=4)
    default = loader_kwargs(build(Workload(model=FIX + "tiny", image_size=32)), cfg, 0)
    assert default["shuffle"] is True and default["drop_last"] is True and "generator" in default
    stream = build(Workload(model=FIX + "iterable", image_size=32))
    kw = loader_kwargs(stream, cfg, 0)
    assert "shuffle" not in kw and "sampler" not in kw
    batches = list(torch.utils.data.DataLoader(stream.dataset, **kw))
    assert len(batches) == 10 and contract.steps_per_epoch(torch.utils.data.DataLoader(stream.dataset, **kw)) is None
    kw = loader_kwargs(_parts(sampler=range(4), collate_fn=list), cfg, 0)
    assert kw["sampler"] == range(4) and kw["collate_fn"] is list and "shuffle" not in kw


@pytest.mark.parametrize("name, words", [
    ("misspelt_part", "did you mean 'optimizer'"), ("step_not_callable", "a step of type str, not a callable"),
    ("iterable_with_sampler", "sampler with an IterableDataset"),
])
def test_a_workload_returning_bad_parts_is_refused_in_one_line(name, words):
    with pytest.raises(WorkloadError, match=words) as e:
        build(Workload(model=FIX + name, image_size=32))
    assert "\n" not in str(e.value)


def test_user_parts_name_what_the_workload_returned():
    assert build(Workload(model=FIX + "tiny", image_size=32)).user_parts == ()
    built = build(Workload(model="examples.adamw_dict_batches:build", image_size=32))
    assert built.user_parts == ("optimizer", "collate_fn", "step", "count")


def test_trial_result_keeps_the_new_figures_through_a_round_trip():
    r = TrialResult(status="ok", samples_per_s=(10.0, 11.0), window_steps=(3, 3), samples_per_step=4.0,
                    tokens_per_s=(70.0, 77.0), user_parts=("optimizer", "step"))
    assert TrialResult.from_dict(r.to_dict()) == r
    f = r.figures()
    assert f["user_parts"] == ["optimizer", "step"] and f["samples_per_step"] == 4.0 and f["tokens_per_s"] == [70, 77]
    assert "user's parts  optimizer, step" in r.describe()
    assert TrialResult.from_dict({"status": "ok"}).user_parts == ()  # older records


# --- through the real runner (a child process per trial) --------------------------------------------------

QUICK = MeasureSpec(windows=2, window_s=0.2, warmup_min_s=0.0, warmup_min_steps=2)


def trial(name: str, **config) -> TrialResult:
    from autotune.trial.runner import run_trial

    return run_trial(Workload(model=FIX + name, image_size=32), TrialConfig(**{"batch_size": 8, **config}), QUICK)


@pytest.mark.slow  # a child per bad workload: ~10 s each on 2 shared cores
@pytest.mark.parametrize("name, words", [("step_returns_none", "step returned NoneType"),
                                         ("step_returns_vector", "not a scalar"),
                                         ("count_too_many", "count says 16 samples"),
                                         ("optimizer_raises", "optimizer factory raised ValueError")])
def test_bad_parts_fail_the_trial_as_a_workload_error(name, words):
    r = trial(name)
    assert r.status == "error" and r.user_error, r.reason
    assert words in r.reason and "\n" not in r.reason


@pytest.mark.slow  # two children, ~20 s
def test_the_count_is_what_the_throughput_counts():
    """Counted half of each batch, with 7 tokens a sample: half the samples per step of autotune's count, and
    tokens/s exactly 7 x samples/s in every window (the same windows' clock)."""
    default, half = trial("tiny"), trial("tiny_half_count")
    assert default.ok and half.ok, (default.reason, half.reason)
    assert default.samples_per_step == 8 and half.samples_per_step == 4
    assert default.tokens_per_s == () and half.user_parts == ("count",)
    assert len(half.tokens_per_s) == 2
    assert all(t == pytest.approx(7 * s) for t, s in zip(half.tokens_per_s, half.samples_per_s))


@pytest.mark.slow  # two children of a 42 MB model, ~25 s
def test_adamw_peak_is_above_sgds_by_its_two_copies_of_the_weights():
    """The same model, batch and step; the only difference is the workload's optimizer factory. AdamW keeps two
    more copies of the weights than plain SGD: 2 x 42 MB. Asserted with half of that as the margin."""
    param_mb = sum(p.numel() * 4 for p in build(Workload(model=FIX + "wide_sgd")).model.parameters()) / 2**20
    sgd, adamw = trial("wide_sgd", num_workers=0), trial("wide_adamw", num_workers=0)
    assert sgd.ok and adamw.ok, (sgd.reason, adamw.reason)
    assert sgd.user_parts == adamw.user_parts == ("optimizer",)
    assert adamw.peak_host_mb > sgd.peak_host_mb + 0.5 * 2 * param_mb, (sgd.peak_host_mb, adamw.peak_host_mb)


@pytest.mark.slow  # one parity child, ~10 s
def test_the_numerics_check_runs_the_users_step_on_its_dict_batches(tmp_path):
    from autotune.trial.parity import parity_check

    r = parity_check(Workload(model="examples.adamw_dict_batches:build", image_size=16),
                     TrialConfig(batch_size=8, amp="bf16", channels_last=True), steps=4,
                     log_path=tmp_path / "parity.log")
    assert r.steps == 4 and r.compared == "loss", r.reason
    assert len(r.losses_candidate) == 4 and r.ok, r.reason
