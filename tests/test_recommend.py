"""The Recommendation: construction, YAML round trip and refusals, atomic writes, and the one-line use
(dataloader_kwargs, apply, Applied helpers, version checks). No trial is run here."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from autotune.machine.loader_memory import LOADER_TIMEOUT_S
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from autotune import recommend as recommend_fn
from autotune.cli.main import build_parser
from autotune.config import TrialConfig, Workload
from autotune.errors import AutotuneError, ConfigError
from autotune.provenance import reproduce_command, versions_of
from autotune.recommendation import Applied, Recommendation, VersionMismatchWarning
from tests.helpers import REPO_ROOT, TINY, make_rec, plain_versions, store_recommendation


# --- construction and YAML ---------------------------------------------------------------------------------

def test_yaml_round_trip_gives_an_equal_object(tmp_path):
    rec = make_rec()
    path = tmp_path / "best.yaml"
    text = rec.to_yaml(path)
    assert path.read_text() == text
    back = Recommendation.from_yaml(path)
    assert back == rec
    assert Recommendation.from_dict(rec.to_dict()) == rec


def test_round_trip_with_nones_and_provisional(tmp_path):
    rec = make_rec(baseline_samples_per_s=None, speedup_vs_baseline=None, peak_host_mb=None, memory_cap_mb=None,
                   margin_vs_runner_up=None, trial_number=None, runners_up=(), notes=(), provisional=True,
                   noisy=True, samples_per_s=(1.0,))
    rec.to_yaml(tmp_path / "r.yaml")
    assert Recommendation.from_yaml(tmp_path / "r.yaml") == rec


def test_fresh_versions_can_be_written_as_yaml(tmp_path):
    rec = make_rec(versions=versions_of(None))  # what finalists.choose/finalists.provisional store
    rec.to_yaml(tmp_path / "fresh.yaml")
    assert Recommendation.from_yaml(tmp_path / "fresh.yaml").versions["torch"] == torch.__version__


def test_yaml_has_the_documented_sections(tmp_path):
    rec = make_rec()
    rec.to_yaml(tmp_path / "best.yaml")
    text = (tmp_path / "best.yaml").read_text()
    assert text.startswith("#")  # a comment says what the file is
    doc = yaml.safe_load(text)
    for section in ("config", "measured", "hardware", "versions", "provenance", "runners_up"):
        assert section in doc, section
    assert doc["config"]["batch_size"] == 32 and doc["config"]["channels_last"] is True
    assert doc["measured"]["median_samples_per_s"] == 120.5
    assert doc["measured"]["samples_per_s"] == [118.0, 120.5, 123.0]
    assert doc["hardware"]["fingerprint"] == "abc123def0"
    assert doc["versions"]["torch"] == torch.__version__
    assert doc["provenance"]["reproduce"].startswith("autotune trial")
    assert doc["provenance"]["trial"] == 7 and doc["provenance"]["created"] == "2025-01-02T03:04:05+00:00"
    assert doc["runners_up"][0]["short"] == "bs=16 w=0"
    assert doc["workload"]["model"] == "resnet18"


def test_reproduce_command_parses_back_to_the_same_config():
    config = TrialConfig(batch_size=48, num_workers=3, prefetch_factor=4, persistent_workers=True, amp="bf16",
                         compile_mode="max-autotune", channels_last=True, intra_op_threads=2, inter_op_threads=1,
                         malloc="retain")
    workload = Workload(model=TINY, task="infer", image_size=40)
    cmd = reproduce_command(workload, config, 4096.0)
    argv = shlex.split(cmd)
    assert argv[:2] == ["autotune", "trial"]
    a = build_parser().parse_args(argv[1:])
    again = TrialConfig(batch_size=a.batch_size, num_workers=a.num_workers, prefetch_factor=a.prefetch_factor,
                        pin_memory=a.pin_memory, persistent_workers=a.persistent_workers, amp=a.amp,
                        compile_mode=a.compile, channels_last=a.channels_last, intra_op_threads=a.threads,
                        inter_op_threads=a.interop_threads, malloc=a.malloc)
    assert again == config
    assert (a.model, a.task, a.image_size, a.device, a.memory_cap) == (TINY, "infer", 40, "cpu", "4096MiB")


def test_summary_says_what_and_how_fast():
    s = make_rec().summary()
    assert s.startswith("recommended: bs=32 w=2 pf=4 persist cl t=1/1")
    assert "120.5 samples/s" in s and "x1.51" in s and "runner-up bs=16 w=0" in s and "note: a note" in s


# --- refusals ----------------------------------------------------------------------------------------------

def test_from_yaml_refuses_a_file_that_is_not_yaml(tmp_path):
    path = tmp_path / "notes.yaml"
    path.write_text("config: [batch_size: 32\n  measured: {\n")
    with pytest.raises(ConfigError, match=r"notes\.yaml: not valid YAML"):
        Recommendation.from_yaml(path)


def test_from_yaml_refuses_plain_text(tmp_path):
    path = tmp_path / "README"
    path.write_text("just some words, not a recommendation\n")
    with pytest.raises(ConfigError, match=r"README: expected a mapping, got str"):
        Recommendation.from_yaml(path)


def test_from_yaml_refuses_a_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.yaml"):
        Recommendation.from_yaml(tmp_path / "missing.yaml")


@pytest.mark.parametrize("section", ["config", "workload", "measured", "hardware", "versions", "provenance"])
def test_from_yaml_refuses_a_missing_section_naming_it(tmp_path, section):
    d = make_rec().to_dict()
    del d[section]
    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError) as info:
        Recommendation.from_yaml(path)
    msg = str(info.value)
    assert str(path) in msg and f"missing section(s) {section}" in msg


def test_from_yaml_refuses_an_unknown_config_key(tmp_path):
    d = make_rec().to_dict()
    d["config"]["batch_sz"] = 32
    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=r"rec\.yaml: unknown config key\(s\) batch_sz"):
        Recommendation.from_yaml(path)


def test_from_yaml_refuses_batch_size_zero(tmp_path):
    d = make_rec().to_dict()
    d["config"]["batch_size"] = 0
    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(ConfigError, match=r"rec\.yaml: batch_size=0 is not allowed"):
        Recommendation.from_yaml(path)


def test_from_dict_refuses_a_missing_measured_key_and_a_newer_format():
    d = make_rec().to_dict()
    del d["measured"]["median_samples_per_s"]
    with pytest.raises(ConfigError, match=r"missing key 'median_samples_per_s' in 'measured'"):
        Recommendation.from_dict(d)
    d = make_rec().to_dict()
    d["format_version"] = 99
    with pytest.raises(ConfigError, match="format_version 99 is newer"):
        Recommendation.from_dict(d)
    with pytest.raises(ConfigError, match="expected a mapping"):
        Recommendation.from_dict([1, 2])  # type: ignore[arg-type]


def test_from_yaml_refuses_a_binary_file(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\xff\xfe")
    with pytest.raises(ConfigError, match="model.pt"):
        Recommendation.from_yaml(path)


def test_from_dict_refuses_a_section_that_is_not_a_mapping():
    d = make_rec().to_dict()
    d["measured"] = 5
    with pytest.raises(ConfigError, match="measured"):
        Recommendation.from_dict(d)


# --- atomic writes -----------------------------------------------------------------------------------------

def test_to_yaml_writes_atomically_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "out" / "best.yaml"  # the folder is created
    make_rec().to_yaml(path)
    make_rec(median_samples_per_s=200.0).to_yaml(path)  # overwrite in place
    assert sorted(os.listdir(path.parent)) == ["best.yaml"]
    assert Recommendation.from_yaml(path).median_samples_per_s == 200.0


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "best.yaml"
    make_rec().to_yaml(path)
    before = path.read_text()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        make_rec(median_samples_per_s=1.0).to_yaml(path)
    monkeypatch.undo()
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["best.yaml"]


def test_to_yaml_without_path_only_returns_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = make_rec().to_yaml()
    assert "provenance:" in text and os.listdir(tmp_path) == []


# --- use ---------------------------------------------------------------------------------------------------

def test_dataloader_kwargs_without_workers():
    rec = make_rec(config=TrialConfig(batch_size=16, num_workers=0, prefetch_factor=4, persistent_workers=True))
    assert rec.dataloader_kwargs() == {"batch_size": 16, "num_workers": 0, "pin_memory": False}


def test_dataloader_kwargs_with_workers_match_the_config():
    cfg = TrialConfig(batch_size=8, num_workers=2, prefetch_factor=3, persistent_workers=True)
    kw = make_rec(config=cfg).dataloader_kwargs()
    # with workers, a timeout: a batch lost in a full /dev/shm ends the loop instead of hanging it (issue 52)
    assert kw == {"batch_size": 8, "num_workers": 2, "pin_memory": False, "prefetch_factor": 3,
                  "persistent_workers": True, "timeout": LOADER_TIMEOUT_S}
    kw = make_rec(config=TrialConfig(batch_size=8, num_workers=1)).dataloader_kwargs()
    assert kw == {"batch_size": 8, "num_workers": 1, "pin_memory": False, "persistent_workers": False,
                  "timeout": LOADER_TIMEOUT_S}


def test_dataloader_kwargs_are_accepted_by_dataloader():
    ds = TensorDataset(torch.arange(20.0))
    for cfg in (TrialConfig(batch_size=4), TrialConfig(batch_size=4, num_workers=1, prefetch_factor=2)):
        loader = DataLoader(ds, **make_rec(config=cfg).dataloader_kwargs())
        assert loader.batch_size == 4 and loader.num_workers == cfg.num_workers
        assert sum(len(b[0]) for b in loader) == 20


def test_apply_sets_threads_inside_and_restores_them():
    old = torch.get_num_threads()
    want = 1 if old != 1 else 2
    rec = make_rec(config=TrialConfig(batch_size=4, intra_op_threads=want))
    with rec.apply() as run:
        assert isinstance(run, Applied)
        assert torch.get_num_threads() == want
    assert torch.get_num_threads() == old


def test_apply_restores_threads_after_an_exception():
    old = torch.get_num_threads()
    rec = make_rec(config=TrialConfig(batch_size=4, intra_op_threads=1 if old != 1 else 2))
    with pytest.raises(RuntimeError, match="inside"):
        with rec.apply():
            raise RuntimeError("inside")
    assert torch.get_num_threads() == old


def test_apply_without_thread_counts_leaves_threads_alone():
    old = torch.get_num_threads()
    with make_rec(config=TrialConfig(batch_size=4)).apply():
        assert torch.get_num_threads() == old


def test_prepare_model_and_input_with_channels_last():
    rec = make_rec(config=TrialConfig(batch_size=4, channels_last=True))
    with rec.apply() as run:
        model = run.prepare_model(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()))
        conv = model[0]
        assert conv.weight.is_contiguous(memory_format=torch.channels_last)
        assert not conv.weight.is_contiguous()
        x = run.prepare_input(torch.randn(2, 3, 8, 8))
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert model(x).shape == (2, 8, 6, 6)
        assert run.prepare_input(torch.randn(2, 5)).shape == (2, 5)  # non-images pass through


def test_prepare_model_without_channels_last_keeps_the_model():
    model = nn.Conv2d(3, 4, 3)
    with make_rec(config=TrialConfig(batch_size=4)).apply() as run:
        assert run.prepare_model(model) is model
        assert model.weight.is_contiguous()


def test_autocast_bf16_on_cpu_gives_bfloat16_outputs():
    rec = make_rec(config=TrialConfig(batch_size=4, amp="bf16"))
    lin = nn.Linear(8, 4)
    with rec.apply() as run:
        with run.autocast():
            out = lin(torch.randn(3, 8))
        assert out.dtype == torch.bfloat16
        assert run.grad_scaler() is None  # bf16 needs no loss scaling
        assert lin(torch.randn(3, 8)).dtype == torch.float32  # only inside autocast()


def test_autocast_off_is_full_precision():
    with make_rec(config=TrialConfig(batch_size=4)).apply() as run:
        with run.autocast():
            assert nn.Linear(8, 4)(torch.randn(2, 8)).dtype == torch.float32
        assert run.grad_scaler() is None


def test_check_versions_is_empty_for_this_process_and_reports_an_edited_torch():
    rec = make_rec()
    assert rec.check_versions() == []
    versions = {**rec.versions, "torch": "1.13.0"}
    changed = make_rec(versions=versions).check_versions()
    assert changed == [f"torch 1.13.0 -> {torch.__version__}"]


def test_check_versions_on_a_gpu_machine_does_not_report_the_unchanged_driver(monkeypatch):
    from autotune.machine import device as _device
    from autotune.machine import hardware
    from autotune.machine.device import GPUInfo

    fake = lambda nvml=None: ([GPUInfo(0, "Fake GPU", 16384.0, "550.54", "8.0")], "ok")  # noqa: E731
    monkeypatch.setattr(_device, "nvml_gpus", fake)
    monkeypatch.setattr(hardware, "nvml_gpus", fake)
    versions = versions_of(hardware.detect(with_torch=False))
    assert versions["driver"] == "550.54"
    assert make_rec(versions=versions).check_versions() == []


# --- recommend() answering from the storage (no trial is run) ------------------------------------------------

def test_recommend_answers_from_the_stored_recommendation(tmp_path):
    rec = make_rec(workload=Workload(model=TINY, image_size=16),
                   config=TrialConfig(batch_size=8), peak_host_mb=300.0)
    url = store_recommendation(tmp_path, rec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VersionMismatchWarning)
        got = recommend_fn(TINY, image_size=16, storage=url, device="cpu", progress=False)
    assert got == rec


def test_recommend_does_not_answer_with_a_stored_provisional_recommendation(tmp_path):
    """A run too short for its finalists keeps its provisional recommendation (with its confirmation) for `export`;
    recommend() does not take it as the answer: with trials=0 it then finds the study's own trials, not the store."""
    import dataclasses

    rec = dataclasses.replace(make_rec(workload=Workload(model=TINY, image_size=16), config=TrialConfig(batch_size=8),
                                       peak_host_mb=300.0), provisional=True)
    url = store_recommendation(tmp_path, rec)
    try:
        got = recommend_fn(TINY, image_size=16, storage=url, device="cpu", trials=0, budget=None, progress=False)
    except AutotuneError:
        return  # no trial of its own: nothing to answer with, and the stored provisional one was not taken
    assert got != rec


