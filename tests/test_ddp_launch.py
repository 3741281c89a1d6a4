"""A recommendation of N DDP ranks you can launch (issue 27 item 5): the YAML's ``distributed`` section and the
torchrun line round trip; Lightning's and Hugging Face's real APIs take the mappings; (slow) the launch line run for
real with torchrun, ``rec.apply()`` in each rank of a DDP script."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys

import pytest

from autotune.config import TrialConfig, Workload
from autotune.errors import ConfigError
from autotune.provenance import reproduce_command
from autotune.recommendation import Recommendation

CONFIG = TrialConfig(batch_size=8, num_workers=0, intra_op_threads=1, inter_op_threads=1, bucket_cap_mb=5,
                     gradient_as_bucket_view=True)
WORKLOAD = Workload(model="tests.ddp_workloads:mlp", image_size=32, global_batch=64, nproc_per_node=2)


def _rec(config: TrialConfig = CONFIG, workload: Workload = WORKLOAD) -> Recommendation:
    return Recommendation(
        config=config, workload=workload, median_samples_per_s=100.0, iqr_samples_per_s=1.0,
        samples_per_s=(99.0, 100.0, 101.0), baseline_samples_per_s=80.0, speedup_vs_baseline=1.25,
        peak_host_mb=900.0, memory_cap_mb=8192.0, margin_vs_runner_up=None, noisy=False,
        hardware={"summary": "Fake CPU (2 usable cores)", "usable_cores": 2, "gpus": []}, fingerprint="fp",
        versions={"torch": "x"}, study_name="s-x2-fp", storage="sqlite:///t.db", trial_number=3,
        reproduce=reproduce_command(workload, config, 8192.0), created="2026-01-01T00:00:00+00:00")


def test_the_distributed_section_says_how_the_ranks_were_measured_and_round_trips(tmp_path):
    rec = _rec()
    rec.to_yaml(tmp_path / "best.yaml")
    back = Recommendation.from_yaml(tmp_path / "best.yaml")
    assert back == rec and back.to_dict()["distributed"] == rec.to_dict()["distributed"]
    d = back.to_dict()["distributed"]
    assert (d["world_size"], d["backend"], d["per_rank_batch"], d["accumulation_steps"], d["global_batch"]) == \
        (2, "gloo", 8, 4, 64)  # 8 per rank x 4 micro-batches x 2 ranks
    assert d["ddp"] == {"bucket_cap_mb": 5, "gradient_as_bucket_view": True, "static_graph": False}
    assert d["per_rank"] == {"intra_op_threads": 1, "inter_op_threads": 1, "num_workers": 0}
    assert d["environment"]["OMP_NUM_THREADS"] == "1"
    words = shlex.split(d["launch"])
    assert words[:3] == ["OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"]
    assert words[3:] == ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "train.py"]
    assert rec.launch_command("my train.py", "--epochs", "3").endswith("2 'my train.py' --epochs 3")
    # the reproduce command measures the same N-rank trial again, DDP's arguments included
    assert "--nproc-per-node 2" in rec.reproduce and "--bucket-cap-mb 5 " in rec.reproduce + " "
    assert "--gradient-as-bucket-view" in rec.reproduce and "2 DDP ranks" in rec.summary()


def test_one_process_yaml_has_no_distributed_section_and_an_edited_one_is_refused(tmp_path):
    one = _rec(TrialConfig(batch_size=8), Workload(model="tests.ddp_workloads:mlp", image_size=32))
    d = one.to_dict()
    assert "distributed" not in d and "bucket_cap_mb" not in d["config"]  # as before DDP existed
    assert Recommendation.from_dict(d) == one
    assert shlex.split(one.launch_command())[-2:] == ["python", "train.py"]
    edited = _rec().to_dict()
    edited["distributed"]["world_size"] = 4
    with pytest.raises(ConfigError, match="distributed.world_size is 4 but the workload and config say 2"):
        Recommendation.from_dict(edited, source="best.yaml")


def test_lightnings_trainer_takes_ddp_on_n_devices_with_dddps_arguments():
    pl = pytest.importorskip("lightning.pytorch")

    kw = _rec().lightning().trainer_kwargs
    assert kw["devices"] == 2 and kw["accumulate_grad_batches"] == 4
    trainer = pl.Trainer(**kw, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    strategy = trainer.strategy
    assert isinstance(strategy, pl.strategies.DDPStrategy) and trainer.num_devices == 2
    assert strategy._ddp_kwargs == {"bucket_cap_mb": 5, "gradient_as_bucket_view": True}
    assert strategy.process_group_backend == "gloo"
    plain = _rec(CONFIG.replace(bucket_cap_mb=25, gradient_as_bucket_view=False)).lightning().trainer_kwargs
    assert plain["strategy"] == "ddp"


def test_hugging_faces_training_arguments_take_the_ddp_fields_and_refuse_what_they_lack(monkeypatch):
    transformers = pytest.importorskip("transformers")

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="2 DDP ranks: build TrainingArguments in the script"):
        _rec().training_arguments()
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun starts each rank
    with pytest.raises(ConfigError, match="gradient_as_bucket_view=True: TrainingArguments has no field"):
        _rec().training_arguments()
    fields = _rec(CONFIG.replace(gradient_as_bucket_view=False)).training_arguments()
    assert set(fields) <= set(transformers.TrainingArguments.__dataclass_fields__)
    assert (fields["ddp_backend"], fields["ddp_bucket_cap_mb"], fields["ddp_static_graph"]) == ("gloo", 5, False)
    assert (fields["per_device_train_batch_size"], fields["gradient_accumulation_steps"]) == (8, 4)


_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from autotune.recommendation import Recommendation

rec = Recommendation.from_yaml(sys.argv[1])
dist.init_process_group("gloo")
calls = []
with rec.apply() as run:
    model = run.prepare_model(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)))
    def hook(state, bucket):
        calls.append(1)
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])
    model.register_comm_hook(None, hook)
    for micro in range(2 * run.accumulation_steps):
        with run.no_sync(model, micro % run.accumulation_steps):
            model(torch.randn(8, 16)).sum().backward()
    hf = {}
    try:
        import transformers
        hf_rec = Recommendation.from_dict({**rec.to_dict(), "distributed": None,
                                           "config": {**rec.config.to_dict(), "gradient_as_bucket_view": False}})
        args = transformers.TrainingArguments(output_dir=sys.argv[2], **hf_rec.training_arguments())
        hf = {"world_size": args.world_size, "backend": args.ddp_backend, "bucket": args.ddp_bucket_cap_mb}
    except ImportError:
        pass
    out = {"rank": dist.get_rank(), "hf": hf, "threads": torch.get_num_threads(),
           "omp": os.environ.get("OMP_NUM_THREADS"),
           "ddp": type(model).__name__, "bucket_bytes": model.bucket_bytes_cap, "allreduces": len(calls),
           "view": model.gradient_as_bucket_view}
with open(os.path.join(sys.argv[2], f"rank{out['rank']}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_launch_line_runs_the_ranks_and_apply_sets_each_ranks_settings(tmp_path):
    import json

    rec = _rec()
    rec.to_yaml(tmp_path / "best.yaml")
    (tmp_path / "train.py").write_text(_SCRIPT)
    line = rec.launch_command(str(tmp_path / "train.py"), str(tmp_path / "best.yaml"), str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run(line.replace(" torchrun ", f" {shlex.quote(torchrun)} ", 1), shell=True, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["threads"] == 1 and r["omp"] == "1" and r["ddp"] == "DistributedDataParallel"
        assert r["bucket_bytes"] == 5 * 1024 * 1024 and r["view"] is True
        assert r["allreduces"] == 2  # 2 optimizer steps of 4 micro-batches: once each, under no_sync otherwise
        hf = {} if importlib.util.find_spec("transformers") is None else {"world_size": 2, "backend": "gloo",
                                                                          "bucket": 5}
        assert r["hf"] == hf  # TrainingArguments made inside a rank: the process group torchrun started
