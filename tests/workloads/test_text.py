"""The built-in text workload (``autotune.workloads.text``): each part in this process, fast; a real trial through the
runner (a child process), slow; the CLI's one-line refusals."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from autotune.workloads import text
from autotune.search.space.search_space import fit_workload
from autotune.machine.device import CPUDevice
from autotune.trial.worker import make_step
from autotune.cli.main import main as cli_main
from autotune.config import TEXT_MODELS, MeasureSpec, TrialConfig, Workload
from autotune.workloads.contract import count_batch, loader_kwargs
from autotune.errors import WorkloadError
from autotune.provenance import tokens_per_sample
from autotune.search.space.search_space import load_space
from autotune.search.record.storage import study_name_for
from autotune.workloads.build import build, check, list_models
from tests.helpers import fake_hw, make_rec, names

TINY = Workload(model="transformer_tiny", image_size=32, dataset_size=256, num_classes=4)


def seq(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.long)


# --- data: lengths, collate, count ---------------------------------------------------------------------------

def test_collate_pads_to_the_longest_and_the_mask_marks_the_real_tokens():
    tokens, labels = text.pad_collate([(seq(5, 6, 7), 1), (seq(9, 8, 7, 6, 5), 0), (seq(3), 2)])
    assert tokens.shape == (3, 5)  # the longest in the batch, not the maximum length
    assert tokens.tolist() == [[5, 6, 7, 0, 0], [9, 8, 7, 6, 5], [3, 0, 0, 0, 0]]
    assert labels.tolist() == [1, 0, 2]
    mask = text.attention_mask(tokens)
    assert mask.sum(1).tolist() == [3, 5, 1]
    assert mask.tolist()[0] == [True, True, True, False, False]


def test_count_is_the_real_tokens_of_the_batch_not_the_padding():
    built = build(TINY)
    items = [built.dataset[i] for i in range(16)]
    batch = built.collate_fn(items)
    lengths = [len(s) for s, _ in items]
    assert built.count(batch) == (16, sum(lengths))
    assert sum(lengths) < batch[0].numel()  # there is padding, and it is not counted
    assert count_batch(built.count, batch) == (16, sum(lengths))  # and the contract's check agrees


def test_lengths_are_skewed_and_clipped_to_the_maximum():
    lengths = text.sequence_lengths(4000, 128, seed=1)
    assert lengths.min() >= text.MIN_LEN and lengths.max() <= 128
    assert 28 <= statistics.median(lengths) <= 36  # median max_len / 4
    assert lengths.mean() > statistics.median(lengths)  # a long tail
    assert (lengths == 128).any()
    ds = text.TokenSequences(50, 64, vocab=100, num_classes=3)
    tokens, label = ds[7]
    assert len(tokens) == ds.lengths[7] and label == 7 % 3
    seen = {int(x) for i in range(len(ds)) for x in ds[i][0]}
    assert 0 not in seen  # no sequence holds the pad id: the mask counts only real tokens
    assert seen <= set(range(1, 100)) and len(seen) > 50  # tokens spread over the vocabulary, inside it


def test_length_buckets_make_batches_of_similar_lengths_from_every_index_once():
    lengths = text.sequence_lengths(1000, 128, seed=0)
    sampler = text.LengthBuckets(lengths, 16, seed=0)
    order = list(sampler)
    assert len(order) == len(sampler) == 992 and len(set(order)) == 992  # whole batches only, no repeats
    batches = [order[i:i + 16] for i in range(0, len(order), 16)]
    spread = statistics.median(int(lengths[b].max() - lengths[b].min()) for b in batches)
    rng = torch.Generator().manual_seed(0)
    shuffled = torch.randperm(1000, generator=rng)[:992].view(-1, 16).tolist()
    random_spread = statistics.median(int(lengths[b].max() - lengths[b].min()) for b in shuffled)
    assert spread * 5 < random_spread
    assert list(sampler) != order  # a new order each epoch
    assert list(text.LengthBuckets(lengths, 16, seed=0)) == order  # and the same one for the same seed


def test_the_model_ignores_padding():
    built = build(TINY)
    model = built.model.eval()
    short, long = seq(*range(1, 7)), seq(*range(30, 2, -1))
    padded, _ = text.pad_collate([(short, 0), (long, 0)])
    assert padded.shape == (2, 28)
    with torch.no_grad():
        alone = model(short.unsqueeze(0))
        in_batch = model(padded)
    torch.testing.assert_close(in_batch[0], alone[0], rtol=1e-4, atol=1e-5)


# --- the workload as a trial's child builds and steps it ----------------------------------------------------

@pytest.mark.parametrize("bucket", [False, True])
def test_steps_count_samples_and_real_tokens_in_process(bucket):
    config = TrialConfig(batch_size=8, bucket_by_length=bucket)
    built = build(TINY, config=config)
    assert set(built.user_parts) == {"optimizer", "collate_fn", "count"} | ({"sampler"} if bucket else set())
    assert isinstance(built.model, torch.nn.Module)
    loader = torch.utils.data.DataLoader(built.dataset, **loader_kwargs(built, config, 0))
    step = make_step(built.model, built.loss_fn, config, CPUDevice(), train=True, parts=built)
    for batch, _ in zip(loader, range(3)):
        out = step(batch)
        assert out.samples == 8 and out.tokens == int((batch[0] != text.PAD).sum())
        assert torch.isfinite(out.loss)
    assert isinstance(make_step(built.model, built.loss_fn, config, CPUDevice(), train=False, parts=built)
                      (batch).output, torch.Tensor)


# --- names, checks, the search space -------------------------------------------------------------------------

def test_text_models_are_listed_checked_and_named_by_their_length():
    assert {"transformer", "transformer_tiny"} <= set(list_models())
    check(Workload(model="transformer", image_size=128))  # no error
    w = Workload(model="transformer", image_size=128)
    assert "len128" in w.label() and "px" not in w.label()
    assert study_name_for(w, "fp").startswith("transformer-train-len128-synthetic-cpu")
    assert "64px" in Workload(model="resnet18", image_size=64).label()
    with pytest.raises(WorkloadError, match="drop --data"):
        check(Workload(model="transformer", data_dir="/tmp"))


def test_the_space_for_text_has_no_channels_last_and_searches_bucketing():
    sp = load_space(hardware=fake_hw(cores=4), device="cpu")
    assert "channels_last" in names(sp) and "bucket_by_length" not in names(sp)  # the shipped space: images
    for_text = fit_workload(sp, Workload(model="transformer"))
    assert "channels_last" not in names(for_text) and "bucket_by_length" in names(for_text)
    assert for_text.fixed["channels_last"] is False and for_text.baseline_config().channels_last is False
    assert for_text.baseline_config().bucket_by_length is False  # the baseline stays PyTorch's plain loader
    assert any("channels_last dropped" in n for n in for_text.notes)
    assert for_text.likely_params()["bucket_by_length"] is True
    assert fit_workload(for_text, Workload(model="transformer")) is for_text  # fitting twice changes nothing
    assert fit_workload(sp, Workload(model="resnet18")) is sp  # an image workload's space as it was


def test_a_space_that_names_bucketing_is_respected_and_images_never_search_it():
    sp = load_space(hardware=fake_hw(cores=4), device="cpu")
    pinned = dataclasses.replace(sp, fixed={**sp.fixed, "bucket_by_length": True})
    assert "bucket_by_length" not in names(fit_workload(pinned, Workload(model="transformer")))
    assert fit_workload(pinned, Workload(model="transformer")).baseline_config().bucket_by_length is True
    for_image = fit_workload(pinned, Workload(model="resnet18"))
    assert for_image.fixed["bucket_by_length"] is False and any("returns no length" in n for n in for_image.notes)
    assert tuple(text.TEXT_MODELS) == TEXT_MODELS  # the names config.py knows are the sizes text.py builds


def test_a_tuner_searches_the_fitted_space(tmp_path):
    from autotune.search.tuner import Tuner

    tuner = Tuner(Workload(model="transformer", image_size=64), hardware=fake_hw(cores=2),
                  storage=f"sqlite:///{tmp_path}/t.db", progress=False)
    assert "channels_last" not in names(tuner.space) and "bucket_by_length" in names(tuner.space)


@pytest.mark.parametrize("argv, says", [
    (["--model", "transformer", "--channels-last"], "--channels-last applies to 4-D image tensors"),
    (["--model", "resnet18", "--bucket-by-length"], "resnet18 returns no length"),
    (["--model", "transformer", "--data", "/tmp"], "drop --data"),
    (["--model", "transformer", "--seq-len", "8"], "seq_len=8 is not allowed"),
])
def test_the_cli_refuses_a_bad_text_option_in_one_line(argv, says, capsys):
    assert cli_main(["trial", *argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and err.startswith("autotune trial: error:")


# --- tokens/s in the recommendation ----------------------------------------------------------------------------

def test_the_recommendation_gives_tokens_per_second_beside_samples():
    assert tokens_per_sample({"samples_per_s": [10.0, 20.0], "tokens_per_s": [400.0, 800.0]}) == 40.0
    assert tokens_per_sample({"samples_per_s": [10.0]}) is None
    assert tokens_per_sample({"samples_per_s": [10.0], "tokens_per_s": [100.0]},
                             {"samples_per_s": [30.0], "tokens_per_s": [500.0]}, {"samples_per_s": [5.0]}) == 15.0
    rec = make_rec(config=TrialConfig(batch_size=32, bucket_by_length=True),
                   workload=Workload(model="transformer", image_size=128), tokens_per_sample=40.0)
    assert rec.median_tokens_per_s == round(120.5 * 40, 1)
    assert "4820 tokens/s median" in rec.summary() and "bucket" in rec.summary()
    d = rec.to_dict()
    assert d["measured"]["median_tokens_per_s"] == 4820.0
    assert type(rec).from_dict(d) == rec
    assert "--seq-len 128" in rec.reproduce and "--bucket-by-length" in rec.reproduce
    assert make_rec().median_tokens_per_s is None and "tokens/s" not in make_rec().summary()


# --- a real trial, in a child process ------------------------------------------------------------------------------

QUICK = MeasureSpec(windows=3, window_s=0.3, min_window_steps=2, warmup_min_steps=2, warmup_min_s=0.0,
                    warmup_max_s=20.0, timeout_s=170.0)


@pytest.mark.slow  # one child: ~10-15 s on 2 shared cores
def test_a_real_text_trial_reports_tokens_per_second_from_the_counted_tokens():
    from autotune.trial.runner import run_trial

    result = run_trial(TINY, TrialConfig(batch_size=8, intra_op_threads=1), QUICK)
    assert result.ok, result.reason
    assert result.samples_per_step == 8
    assert set(result.user_parts) == {"optimizer", "collate_fn", "count"}
    assert len(result.tokens_per_s) == len(result.samples_per_s) == 3
    mean_len = float(text.sequence_lengths(TINY.dataset_size, TINY.image_size, seed=QUICK.seed).mean())
    for tokens, samples in zip(result.tokens_per_s, result.samples_per_s):
        per_sample = tokens / samples  # both over the same window: the counted tokens per sample, not a timing
        assert text.MIN_LEN <= per_sample <= TINY.image_size
        assert per_sample == pytest.approx(mean_len, rel=0.35)
    assert result.figures()["tokens_per_s"]


@pytest.mark.slow  # one child through the CLI: ~15 s on 2 shared cores
def test_the_cli_trial_of_the_text_workload_with_bucketing_counts_its_tokens():
    import json

    from tests.helpers import run_cli

    proc = run_cli("trial", "--model", "transformer_tiny", "--seq-len", "32", "--batch-size", "8",
                   "--bucket-by-length", "--threads", "1", "--windows", "3", "--window-seconds", "0.3",
                   "--device", "cpu", "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["config"]["bucket_by_length"] is True
    figures = out["figures"]
    assert figures["samples_per_step"] == 8
    assert set(figures["user_parts"]) == {"optimizer", "collate_fn", "sampler", "count"}
    assert len(figures["tokens_per_s"]) == len(figures["samples_per_s"]) == 3
    mean_len = float(text.sequence_lengths(Workload().dataset_size, 32, seed=0).mean())
    per_sample = sum(figures["tokens_per_s"]) / sum(figures["samples_per_s"])  # counted tokens, not a timing
    assert per_sample == pytest.approx(mean_len, rel=0.35)
