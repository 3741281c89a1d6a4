"""Hugging Face as well served as Lightning: ``rec.hf_callback()`` applies what ``TrainingArguments`` has no field
for (threads, channels_last, the allocator, through ``Recommendation.apply()``) for the length of
``Trainer.train()``, so ``TrainingArguments(**rec.training_arguments())`` plus the callback carries the whole
recommendation. Checked with a real ``transformers.Trainer`` on a tiny conv net (CPU, a few steps, nothing
downloaded)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune.config import TrialConfig
from autotune.errors import ConfigError
from tests.helpers import make_rec

transformers = pytest.importorskip("transformers")


def _other_thread_count() -> int:
    return 1 if torch.get_num_threads() != 1 else 2


class Pixels(torch.utils.data.Dataset):
    def __init__(self, n: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class Net(nn.Module):
    """A conv net Trainer can train (it returns the loss in a dict), noting what each step ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)
        self.seen: list[tuple[int, bool]] = []

    def forward(self, pixel_values, labels=None):
        self.seen.append((torch.get_num_threads(),
                          self.conv.weight.is_contiguous(memory_format=torch.channels_last)))
        logits = self.head(torch.relu(self.conv(pixel_values)).mean(dim=(2, 3)))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def _train(tmp_path, rec, model, steps: int = 3):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps, report_to="none",
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                          **rec.training_arguments())
    callback = rec.hf_callback()
    assert isinstance(callback, transformers.TrainerCallback)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Pixels(), callbacks=[callback])
    return trainer.train()


def test_a_real_trainer_trains_with_the_threads_and_channels_last_and_restores_them(tmp_path):
    threads, before = _other_thread_count(), torch.get_num_threads()
    rec = make_rec(config=TrialConfig(batch_size=4, intra_op_threads=threads, channels_last=True))
    model = Net()
    out = _train(tmp_path, rec, model)  # the plain call: no refusal for what the callback sets
    assert out.global_step == 3
    assert model.seen == [(threads, True)] * 3  # every step ran with the recommendation applied
    assert torch.get_num_threads() == before  # and after train() it is all as it was
    assert model.conv.weight.is_contiguous() and not model.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_without_the_callback_the_knobs_without_a_field_are_still_refused():
    rec = make_rec(config=TrialConfig(batch_size=4, intra_op_threads=_other_thread_count(), channels_last=True,
                                      malloc="retain"))
    assert rec.training_arguments()["per_device_train_batch_size"] == 4  # the callback sets all three
    with pytest.raises(ConfigError, match="channels_last: call model.to") as err:
        rec.training_arguments(callback=False)
    assert "rec.hf_callback()" in str(err.value) and "\n" not in str(err.value)


def test_what_a_running_process_cannot_take_is_refused_even_with_the_callback(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    rec = make_rec(config=TrialConfig(batch_size=4, malloc="hugepages"))
    with pytest.raises(ConfigError, match="malloc=hugepages: export THP_MEM_ALLOC_ENABLE=1") as err:
        rec.training_arguments()
    assert "MALLOC_" not in str(err.value)  # the mallopt half the callback gives is not asked of the user
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    assert rec.training_arguments()["per_device_train_batch_size"] == 4


def test_restore_undoes_the_callback_by_hand_when_training_raises():
    threads, before = _other_thread_count(), torch.get_num_threads()
    callback = make_rec(config=TrialConfig(batch_size=4, intra_op_threads=threads, channels_last=True)).hf_callback()
    model = Net()
    callback.on_train_begin(None, None, None, model=model)
    assert torch.get_num_threads() == threads and model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    callback.restore()
    callback.restore()  # idempotent: a finally after on_train_end does no harm
    assert torch.get_num_threads() == before and model.conv.weight.is_contiguous()
