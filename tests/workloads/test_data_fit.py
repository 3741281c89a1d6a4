"""The search space fits the data, whoever wrote the workload (``workloads.probe``, ``search_space.fit_workload``):
channels_last only for batches with a 4-D floating tensor, length bucketing for any workload that returns
``length``; the YAML's workload section says what the workload is; a bad ``length`` is one line, exit 2.

The user workloads are real ``module:callable`` workloads (``tests.data_fit_workloads``), checked by the real
check child (one child each, module-scoped)."""

from __future__ import annotations

import sqlite3
import statistics

import pytest
import torch
import yaml

from autotune.cli.main import main as cli_main
from autotune.config import TrialConfig, Workload
from autotune.errors import WorkloadError
from autotune.recommendation import Recommendation
from autotune.search.space.search_space import load_space, space_for
from autotune.workloads.build import build, check
from autotune.workloads.probe import describe_batch
from tests.helpers import run_cli
from tests.helpers import make_rec
from tests.helpers import fake_hw, names

FIX = "tests.data_fit_workloads:"


@pytest.fixture(scope="module")
def sequences() -> Workload:
    return check(Workload(model=FIX + "sequences"))


@pytest.fixture(scope="module")
def images() -> Workload:
    return check(Workload(model=FIX + "images", image_size=32))


# --- what the first batch holds --------------------------------------------------------------------------------

def test_the_batch_of_any_structure_is_described_depth_first():
    batch = ({"ids": torch.zeros(2, 5, dtype=torch.long), "x": [torch.ones(2, 3, 8, 8, dtype=torch.bfloat16)]},
             torch.zeros(2), "not a tensor")
    assert describe_batch(batch) == [{"path": "[0].ids", "shape": [2, 5], "dtype": "int64"},
                                     {"path": "[0].x[0]", "shape": [2, 3, 8, 8], "dtype": "bfloat16"},
                                     {"path": "[1]", "shape": [2], "dtype": "float32"}]


def test_the_check_child_reads_the_user_workloads_first_batch(sequences, images):
    data = sequences.data
    assert data["image"] is False and data["sampler"] is False and data["takes"] == []
    by_path = {leaf["path"]: leaf for leaf in data["batch"]}
    assert by_path["input_ids"]["dtype"] == "int64" and by_path["attention_mask"]["dtype"] == "bool"
    assert by_path["labels"]["shape"] == [data["items"]]
    # the padding collate pads to the longest of the items: the lengths seen are the padded width's bounds
    assert 2 <= data["lengths"]["min"] <= data["lengths"]["max"] == by_path["input_ids"]["shape"][1]
    assert images.data["image"] is True and images.data["lengths"] is None and images.data["takes"] == ["image_size"]
    assert {"path": "image.pixels", "shape": [images.data["items"], 3, 32, 32], "dtype": "float32"} \
        in images.data["batch"]


# --- the space follows --------------------------------------------------------------------------------------------

def test_a_user_sequence_workload_searches_bucketing_and_never_channels_last(sequences):
    sp = space_for(sequences, fake_hw(cores=4))
    assert "bucket_by_length" in names(sp) and "channels_last" not in names(sp)
    assert sp.fixed["channels_last"] is False and sp.baseline_config().bucket_by_length is False
    assert sp.likely_params()["bucket_by_length"] is True  # tried early, as for the built-in text workload
    assert any("channels_last dropped" in n and "no 4-D" in n for n in sp.notes)
    # the unchecked workload (a Tuner made in Python) is fitted the same way, from what check found
    assert names(space_for(Workload(model=FIX + "sequences"), fake_hw(cores=4))) == names(sp)


def test_an_image_user_workload_still_searches_channels_last(images):
    sp = space_for(images, fake_hw(cores=4))
    assert "channels_last" in names(sp) and "bucket_by_length" not in names(sp)