def test_recommend_warns_when_versions_changed(tmp_path):
    rec = make_rec(workload=Workload(model=TINY, image_size=16), config=TrialConfig(batch_size=8),
                   versions={**plain_versions(), "torch": "1.13.0"})
    url = store_recommendation(tmp_path, rec)
    with pytest.warns(VersionMismatchWarning, match="torch 1.13.0"):
        got = recommend_fn(TINY, image_size=16, storage=url, device="cpu", progress=False)
    assert got == rec


def test_recommend_does_not_return_a_stored_answer_over_a_smaller_cap(tmp_path):
    rec = make_rec(workload=Workload(model=TINY, image_size=16), config=TrialConfig(batch_size=8),
                   peak_host_mb=3000.0, memory_cap_mb=None)
    url = store_recommendation(tmp_path, rec)
    try:  # trials=0: a fixed recommend() finds nothing feasible under the new cap without running anything
        got = recommend_fn(TINY, image_size=16, storage=url, device="cpu", memory_cap="1GiB", trials=0,
                           budget=None, progress=False)
    except AutotuneError:
        return
    assert got.peak_host_mb is None or got.peak_host_mb <= 1024


def test_launch_env_and_yaml_say_what_to_export_before_start(tmp_path):
    rec = make_rec(config=TrialConfig(batch_size=32, intra_op_threads=2, malloc="retain"))
    env = rec.launch_env()
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)
    doc = yaml.safe_load(rec.to_yaml(tmp_path / "r.yaml"))
    assert doc["environment"] == env
    assert Recommendation.from_yaml(tmp_path / "r.yaml") == rec  # the derived section is not read back
    assert "malloc=retain" in rec.summary()
    assert make_rec(config=TrialConfig(batch_size=32)).launch_env() == {}


