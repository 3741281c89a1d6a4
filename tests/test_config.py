"""The frozen records: validation, normalisation, (de)serialisation and derived figures."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from autotune.config import (KNOBS, MeasureSpec, TrialConfig, TrialResult, Workload, device_family, finite_or_none,
                             knob_args, knob_summary)
from autotune.errors import AutotuneError, ConfigError


# --- TrialConfig validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("batch_size", 0),
    ("batch_size", -8),
    ("batch_size", 1.5),
    ("batch_size", True),
    ("batch_size", "64"),
    ("num_workers", -1),
    ("num_workers", 1.0),
    ("prefetch_factor", 0),
    ("pin_memory", "yes"),
    ("persistent_workers", 1),
    ("channels_last", None),
    ("cudnn_benchmark", 0),
    ("amp", "fp8"),
    ("amp", "BF16"),
    ("compile_mode", "fast"),
    ("intra_op_threads", 0),
    ("intra_op_threads", 2000),
    ("inter_op_threads", -1),
])
def test_trial_config_rejects_bad_values_naming_the_field(field, value):
    kwargs = {field: value}
    if field in ("prefetch_factor", "persistent_workers"):
        kwargs["num_workers"] = 2  # validated even when the value would matter
    with pytest.raises(ConfigError) as info:
        TrialConfig(**kwargs)
    msg = str(info.value)
    assert field in msg
    assert repr(value) in msg
    assert "\n" not in msg
    assert isinstance(info.value, AutotuneError) and isinstance(info.value, ValueError)


def test_batch_size_zero_message_says_the_fix():
    with pytest.raises(ConfigError, match=r"batch_size=0 is not allowed: a whole number >= 1; try 32 or 64"):
        TrialConfig(batch_size=0)


def test_replace_revalidates():
    cfg = TrialConfig(batch_size=16)
    assert cfg.replace(batch_size=32).batch_size == 32
    with pytest.raises(ConfigError, match="batch_size"):
        cfg.replace(batch_size=0)


def test_trial_config_is_frozen():
    cfg = TrialConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 3  # type: ignore[misc]


# --- normalisation ---------------------------------------------------------------------------------------

def test_prefetch_and_persistent_normalised_without_workers():
    cfg = TrialConfig(batch_size=64, num_workers=0, prefetch_factor=4, persistent_workers=True)
    assert cfg.prefetch_factor is None
    assert cfg.persistent_workers is False
    plain = TrialConfig(batch_size=64)
    assert cfg == plain
    assert cfg.key() == plain.key()
    assert hash(cfg.key()) == hash(plain.key())


def test_prefetch_and_persistent_kept_with_workers():
    cfg = TrialConfig(num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert cfg.prefetch_factor == 4
    assert cfg.persistent_workers is True
    assert cfg != TrialConfig(num_workers=2)
    assert cfg.key() != TrialConfig(num_workers=2).key()


# --- dataloader_kwargs -------------------------------------------------------------------------------------

def test_dataloader_kwargs_without_workers():
    kw = TrialConfig(batch_size=8, num_workers=0, prefetch_factor=3, pin_memory=True,
                     persistent_workers=True).dataloader_kwargs()
    assert kw == {"batch_size": 8, "num_workers": 0, "pin_memory": True}


def test_dataloader_kwargs_with_workers():
    assert TrialConfig(batch_size=8, num_workers=2).dataloader_kwargs() == {
        "batch_size": 8, "num_workers": 2, "pin_memory": False, "persistent_workers": False}
    assert TrialConfig(batch_size=8, num_workers=2, prefetch_factor=4, persistent_workers=True).dataloader_kwargs() == {
        "batch_size": 8, "num_workers": 2, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 4}


@pytest.mark.parametrize("cfg", [
    TrialConfig(batch_size=4, num_workers=0, prefetch_factor=8, persistent_workers=True),
    TrialConfig(batch_size=4, num_workers=1, prefetch_factor=2, persistent_workers=True),
    TrialConfig(batch_size=4, num_workers=2),
])
def test_dataloader_accepts_the_kwargs(cfg):
    ds = torch.utils.data.TensorDataset(torch.arange(12))
    loader = torch.utils.data.DataLoader(ds, **cfg.dataloader_kwargs())  # raises on a bad combination
    assert loader.batch_size == 4
    assert loader.num_workers == cfg.num_workers
    if cfg.num_workers == 0:
        assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_short():
    cfg = TrialConfig(batch_size=64, num_workers=2, amp="bf16", channels_last=True, intra_op_threads=2,
                      inter_op_threads=1)
    assert cfg.short() == "bs=64 w=2 pf=2 bf16 cl t=2/1"
    assert TrialConfig(batch_size=8).short() == "bs=8 w=0"
    assert "compile=default" in TrialConfig(compile_mode="default").short()
    assert "persist" in TrialConfig(num_workers=1, persistent_workers=True).short()


# --- the knobs: one declaration, the CLI flags, short() and the summary line --------------------------------

FULL = TrialConfig(batch_size=48, num_workers=3, prefetch_factor=4, pin_memory=True, persistent_workers=True,
                   amp="bf16", compile_mode="max-autotune", channels_last=True, intra_op_threads=2,
                   inter_op_threads=1, malloc="retain", affinity="close")
SPARSE = TrialConfig(batch_size=1, num_workers=3, amp="fp16", compile_mode="reduce-overhead", inter_op_threads=1,
                     malloc="hugepages")


@pytest.mark.parametrize("cfg, short, summary", [
    (TrialConfig(), "bs=64 w=0",
     "batch_size=64 num_workers=0 prefetch_factor=None persistent_workers=False pin_memory=False amp=off "
     "channels_last=False compile_mode=none intra_op_threads=default inter_op_threads=default malloc=default "
     "affinity=default"),
    (FULL, "bs=48 w=3 pf=4 persist pin bf16 cl compile=max-autotune malloc=retain t=2/1 affinity=close",
     "batch_size=48 num_workers=3 prefetch_factor=4 persistent_workers=True pin_memory=True amp=bf16 "
     "channels_last=True compile_mode=max-autotune intra_op_threads=2 inter_op_threads=1 malloc=retain "
     "affinity=close"),
    (SPARSE, "bs=1 w=3 pf=2 fp16 compile=reduce-overhead malloc=hugepages t=-/1",
     "batch_size=1 num_workers=3 prefetch_factor=None persistent_workers=False pin_memory=False amp=fp16 "
     "channels_last=False compile_mode=reduce-overhead intra_op_threads=default inter_op_threads=1 "
     "malloc=hugepages affinity=default"),
])
def test_short_and_knob_summary_lines(cfg, short, summary):
    assert cfg.short() == short
    assert knob_summary(cfg) == summary


def test_knob_args_order_and_form():
    assert knob_args(TrialConfig()) == ["--batch-size", "64", "--num-workers", "0", "--amp", "off", "--compile", "none"]
    assert knob_args(FULL) == ["--batch-size", "48", "--num-workers", "3", "--amp", "bf16", "--compile", "max-autotune",
                               "--prefetch-factor", "4", "--pin-memory", "--persistent-workers", "--channels-last",
                               "--threads", "2", "--interop-threads", "1", "--malloc", "retain", "--affinity", "close"]
    assert knob_args(SPARSE) == ["--batch-size", "1", "--num-workers", "3", "--amp", "fp16", "--compile",
                                 "reduce-overhead", "--interop-threads", "1", "--malloc", "hugepages"]


@pytest.mark.parametrize("cfg", [
    TrialConfig(), FULL, SPARSE,
    TrialConfig(batch_size=7, num_workers=0, prefetch_factor=8, persistent_workers=True, pin_memory=True),
    TrialConfig(num_workers=2, compile_mode="default", intra_op_threads=5),
    TrialConfig(channels_last=True, malloc="retain"),
])
@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_knob_args_round_trip_through_the_trial_parser(cfg, device):
    from autotune.cli.main import build_parser
    from autotune.cli.args import config_from_args

    args = build_parser().parse_args(["trial", "--device", device, *knob_args(cfg)])
    assert config_from_args(args, args.device) == cfg.replace(cudnn_benchmark=device != "cpu")


def test_every_user_knob_is_declared_once():
    fields = [k.field for k in KNOBS]
    assert len(set(fields)) == len(fields)
    assert set(fields) == {f.name for f in dataclasses.fields(TrialConfig)} - {"cudnn_benchmark"}
    assert [k.flag for k in KNOBS if k.field in ("compile_mode", "intra_op_threads", "inter_op_threads")] == [
        "--compile", "--threads", "--interop-threads"]


def test_device_family():
    assert [device_family(d) for d in ("cpu", "cuda", "cuda:1")] == ["cpu", "cuda", "cuda"]
    assert Workload(device="cuda:0").device_family == "cuda" and Workload().device_family == "cpu"


# --- from_dict / to_dict -------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [TrialConfig, Workload, MeasureSpec])
def test_from_dict_rejects_unknown_keys(cls):
    data = cls().to_dict()
    data["batchsize"] = 3
    data["zz_typo"] = 1
    with pytest.raises(ConfigError) as info:
        cls.from_dict(data)
    msg = str(info.value)
    assert "batchsize" in msg and "zz_typo" in msg
    assert "allowed:" in msg


def test_result_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match="unknown result key"):
        TrialResult.from_dict({"status": "ok", "median": 3.0})


@pytest.mark.parametrize("bad", [None, [("batch_size", 3)], "batch_size=3"])
def test_from_dict_rejects_non_mapping(bad):
    with pytest.raises(ConfigError, match="must be a mapping"):
        TrialConfig.from_dict(bad)


@pytest.mark.parametrize("record", [
    TrialConfig(),
    TrialConfig(batch_size=32, num_workers=3, prefetch_factor=4, pin_memory=True, persistent_workers=True,
                amp="bf16", compile_mode="max-autotune", channels_last=True, intra_op_threads=2,
                inter_op_threads=1, cudnn_benchmark=True),
    Workload(),
    Workload(model="pkg.mod:fn", task="infer", image_size=32, data_dir="/data", device="cuda:1",
             num_classes=10, dataset_size=7),
    MeasureSpec(),
    MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, timeout_s=30, memory_cap_mb=2048.0, seed=7),
    TrialResult(status="ok", samples_per_s=(1.5, 2.5, 3.0), window_steps=(3, 4, 5), data_wait_s_per_step=0.01,
                compute_s_per_step=0.02, peak_host_mb=512.0, final_loss=2.3, wall_s=9.0, batch_size=8),
    TrialResult(status="crashed", reason="killed by SIGABRT", signal="SIGABRT", traceback="tb"),
])
def test_round_trip_through_json(record):
    data = record.to_dict()
    again = type(record).from_dict(json.loads(json.dumps(data)))
    assert again == record
    assert again.to_dict() == data


def test_result_to_dict_uses_lists_and_from_dict_restores_tuples():
    r = TrialResult(status="ok", samples_per_s=[1, 2], window_steps=[3.0, 4.0])
    assert r.samples_per_s == (1.0, 2.0) and all(type(x) is float for x in r.samples_per_s)
    assert r.window_steps == (3, 4) and all(type(x) is int for x in r.window_steps)
    d = r.to_dict()
    assert d["samples_per_s"] == [1.0, 2.0] and d["window_steps"] == [3, 4]
    assert TrialResult.from_dict(d).samples_per_s == (1.0, 2.0)


# --- Workload / MeasureSpec validation ----------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("model", ""),
    ("model", "   "),
    ("model", None),
    ("task", "eval"),
    ("image_size", 8),
    ("image_size", 5000),
    ("image_size", 32.0),
    ("device", "tpu"),
    ("device", "mps"),
    ("num_classes", 1),
    ("dataset_size", 0),
])
def test_workload_rejects_bad_values(field, value):
    with pytest.raises(ConfigError) as info:
        Workload(**{field: value})
    assert field in str(info.value)


def test_workload_callable_and_label():
    assert Workload(model="pkg.mod:fn").is_callable
    assert not Workload(model="resnet18").is_callable
    assert Workload(model="resnet18", image_size=32).label() == "resnet18/train/32px/synthetic/cpu"
    assert Workload(data_dir="/d", task="infer").label() == "resnet18/infer/224px/folder/cpu"


@pytest.mark.parametrize("field, value", [
    ("windows", 0),
    ("windows", 2.0),
    ("window_s", 0),
    ("window_s", -1.0),
    ("window_s", float("nan")),
    ("min_window_steps", 0),
    ("warmup_min_steps", 0),
    ("warmup_max_s", 0),
    ("settle_tolerance", 0),
    ("settle_tolerance", 1),
    ("settle_windows", -1),
    ("timeout_s", 0),
    ("memory_cap_mb", 0),
    ("memory_cap_mb", -512),
])
def test_measure_spec_rejects_bad_values(field, value):
    with pytest.raises(ConfigError) as info:
        MeasureSpec(**{field: value})
    assert field in str(info.value)


# --- TrialResult -------------------------------------------------------------------------------------------

def test_result_rejects_unknown_status():
    with pytest.raises(ConfigError, match="status='weird'"):
        TrialResult(status="weird")


def test_result_median_and_iqr_derive_from_samples():
    r = TrialResult(status="ok", samples_per_s=(30.0, 10.0, 13.0, 11.0, 12.0))
    assert r.median_samples_per_s == 12.0
    assert r.iqr_samples_per_s == 2.0
    assert r.summary.n == 5
    f = r.figures()
    assert f["median_samples_per_s"] == 12.0
    assert f["iqr_samples_per_s"] == 2.0
    assert f["rel_iqr"] == round(2 / 12, 4)
    assert f["samples_per_s"] == [30.0, 10.0, 13.0, 11.0, 12.0]  # raw, in window order
    assert any("noisy" in w for w in f["warnings"])
    json.dumps(f)


def test_result_without_samples_has_no_median():
    r = TrialResult(status="oom", reason="CUDA out of memory.")
    assert r.median_samples_per_s is None
    assert r.iqr_samples_per_s is None
    assert r.figures()["median_samples_per_s"] is None
    assert "warnings" not in r.figures()
    assert r.is_memory_failure and not r.ok
    assert TrialResult(status="over_memory").is_memory_failure
    assert not TrialResult(status="timeout").is_memory_failure
    assert TrialResult(status="ok").ok


@pytest.mark.parametrize("wait, comp, share", [
    (0.01, 0.03, 0.25),
    (0.0, 0.05, 0.0),
    (0.05, 0.0, 1.0),
    (0.0, 0.0, None),
    (None, 0.03, None),
    (0.01, None, None),
])
def test_data_wait_share(wait, comp, share):
    r = TrialResult(status="ok", data_wait_s_per_step=wait, compute_s_per_step=comp)
    if share is None:
        assert r.data_wait_share is None
    else:
        assert r.data_wait_share == pytest.approx(share)


def test_describe_mentions_the_figures():
    r = TrialResult(status="ok", samples_per_s=(100.0, 102.0, 98.0), data_wait_s_per_step=0.01,
                    compute_s_per_step=0.03, peak_host_mb=2048.0, startup_s=4.0, warmup_s=1.0, warmup_steps=6,
                    final_loss=2.25, wall_s=12.0)
    text = r.describe()
    assert text.splitlines()[0] == "status        ok"
    assert "100.0 samples/s median" in text
    assert "(25% waiting)" in text
    assert "2.00 GiB" in text
    assert "final loss    2.2500" in text
    err = TrialResult(status="error", reason="ValueError: boom", traceback="Traceback...\nValueError: boom")
    assert "ValueError: boom" in err.describe() and "traceback" in err.describe()


def test_finite_or_none():
    assert finite_or_none("1.5") == 1.5
    assert finite_or_none(3) == 3.0
    assert finite_or_none(float("nan")) is None
    assert finite_or_none(math.inf) is None
    assert finite_or_none(None) is None
    assert finite_or_none("abc") is None


@pytest.mark.parametrize("cls, field, value", [
    (MeasureSpec, "window_s", "3"),
    (MeasureSpec, "timeout_s", None),
    (MeasureSpec, "memory_cap_mb", "2GiB"),
    (Workload, "device", None),
])
def test_wrong_types_are_config_errors(cls, field, value):
    with pytest.raises(ConfigError, match=field):
        cls.from_dict({field: value})
