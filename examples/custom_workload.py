"""A custom workload for autotune: your own model and dataset instead of a torchvision model name.

autotune calls ``build`` with the keyword arguments it accepts among ``image_size``, ``task`` and
``num_classes``, and expects ``(model, dataset, loss_fn)`` back. Run these from the repository root (the
folder that contains ``examples/``) so that ``examples.custom_workload`` can be imported:

    # measure one config in an isolated child process
    autotune trial --model examples.custom_workload:build --image-size 64 --batch-size 32 --num-workers 1

    # tune it: a study that searches batch size, workers, AMP, channels_last, threads...
    autotune run --model examples.custom_workload:build --image-size 64 --trials 20 --storage sqlite:///trials/custom.db

or from Python: ``autotune.recommend("examples.custom_workload:build", image_size=64, trials=20)``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

NUM_CLASSES = 10


class SquaresDataset(Dataset):
    """Images drawn on the fly: noise plus a bright square whose position gives the class.

    Each item is made in ``__getitem__`` (like decoding a file would be), so DataLoader workers have real
    work to do and the tuner's ``num_workers`` choice matters. Item ``i`` is always the same image.
    """

    def __init__(self, image_size: int, length: int = 2048, num_classes: int = NUM_CLASSES) -> None:
        self.image_size = image_size
        self.length = length
        self.num_classes = num_classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        label = index % self.num_classes
        s = self.image_size
        x = 0.1 * torch.randn(3, s, s, generator=g)
        side = max(2, s // 4)
        # the square walks along the diagonal with the label, so the task is learnable
        top = left = (label * (s - side)) // max(1, self.num_classes - 1)
        x[:, top:top + side, left:left + side] += 1.0
        return x, label


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head: small enough to train on a laptop CPU."""

    def __init__(self, num_classes: int = NUM_CLASSES, width: int = 16) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build(image_size: int = 64, task: str = "train"):
    """Return ``(model, dataset, loss_fn)`` for autotune. ``task`` is "train" or "infer"."""
    if task not in ("train", "infer"):
        raise ValueError(f"task must be 'train' or 'infer', got {task!r}")
    torch.manual_seed(0)
    model = SmallCNN()
    dataset = SquaresDataset(image_size)
    return model, dataset, nn.CrossEntropyLoss()


if __name__ == "__main__":  # a quick check without autotune: one forward pass
    m, ds, loss_fn = build(32)
    x, y = ds[3]
    out = m(x.unsqueeze(0))
    print(f"{len(ds)} images of {tuple(x.shape)}, logits {tuple(out.shape)}, "
          f"loss {loss_fn(out, torch.tensor([y])):.3f}")