_APPLY_MALLOC_CHILD = textwrap.dedent("""
    import ctypes, sys, warnings
    from autotune.config import TrialConfig, Workload
    from tests.helpers import make_rec
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    rec = make_rec(config=TrialConfig(batch_size=8, malloc=sys.argv[1]))
    with warnings.catch_warnings(record=True) as caught, rec.apply():
        warnings.simplefilter("always")
        p = libc.malloc(16 << 20)  # above glibc's default 128 KiB mmap threshold: mmapped by default
        with open("/proc/self/maps") as maps:
            heap = [l for l in maps if "[heap]" in l]
        lo, hi = (int(x, 16) for x in heap[0].split()[0].split("-")) if heap else (0, 0)
        print("|".join(str(w.message) for w in caught if issubclass(w.category, UserWarning)))
        print("heap" if lo <= p < hi else "mmap")
        libc.free(p)
""")


# one fresh process per mode (~2.5 s each): the defaults and retain run by default, the huge-page pair is slow
@pytest.mark.parametrize("mode, where", [
    ("default", "mmap"), ("retain", "heap"),
    pytest.param("hugepages", "heap", marks=pytest.mark.slow),
    pytest.param("hugepages+env", "heap", marks=pytest.mark.slow),
])
def test_apply_sets_glibc_malloc_in_the_running_process(mode, where):
    """mallopt really changes glibc's behaviour: after apply(), a freed 16 MiB block is reused (same address)
    rather than unmapped; checked in a fresh process so this test process keeps glibc's defaults."""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    extra = {"THP_MEM_ALLOC_ENABLE": "1"} if mode == "hugepages+env" else {}
    r = subprocess.run([sys.executable, "-c", _APPLY_MALLOC_CHILD, mode.split("+")[0]], capture_output=True,
                       text=True, cwd=REPO_ROOT, timeout=120, env={**env, **extra})
    assert r.returncode == 0, r.stderr[-2000:]
    said, out = r.stdout.splitlines()[-2:]
    assert out == where
    # the huge-page half can only come from the launch environment: said when missing, silent when there
    if mode == "hugepages":
        assert "THP_MEM_ALLOC_ENABLE=1" in said and "only the retain half" in said
    else:
        assert said == ""
