"""Workloads bound by their data path, for the ceilings' tests (autotune.search.record.ceilings): a model of a few
hundred parameters over JPEGs decoded and cropped on the CPU, as a real image pipeline does (PIL's decoder, a
torchvision RandomResizedCrop), so nearly all of a step is loading; and one whose collate raises.

The JPEG is made here, in memory, once per process (smooth noise, as photos compress): nothing is downloaded."""

from __future__ import annotations

import io

import torch
from torch import nn

_SIDE = (640, 480)


def _jpeg() -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    small = rng.integers(0, 255, (_SIDE[1] // 16, _SIDE[0] // 16, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize(_SIDE, Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


class Decoded(torch.utils.data.Dataset):
    """``n`` items, each one JPEG decoded, randomly resized and cropped to ``image_size``, flipped, to a tensor."""

    def __init__(self, image_size: int = 32, n: int = 256) -> None:
        from torchvision import transforms

        self.blob, self.n = _jpeg(), n
        self.tf = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                                      transforms.ToTensor()])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        from PIL import Image

        img = Image.open(io.BytesIO(self.blob)).convert("RGB")
        return self.tf(img), i % 4


def build(image_size: int = 32):
    """A tiny convnet over decoded JPEGs: the data path binds (the model is a few hundred parameters)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 4))
    return model, Decoded(image_size), nn.CrossEntropyLoss()


def _bad_collate(items):
    raise ValueError("labels of mixed types: cannot stack")


def bad_collate(image_size: int = 32):
    """As ``build``, with a collate that raises: the data path fails alone, with the workload's own message."""
    model, dataset, loss = build(image_size)
    return {"model": model, "dataset": dataset, "loss_fn": loss, "collate_fn": _bad_collate}


class _FailsInAWorker(Decoded):
    def __getitem__(self, i: int):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("the image store is not reachable from a worker process")
        return super().__getitem__(i)


def fails_in_a_worker(image_size: int = 32):
    """As ``build``, with a dataset that loads in the training process and fails in any DataLoader worker (a handle
    that does not survive the fork): the data path fails only when measured with workers."""
    model, _, loss = build(image_size)
    return model, _FailsInAWorker(image_size), loss


class _Plain(torch.utils.data.Dataset):
    """``n`` items of a ready 3 x ``image_size`` x ``image_size`` float image (nothing to decode): a batch of 64 at
    224 px is 38.5 MB to hand over, made in milliseconds."""

    def __init__(self, image_size: int, n: int = 512) -> None:
        self.image_size, self.n = image_size, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((3, self.image_size, self.image_size), float(i % 7)), i % 4


def big_batches(image_size: int = 224):
    """A tiny convnet over large ready-made images: what the loader holds in shared memory grows fast with the
    batch, the workers and the prefetch (``autotune.machine.loader_memory``), for the loader's memory tests."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 4))
    return model, _Plain(image_size), nn.CrossEntropyLoss()
