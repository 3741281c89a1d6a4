"""The Lightning and Hugging Face callbacks measure a fit through their frameworks' own hooks, with nothing more
from the user, and keep the same record as a loop under ``rec.apply()`` does: one per run, in the real SQLite study,
with the steps each framework ran and the samples of each window."""

from __future__ import annotations

import time

import optuna
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autotune.config import TrialConfig
from autotune.field import FieldSpec
from autotune.search.record.field_runs import stored
from tests.helpers import make_rec

SPEC = FieldSpec(window_s=0.01, keep_every_s=0.2, host_every_s=0.05)
STEPS = 30


@pytest.fixture
def rec(tmp_path):
    from autotune.machine.hardware import detect

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="cb", storage=storage)
    return make_rec(config=TrialConfig(batch_size=4), storage=storage, study_name="cb", trial_number=None,
                    fingerprint=detect(with_torch=False).fingerprint,
                    confirmation={"rounds": [{"winner": [100.0]}, {"winner": [104.0]}]})


def _records(rec) -> list[dict]:
    return stored(optuna.load_study(study_name=rec.study_name, storage=rec.storage))


def _same_shape(r: dict, source: str) -> None:
    assert r["source"] == source and r["state"] == "ended" and r["steps"] == STEPS, r
    assert r["windows"] >= 1 and all(w["steps"] >= 2 for w in r["window_list"])
    assert r["claim"]["round_medians"] == [100.0, 104.0] and r["line"].startswith("autotune field: ")
    # each window's samples/s is its steps' 4-sample batches over its seconds
    assert all(abs(w["samples_per_s"] * w["s"] - 4 * w["steps"]) < 0.01 * 4 * w["steps"] + 1e-3
               for w in r["window_list"]), r["window_list"]


def test_a_loop_under_apply_keeps_the_record(rec):
    model = nn.Linear(8, 2)
    with rec.apply(field=SPEC) as run:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS):
            time.sleep(0.002)  # the loader: 30 steps span a few windows however fast the machine is
            x, y = run.prepare_input(torch.randn(4, 8)), run.prepare_input(torch.randint(0, 2, (4,)))
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    (r,) = _records(rec)
    _same_shape(r, "apply")


def test_the_lightning_callback_keeps_the_same_record(rec):
    L = pytest.importorskip("lightning", reason='pip install "autotune[lightning]"')
    from autotune.integrations.lightning import AutotuneCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    lt = rec.lightning()
    cb = AutotuneCallback(rec, field=SPEC)
    trainer = L.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, **lt.trainer_kwargs, callbacks=[cb])
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,))), batch_size=4))
    (r,) = _records(rec)
    _same_shape(r, "lightning")
    assert cb.field() == r["line"]


def test_the_hugging_face_callback_keeps_the_same_record(rec, tmp_path):
    transformers = pytest.importorskip("transformers", reason='pip install "autotune[hf]"')

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(8, 2)

        def forward(self, x, labels=None):
            logits = self.head(x)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"x": torch.randn(8), "labels": torch.tensor(i % 2)}

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, report_to="none",
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                          **rec.training_arguments())
    cb = rec.hf_callback(field=SPEC)  # short windows for a 30-step test
    transformers.Trainer(model=Net(), args=args, train_dataset=Rows(), callbacks=[cb]).train()
    (r,) = _records(rec)
    _same_shape(r, "hf")
    assert cb.field() == r["line"]


def test_under_an_active_mlflow_run_the_field_run_is_logged(rec, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason='pip install "autotune[mlflow]"')
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns: the test's, not the checkout's
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with mlflow.start_run() as active:
        test_a_loop_under_apply_keeps_the_record(rec)
    run = mlflow.get_run(active.info.run_id)
    assert run.data.metrics["autotune_field_steps"] == STEPS
    assert run.data.tags["autotune_field_verdict"] == str(_records(rec)[0]["verdict"])
