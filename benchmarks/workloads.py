"""Workloads of the quality benchmark that torchvision and autotune do not ship, as ``module:callable``s.

``tiny_vit``: a small vision transformer (patch embedding by a strided convolution, pre-LN encoder blocks, a
class token, a linear head) on synthetic images: attention and MLP matmuls rather than convolutions, the
architecture the benchmark's ResNet and MobileNet do not cover.

    autotune run --model benchmarks.workloads:tiny_vit --image-size 32
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


class TinyViT(nn.Module):
    """ViT-style classifier: ``image_size / patch`` squared patches of ``dim`` features, ``depth`` blocks."""

    def __init__(self, image_size: int, num_classes: int, *, patch: int = 4, dim: int = 128, depth: int = 4,
                 heads: int = 4) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image size {image_size} is not a multiple of the patch size {patch}")
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (image_size // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def tiny_vit(image_size: int = 32, num_classes: int = 10):
    """The model, 2,048 synthetic images and cross-entropy (the workload contract's tuple form)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 3, image_size, image_size, generator=g),
                         torch.randint(0, num_classes, (2048,), generator=g))
    return TinyViT(image_size, num_classes), data, nn.CrossEntropyLoss()
