"""Where users already train: Lightning, Hugging Face's Trainer and MLflow, each with its real library on CPU;
the collect_env stamp; and the one-line error of an integration used without its extra."""

from __future__ import annotations

import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the tiny models are built from configs
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from autotune.config import TrialConfig, Workload  # noqa: E402
from autotune.errors import ConfigError, MissingExtraError  # noqa: E402
from tests.helpers import make_rec  # noqa: E402


def _other_thread_count() -> int:
    return 1 if torch.get_num_threads() != 1 else 2


# --- Lightning ----------------------------------------------------------------------------------------

def test_lightning_settings_map_precision_accumulation_and_loaders():
    pytest.importorskip("lightning")
    rec = make_rec(config=TrialConfig(batch_size=16, num_workers=2, prefetch_factor=4, amp="bf16"))
    lt = rec.lightning()
    assert lt.trainer_kwargs == {"accelerator": "cpu", "devices": 1, "precision": "bf16-mixed",
                                 "accumulate_grad_batches": 1}
    assert lt.dataloader_kwargs == rec.dataloader_kwargs() == {"batch_size": 16, "num_workers": 2,
                                                               "pin_memory": False, "persistent_workers": False,
                                                               "prefetch_factor": 4, "timeout": 300}
    gpu = make_rec(config=TrialConfig(amp="fp16"), workload=Workload(device="cuda:1")).lightning()
    assert gpu.trainer_kwargs["precision"] == "16-mixed"
    assert (gpu.trainer_kwargs["accelerator"], gpu.trainer_kwargs["devices"]) == ("gpu", [1])
    assert make_rec(config=TrialConfig()).lightning().trainer_kwargs["precision"] == "32-true"


def test_lightning_trains_two_steps_with_the_recommendation_applied_and_restores_it():
    L = pytest.importorskip("lightning")
    threads = _other_thread_count()
    before = torch.get_num_threads()
    rec = make_rec(config=TrialConfig(batch_size=4, num_workers=1, prefetch_factor=2, persistent_workers=True,
                                      amp="bf16", channels_last=True, intra_op_threads=threads))
    seen = []

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            # lazy modules too: torch refuses .to(memory_format=...) on an uninitialised parameter
            self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyConv2d(4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                     nn.LazyLinear(2))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self(x)  # the lazy conv materialises, then converts
            seen.append({"threads": torch.get_num_threads(), "batch": x.shape[0],
                         "channels_last": all(self.net[i].weight.is_contiguous(memory_format=torch.channels_last)
                                              for i in (0, 1)),
                         "autocast": torch.is_autocast_enabled("cpu"),
                         "dtype": torch.get_autocast_dtype("cpu")})
            return nn.functional.cross_entropy(out.float(), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,)))
    lt = rec.lightning()
    model = Tiny()
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, **lt.trainer_kwargs,
                        callbacks=lt.callbacks)
    trainer.fit(model, DataLoader(data, **lt.dataloader_kwargs))
    assert len(seen) == 2
    assert all(s == {"threads": threads, "batch": 4, "channels_last": True, "autocast": True,
                     "dtype": torch.bfloat16} for s in seen), seen
    # restored after the fit
    assert torch.get_num_threads() == before
    assert model.net[0].weight.is_contiguous() and model.net[1].weight.is_contiguous()


def test_lightning_callback_compiles_the_module_in_place_and_undoes_it():
    pytest.importorskip("lightning")
    from autotune.integrations.lightning import AutotuneCallback

    module = nn.Linear(2, 2)
    cb = AutotuneCallback(make_rec(config=TrialConfig(compile_mode="reduce-overhead")))
    cb.on_fit_start(None, module)  # compiles lazily: nothing runs until a forward
    assert module._compiled_call_impl is not None
    cb.teardown(None, module, "fit")
    assert module._compiled_call_impl is None


# --- Hugging Face -------------------------------------------------------------------------------------

