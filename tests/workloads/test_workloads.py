"""Workloads: check() refuses what cannot be built; build() makes real models and data."""

from __future__ import annotations

import io
import sys

import pytest
import torch
import torchvision
from PIL import Image

from autotune.config import Workload
from autotune.errors import WorkloadError
from autotune.workloads.build import Built, SyntheticJPEGDataset, _transforms, build, check, list_models

FIX = "tests.workloads_fixtures"


def _image_folder(root, classes=("cats", "dogs"), per_class=3, size=(40, 30)):
    for ci, c in enumerate(classes):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", size, (40 * ci + 10 * i, 100, 200)).save(root / c / f"img{i}.jpg", format="JPEG")
    return root


# --- check(): refusals --------------------------------------------------------------------------------------

def test_list_models():
    names = list_models()
    assert "resnet18" in names and "mobilenet_v3_small" in names
    assert names == sorted(names)


def test_the_model_names_read_from_torchvisions_source_are_the_ones_it_registers():
    import subprocess

    from autotune.workloads.names import classification_models

    # what the import registers (this process has torchvision) ...
    assert list(classification_models()) == sorted(torchvision.models.list_models(module=torchvision.models))
    # ... read in a process that never imports it
    code = ("import sys\nfrom autotune.workloads.names import classification_models\n"
            "names = classification_models()\nassert 'torchvision' not in sys.modules and 'torch' not in sys.modules\n"
            "print(len(names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == len(classification_models()) > 50  # resnets, vgg, vit, convnext, regnet...


def test_check_unknown_model_suggests_close_names():
    with pytest.raises(WorkloadError) as info:
        check(Workload(model="resnet81"))
    msg = str(info.value)
    assert "'resnet81'" in msg and "did you mean" in msg and "resnet18" in msg
    assert "\n" not in msg


def test_check_module_that_does_not_import():
    with pytest.raises(WorkloadError) as info:
        check(Workload(model="nosuchpkg.mod:fn"))
    assert "nosuchpkg" in str(info.value) and "cannot import" in str(info.value)


def test_check_missing_attribute_and_not_callable():
    with pytest.raises(WorkloadError, match="no attribute 'nope'"):
        check(Workload(model=f"{FIX}:nope"))
    with pytest.raises(WorkloadError, match="not a callable"):
        check(Workload(model=f"{FIX}:NOT_CALLABLE"))


@pytest.mark.parametrize("spec", [":fn", "pkg.mod:"])
def test_check_malformed_callable_spec(spec):
    with pytest.raises(WorkloadError, match="package.module:callable"):
        check(Workload(model=spec))


def test_check_refuses_a_callable_that_needs_an_argument_autotune_does_not_pass():
    """``--model os:system`` resolves to a callable, but one that needs ``command``: every trial would fail."""
    with pytest.raises(WorkloadError) as info:
        check(Workload(model="os:system"))
    msg = str(info.value)
    assert "os:system cannot be called as a workload" in msg and "'command'" in msg and "\n" not in msg


def test_check_ends_an_import_that_hangs(tmp_path, monkeypatch):
    """A module that blocks at import (a lock, a prompt) is imported in a child that is killed at the timeout."""
    import time

    import psutil

    (tmp_path / "stuck_at_import.py").write_text(
        "import os, pathlib, time\n"
        "pathlib.Path('pid').write_text(str(os.getpid()))\n"
        "time.sleep(3600)\n"
        "def build(image_size=32):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_IMPORT_TIMEOUT_S", "2")
    t0 = time.monotonic()
    with pytest.raises(WorkloadError, match=r"importing 'stuck_at_import' .* did not finish in 2 s"):
        check(Workload(model="stuck_at_import:build"))
    assert time.monotonic() - t0 < 15
    pid = int((tmp_path / "pid").read_text())  # the child did import it (in the current folder) ...
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # ... and is gone


def test_check_accepts_good_names():
    check(Workload(model="resnet18"))
    check(Workload(model=f"{FIX}:tiny"))


def test_check_missing_data_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(WorkloadError) as info:
        check(Workload(data_dir=str(missing)))
    assert str(missing) in str(info.value) and "does not exist" in str(info.value)


def test_check_data_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file.jpg"
    f.write_bytes(b"x")
    with pytest.raises(WorkloadError, match="not a folder"):
        check(Workload(data_dir=str(f)))


def test_check_empty_data_dir(tmp_path):
    with pytest.raises(WorkloadError, match="no images in class sub-folders"):
        check(Workload(data_dir=str(tmp_path)))


def test_check_data_dir_without_images(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("no images here")
    (tmp_path / "b").mkdir()
    with pytest.raises(WorkloadError, match="ImageFolder layout"):
        check(Workload(data_dir=str(tmp_path)))


def test_check_images_without_class_folders(tmp_path):
    Image.new("RGB", (20, 20)).save(tmp_path / "x.jpg")
    with pytest.raises(WorkloadError, match="no images in class sub-folders"):
        check(Workload(data_dir=str(tmp_path)))


def test_check_refuses_a_class_folder_without_images(tmp_path):
    _image_folder(tmp_path, classes=("cats",))
    (tmp_path / "dogs").mkdir()
    with pytest.raises(FileNotFoundError):
        torchvision.datasets.ImageFolder(str(tmp_path))  # what the child would do
    with pytest.raises(WorkloadError):
        check(Workload(data_dir=str(tmp_path)))


# --- build(): torchvision models and image folders -----------------------------------------------------------

@pytest.mark.parametrize("task", ["train", "infer"])
def test_build_image_folder(tmp_path, task):
    root = _image_folder(tmp_path / "data")
    wl = Workload(model="resnet18", task=task, image_size=32, data_dir=str(root), num_classes=2)
    check(wl)
    built = build(wl)
    assert isinstance(built, Built)
    assert isinstance(built.dataset, torchvision.datasets.ImageFolder)
    assert built.dataset.classes == ["cats", "dogs"]
    assert len(built.dataset) == 6
    x, y = built.dataset[4]
    assert isinstance(x, torch.Tensor) and x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert y == 1
    assert isinstance(built.model, torchvision.models.ResNet)
    assert built.model.fc.out_features == 2
    assert built.model.eval()(x[None]).shape == (1, 2)
    assert isinstance(built.loss_fn, torch.nn.CrossEntropyLoss)


def test_build_synthetic():
    wl = Workload(model="resnet18", task="infer", image_size=32, num_classes=5, dataset_size=7)
    built = build(wl)
    assert isinstance(built.dataset, SyntheticJPEGDataset)
    assert len(built.dataset) == 7
    x, y = built.dataset[6]
    assert x.shape == (3, 32, 32) and y == 1
    assert built.model.fc.out_features == 5


def test_build_refuses_unknown_model():
    with pytest.raises(WorkloadError, match="resnet81"):
        build(Workload(model="resnet81"))


# --- SyntheticJPEGDataset --------------------------------------------------------------------------------------

def test_synthetic_jpeg_really_decodes():
    ds = SyntheticJPEGDataset(32, 10, num_classes=3, transform=_transforms(32, "train"), pool_size=4)
    assert len(ds) == 10 and len(ds.pool) == 4
    for blob in ds.pool:
        assert blob[:2] == b"\xff\xd8" and blob[-2:] == b"\xff\xd9"  # JPEG SOI ... EOI
        img = Image.open(io.BytesIO(blob))
        assert img.format == "JPEG"
        assert 32 <= img.height and 32 <= img.width <= 60  # ~1.15x the crop, varied aspect
    assert len(set(ds.pool)) == 4  # distinct images
    for i in range(10):
        x, y = ds[i]
        assert x.shape == (3, 32, 32) and x.dtype == torch.float32
        assert y == i % 3
    assert not torch.equal(ds[0][0], ds[1][0])


def test_synthetic_without_transform_gives_pil_images_and_is_seeded():
    a = SyntheticJPEGDataset(48, 4, pool_size=2, seed=1)
    b = SyntheticJPEGDataset(48, 4, pool_size=2, seed=1)
    c = SyntheticJPEGDataset(48, 4, pool_size=2, seed=2)
    assert a.pool == b.pool and a.pool != c.pool
    img, label = a[3]
    assert isinstance(img, Image.Image) and img.mode == "RGB"
    assert label == 3


def test_synthetic_infer_transform_is_deterministic():
    ds = SyntheticJPEGDataset(32, 2, transform=_transforms(32, "infer"), pool_size=2)
    assert torch.equal(ds[0][0], ds[0][0])
    assert ds[0][0].shape == (3, 32, 32)


# --- user callables --------------------------------------------------------------------------------------------

def test_build_user_callable_tuple():
    built = build(Workload(model=f"{FIX}:tiny", image_size=32))
    assert isinstance(built.model, torch.nn.Module)
    assert len(built.dataset) == 256
    x, y = built.dataset[0]
    assert x.shape == (3, 32, 32) and 0 <= int(y) < 10
    assert built.model(x[None]).shape == (1, 10)


def test_build_user_callable_dict_gets_the_offered_arguments():
    built = build(Workload(model=f"{FIX}:tiny_dict", image_size=40, num_classes=7))
    x, _ = built.dataset[0]
    assert x.shape == (3, 40, 40)
    assert built.model(x[None]).shape == (1, 7)
    assert callable(built.loss_fn)


def test_two_tuple_is_fine_for_inference():
    built = build(Workload(model=f"{FIX}:no_loss", task="infer", image_size=32))
    assert built.loss_fn is None


@pytest.mark.parametrize("name, words", [
    ("wrong_return", ["returned str", "(model, dataset, loss_fn)"]),
    ("not_a_module", ["function", "torch.nn.Module"]),
    ("no_loss", ["loss_fn", "task=train"]),
    ("empty_dataset", ["dataset", "empty"]),
    ("dict_without_dataset", ["without dataset"]),
])
def test_user_callable_returning_wrong_things(name, words):
    with pytest.raises(WorkloadError) as info:
        build(Workload(model=f"{FIX}:{name}", image_size=32))
    for w in words:
        assert w in str(info.value)