def test_the_built_in_text_workload_takes_the_same_path():
    text = check(Workload(model="transformer_tiny", image_size=32, dataset_size=64, num_classes=4))
    assert text.data["lengths"] is not None and text.data["image"] is False  # its length, read like a user's
    sp = load_space(hardware=fake_hw(cores=4), device="cpu")
    assert "bucket_by_length" in names(space_for(text, fake_hw(cores=4), space=sp))


def test_bucketing_a_user_workload_batches_similar_lengths(sequences):
    built = build(sequences, config=TrialConfig(batch_size=8, bucket_by_length=True))
    assert built.sampler is not None and "sampler" in built.user_parts
    loader = torch.utils.data.DataLoader(built.dataset, batch_size=8, sampler=built.sampler,
                                         collate_fn=built.collate_fn, drop_last=True)
    padding = statistics.mean(float((~b["attention_mask"]).float().mean()) for b in loader)
    plain = torch.utils.data.DataLoader(built.dataset, batch_size=8, collate_fn=built.collate_fn, drop_last=True)
    assert padding * 3 < statistics.mean(float((~b["attention_mask"]).float().mean()) for b in plain)


def test_the_cli_refuses_channels_last_for_a_workload_without_image_tensors(capsys):
    assert cli_main(["trial", "--model", FIX + "sequences", "--channels-last", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--channels-last applies to 4-D image tensors" in err and "input_ids int64" in err and "\n" not in err


# --- the YAML's workload section ----------------------------------------------------------------------------------

def test_the_yaml_records_what_the_user_workload_is_not_ignored_defaults(sequences, images, tmp_path):
    rec = make_rec(config=TrialConfig(batch_size=16, bucket_by_length=True), workload=sequences)
    section = yaml.safe_load(rec.to_yaml(tmp_path / "best.yaml"))["workload"]
    assert {"image_size", "num_classes", "dataset_size"}.isdisjoint(section)
    assert section["model"] == FIX + "sequences" and section["data"]["lengths"] == sequences.data["lengths"]
    assert {leaf["path"] for leaf in section["data"]["batch"]} == {"input_ids", "attention_mask", "labels"}
    back = Recommendation.from_yaml(tmp_path / "best.yaml")
    assert back == rec and back.workload.data == sequences.data
    image_section = make_rec(workload=images).to_dict()["workload"]
    assert image_section["image_size"] == 32 and "num_classes" not in image_section  # it takes image_size only
    built_in = make_rec().to_dict()["workload"]
    assert built_in["image_size"] == 64 and built_in["dataset_size"] == 50_000  # a built-in uses them


def test_an_old_yaml_without_data_still_reads(tmp_path):
    d = make_rec().to_dict()
    d["workload"] = {"model": FIX + "sequences", "task": "train", "image_size": 224, "data_dir": None,
                     "device": "cpu", "num_classes": 1000, "dataset_size": 50000, "global_batch": None}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(d))
    assert Recommendation.from_yaml(tmp_path / "old.yaml").workload.data is None


# --- a bad length ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, says", [("length_float", r"returned \d+\.5 \(float\)"),
                                        ("length_negative", r"returned -1 \(int\)"),
                                        ("length_text", r"returned 'long' \(str\)")])
def test_a_length_that_is_not_a_non_negative_int_is_refused(name, says):
    with pytest.raises(WorkloadError, match=f"length {says} for item 0; .*non-negative int") as info:
        check(Workload(model=FIX + name))
    assert "\n" not in str(info.value)


def test_the_cli_refuses_a_bad_length_in_one_line_before_a_study_is_written(tmp_path):
    db = tmp_path / "s.db"
    proc = run_cli("run", "--model", FIX + "length_negative", "--trials", "1", "--storage", f"sqlite:///{db}",
                   "--no-progress")
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "\n" not in err and "length returned -1" in err and err.startswith("autotune run: error:")
    assert not db.exists() or not sqlite3.connect(db).execute(
        "select name from sqlite_master where name = 'studies'").fetchall()