def test_training_arguments_maps_the_fields_and_refuses_what_has_none():
    transformers = pytest.importorskip("transformers")
    threads = _other_thread_count()
    rec = make_rec(config=TrialConfig(batch_size=8, num_workers=2, prefetch_factor=4, persistent_workers=True,
                                      pin_memory=True, amp="bf16", compile_mode="max-autotune",
                                      intra_op_threads=threads, channels_last=True, malloc="retain"))
    with pytest.raises(ConfigError) as err:
        rec.training_arguments(callback=False)  # without the callback (tests/test_hf_callback.py): yours to set
    msg = str(err.value)
    assert "\n" not in msg and f"OMP_NUM_THREADS={threads}" in msg and f"torch.set_num_threads({threads})" in msg
    assert "channels_last" in msg and "malloc=retain: export" in msg and "strict=False" in msg
    with pytest.warns(UserWarning, match="not in TrainingArguments: threads"):
        fields = rec.training_arguments(strict=False, callback=False)
    assert fields == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                      "dataloader_num_workers": 2, "dataloader_pin_memory": True,
                      "dataloader_persistent_workers": True, "dataloader_prefetch_factor": 4, "bf16": True,
                      "fp16": False, "torch_compile": True, "torch_compile_mode": "max-autotune", "use_cpu": True}
    known = transformers.TrainingArguments.__dataclass_fields__
    assert set(fields) <= set(known)
    # a thread count this process already runs with needs no note
    here = make_rec(config=TrialConfig(batch_size=8, intra_op_threads=torch.get_num_threads()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert here.training_arguments()["dataloader_num_workers"] == 0
    assert "dataloader_prefetch_factor" not in here.training_arguments()


class _Tokens(Dataset):
    def __init__(self, n: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 100, (n, 12), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(12, dtype=torch.long),
                "labels": self.labels[i]}


def test_hf_trainer_runs_two_steps_with_the_training_arguments(tmp_path):
    transformers = pytest.importorskip("transformers")
    rec = make_rec(config=TrialConfig(batch_size=4, num_workers=1, prefetch_factor=2, amp="bf16"))
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = transformers.BertForSequenceClassification(config)
    seen = []
    # accelerate autocasts inside the model's forward: a layer's output dtype shows it
    model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda m, args, out: seen.append((out.shape[0], out.dtype)))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, report_to="none",
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                          **rec.training_arguments())
    assert args.use_cpu and args.bf16 and args.per_device_train_batch_size == 4
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens())
    loader = trainer.get_train_dataloader()
    assert (loader.num_workers, loader.prefetch_factor) == (1, 2)
    out = trainer.train()
    assert out.global_step == 2
    assert seen == [(4, torch.bfloat16), (4, torch.bfloat16)]


def test_hf_callback_puts_a_model_with_lazy_modules_in_channels_last_and_restores_it():
    pytest.importorskip("transformers")
    rec = make_rec(config=TrialConfig(channels_last=True))
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyConv2d(4, 1), nn.Flatten(), nn.LazyLinear(2))
    cb = rec.hf_callback()
    cb.on_train_begin(None, None, None, model=model)  # torch's model.to(memory_format=...) raises here
    model(torch.randn(2, 3, 8, 8))  # the lazy conv materialises, then converts
    assert all(model[i].weight.is_contiguous(memory_format=torch.channels_last) for i in (0, 1))
    cb.on_train_end(None, None, None)
    assert all(model[i].weight.is_contiguous() for i in (0, 1))


# --- without the extra: one line with the install command ---------------------------------------------

@pytest.mark.parametrize("module,call,extra", [
    ("lightning", lambda rec: rec.lightning(), "lightning"),
    ("transformers", lambda rec: rec.training_arguments(), "hf"),
])
def test_an_integration_without_its_extra_names_the_install_command(monkeypatch, module, call, extra):
    monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled package looks like to import
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    monkeypatch.delitem(sys.modules, "autotune.integrations.lightning", raising=False)
    with pytest.raises(MissingExtraError) as err:
        call(make_rec())
    assert str(err.value).endswith(f'pip install "autotune[{extra}]"') and "\n" not in str(err.value)


def test_run_with_mlflow_but_without_mlflow_exits_2_in_one_line(monkeypatch, capsys):
    from autotune.cli.main import main

    monkeypatch.setitem(sys.modules, "mlflow", None)
    code = main(["run", "--model", "tests.workloads_fixtures:tiny", "--image-size", "16", "--device", "cpu",
                 "--trials", "1", "--mlflow", "sqlite:///never.db"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == 'autotune run: error: mlflow is not installed: pip install "autotune[mlflow]"'


# --- MLflow -------------------------------------------------------------------------------------------

def _mlflow_tuner(tmp_path, logger, fake):
    from tests.helpers import make_tuner

    return make_tuner(tmp_path, finalists=1, parity_steps=0, runner=fake, on_trial=[logger])


def test_tuner_calls_on_trial_once_for_each_trial_the_run_finishes(tmp_path):
    from autotune.config import TrialResult

    seen = []

    def fake(workload, config, measure, **kw):
        return TrialResult(status="ok", samples_per_s=(10.0, 11.0, 9.0), wall_s=1.0, peak_host_mb=100.0,
                           batch_size=config.batch_size)

    tuner = _mlflow_tuner(tmp_path, lambda study, t: seen.append((t.number, t.state.name)), fake)
    tuner.run(trials=2)
    finished = [(t.number, t.state.name) for t in tuner.study().trials if t.state.is_finished()]
    assert sorted(seen) == finished and len(finished) >= 2
    seen.clear()
    tuner.run(trials=1)  # a resumed run: only its own trials
    assert seen and all(n >= len(finished) for n, _ in seen)


def _sqlite_uri(tmp_path) -> str:
    """MLflow 3 refuses file: stores unless MLFLOW_ALLOW_FILE_STORE=true (they are in maintenance): sqlite."""
    return f"sqlite:///{tmp_path}/mlflow.db"


def test_mlflow_logs_trials_nested_under_the_study_and_the_artifacts_on_it(tmp_path):
    pytest.importorskip("mlflow")
    import optuna
    from mlflow.tracking import MlflowClient

    from autotune.integrations.mlflow import STUDY_TAG, TRIAL_TAG, MLflowLogger

    study = optuna.create_study(study_name="tiny-study", direction="maximize")
    study.set_user_attr("hardware", "2 cores")
    for number, (status, value) in enumerate([("ok", 120.0), ("oom", None)]):
        t = study.ask()
        t.set_user_attr("config", TrialConfig(batch_size=8 * (number + 1)).to_dict())
        t.set_user_attr("status", status)
        t.set_user_attr("bottleneck", f"diagnosis {number}")
        t.set_user_attr("peak_host_mb", 300.0 + number)
        if value:
            t.set_user_attr("median_samples_per_s", value)
        study.tell(t, value, state=None if value else optuna.trial.TrialState.FAIL)
    uri = _sqlite_uri(tmp_path)
    logger = MLflowLogger(uri, experiment="exp")
    for t in study.trials:
        logger(study, t)
        logger(study, t)  # twice: logged once
    report = tmp_path / "report.html"
    report.write_text("<html>report</html>")
    rec = make_rec(config=TrialConfig(batch_size=8))
    logger.finish(study, rec, report_path=report)

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("exp")
    assert exp.artifact_location == (tmp_path / "mlflow-artifacts").as_uri()
    [parent] = client.search_runs([exp.experiment_id], filter_string=f"tags.`{STUDY_TAG}` = 'tiny-study'")
    assert parent.info.status == "FINISHED" and parent.data.tags["recommended"] == rec.config.short()
    assert parent.data.metrics["median_samples_per_s"] == rec.median_samples_per_s
    assert sorted(a.path for a in client.list_artifacts(parent.info.run_id)) == ["recommendation.yaml", "report.html"]
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by = {int(r.data.tags[TRIAL_TAG]): r for r in runs}
    assert sorted(by) == [0, 1]
    assert by[0].data.params["batch_size"] == "8" and by[1].data.params["batch_size"] == "16"
    assert by[0].data.metrics["median_samples_per_s"] == 120.0 and by[0].data.metrics["peak_host_mb"] == 300.0
    assert "median_samples_per_s" not in by[1].data.metrics and by[1].data.metrics["peak_host_mb"] == 301.0
    assert (by[0].data.tags["status"], by[1].data.tags["status"]) == ("ok", "oom")
    assert by[1].data.tags["diagnosis"] == "diagnosis 1" and by[1].info.status == "FAILED"

    # an interrupted run: the trial failed by the interrupt (no callback saw it) is logged when the parent closes
    t = study.ask()
    t.set_user_attr("status", "interrupted")
    study.tell(t, None, state=optuna.trial.TrialState.FAIL)
    assert logger.opened("tiny-study")
    logger.finish(study, None, status="KILLED")
    assert client.get_run(parent.info.run_id).info.status == "KILLED"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(r.data.tags[TRIAL_TAG] for r in runs) == ["0", "1", "2"]


@pytest.mark.slow  # ~15 s: two tuner runs, the finalists' collect_env stamp, MLflow's sqlite schema
def test_mlflow_logs_each_trial_of_a_tuner_run_and_a_resumed_run_reuses_the_parent(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from autotune.config import TrialResult
    from autotune.integrations.mlflow import STUDY_TAG, TRIAL_TAG, MLflowLogger

    def fake(workload, config, measure, **kw):
        # batch 16 runs out of memory: the search reaches it by trial 2 (the batch walk from the best of the
        # baseline and the bundle, which tie here)
        if config.batch_size == 16:
            return TrialResult(status="oom", reason="out of memory", batch_size=16, peak_host_mb=900.0)
        v = 100.0 + config.batch_size
        return TrialResult(status="ok", samples_per_s=(v, v + 1, v - 1), wall_s=1.0, peak_host_mb=120.0 + v,
                           batch_size=config.batch_size)

    uri = _sqlite_uri(tmp_path)
    logger = MLflowLogger(uri)
    logger.check()
    tuner = _mlflow_tuner(tmp_path, logger, fake)
    rec = tuner.run(trials=3)
    study = tuner.study()
    report = tmp_path / "report.html"
    report.write_text("<html>report</html>")
    logger.finish(study, rec, report_path=report)

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("autotune")
    parents = client.search_runs([exp.experiment_id], filter_string=f"tags.`{STUDY_TAG}` = '{study.study_name}' "
                                 "and tags.`autotune.trial` IS NULL")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["recommended"] == rec.config.short()
    assert parent.data.metrics["median_samples_per_s"] == pytest.approx(rec.median_samples_per_s)
    assert sorted(a.path for a in client.list_artifacts(parent.info.run_id)) == ["recommendation.yaml",
                                                                                  "report.html"]
    children = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    finished = [t for t in study.trials if t.state.is_finished()]
    assert sorted(int(c.data.tags[TRIAL_TAG]) for c in children) == sorted(t.number for t in finished)
    by_number = {int(c.data.tags[TRIAL_TAG]): c for c in children}
    for t in finished:
        run = by_number[t.number]
        assert run.data.params["batch_size"] == str(t.user_attrs["config"]["batch_size"])
        assert run.data.tags["status"] == t.user_attrs["status"]
        if t.user_attrs["status"] == "ok":
            assert run.data.metrics["median_samples_per_s"] == pytest.approx(t.user_attrs["median_samples_per_s"])
            assert run.data.metrics["peak_host_mb"] == pytest.approx(t.user_attrs["peak_host_mb"])
            assert run.data.tags["diagnosis"] == t.user_attrs["bottleneck"]
    assert any(c.data.tags["status"] == "oom" for c in children)

    # a resumed run (a new process: a new logger) logs into the same parent, each trial once
    again = MLflowLogger(uri)
    tuner2 = _mlflow_tuner(tmp_path, again, fake)
    tuner2.run(trials=1)
    again.finish(tuner2.study(), None, status="KILLED")
    parents = client.search_runs([exp.experiment_id], filter_string=f"tags.`{STUDY_TAG}` = '{study.study_name}' "
                                 "and tags.`autotune.trial` IS NULL")
    assert [p.info.run_id for p in parents] == [parent.info.run_id] and parents[0].info.status == "KILLED"
    children = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    numbers = [int(c.data.tags[TRIAL_TAG]) for c in children]
    assert len(numbers) == len(set(numbers)) == len([t for t in tuner2.study().trials if t.state.is_finished()])


def test_mlflow_store_it_cannot_use_is_one_line(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from autotune.errors import AutotuneError
    from autotune.integrations.mlflow import MLflowLogger

    (tmp_path / "a-file").write_text("")
    with pytest.raises(AutotuneError) as err:
        MLflowLogger(f"sqlite:///{tmp_path}/a-file/mlflow.db").check()
    assert str(err.value).startswith(f"MLflow at sqlite:///{tmp_path}/a-file/mlflow.db: ")
    assert "\n" not in str(err.value)
    if int(mlflow.__version__.split(".")[0]) >= 3:  # file: stores need an opt-in there
        monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        with pytest.raises(AutotuneError, match="MLFLOW_ALLOW_FILE_STORE=true"):
            MLflowLogger((tmp_path / "mlruns").as_uri()).check()


# --- the collect_env stamp ----------------------------------------------------------------------------

def test_collect_env_stamp_has_collect_envs_facts_and_names_what_changed():
    from torch.utils.collect_env import get_env_info

    from autotune.machine.envstamp import collect_env_stamp, stamp_changes

    stamp = collect_env_stamp()
    assert "error" not in stamp, stamp
    facts = set(get_env_info()._fields) - {"cpu_info", "pip_version"}
    assert set(stamp) == facts
    assert stamp["torch_version"] == torch.__version__
    assert any(line.startswith("torch==") for line in stamp["pip_packages"])
    assert stamp_changes(stamp, stamp) == []
    old = {**stamp, "gcc_version": "(GCC) 9.9.9", "torch_version": "1.0",
           "pip_packages": [x for x in stamp["pip_packages"] if not x.startswith("numpy")] + ["numpy==0.1"]}
    changed = stamp_changes(old, stamp)
    numpy_now = next(x.split("==")[1] for x in stamp["pip_packages"] if x.startswith("numpy=="))
    assert f"gcc_version (GCC) 9.9.9 -> {stamp['gcc_version']}" in changed
    assert f"pip numpy 0.1 -> {numpy_now}" in changed
    assert not any(c.startswith("torch_version") for c in changed)  # Recommendation.versions says it
    assert stamp_changes({"error": "timed out"}, stamp) == []


def test_recommendation_yaml_keeps_the_stamp_and_recommend_names_the_changed_facts(tmp_path):
    from autotune.machine.envstamp import collect_env_stamp
    from autotune.recommendation import Recommendation, VersionMismatchWarning
    from autotune import recommend as recommend_fn
    from tests.helpers import TINY, store_recommendation as _store

    stamp = {**collect_env_stamp(), "gcc_version": "(GCC) 9.9.9"}
    rec = make_rec(workload=Workload(model=TINY, image_size=16), config=TrialConfig(batch_size=8), env_stamp=stamp)
    path = tmp_path / "rec.yaml"
    rec.to_yaml(path)
    assert Recommendation.from_yaml(path).env_stamp == stamp
    assert "collect_env:" in path.read_text() and "pip_packages:" in path.read_text()
    url = _store(tmp_path, rec)
    with pytest.warns(VersionMismatchWarning, match=r"gcc_version \(GCC\) 9.9.9 -> "):
        recommend_fn(TINY, image_size=16, storage=url, device="cpu", progress=False)
