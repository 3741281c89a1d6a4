"""Workloads with a known bottleneck (``tests.report_fixtures:NAME``), and one small study shared by the
report and browser tests (built once per test session through the real CLI).

This module is imported by trial child processes too: it must not import pytest at module level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset


class _HeavyTransformDataset(Dataset):
    """Each sample is a PIL image put through an expensive blur, like a heavy augmentation pipeline.

    With num_workers=0 all of it runs in the training loop, between steps: the step waits for data.
    """

    def __init__(self, image_size: int, n: int = 512, num_classes: int = 10) -> None:
        self.image_size = image_size
        self.n = n
        self.num_classes = num_classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        from PIL import Image, ImageFilter

        g = torch.Generator().manual_seed(i)
        raw = (torch.rand(128, 128, 3, generator=g) * 255).to(torch.uint8).numpy()
        img = Image.fromarray(raw).filter(ImageFilter.GaussianBlur(radius=6)).resize((self.image_size,) * 2)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1) / 255
        return x, i % self.num_classes


def _small_net(width: int = 8) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def input_bound(image_size: int = 16, task: str = "train"):
    """A tiny net fed by a heavy per-sample transform: input-bound with 0 workers."""
    torch.manual_seed(0)
    return _small_net(), _HeavyTransformDataset(image_size), nn.CrossEntropyLoss()


def compute_bound(image_size: int = 32, task: str = "train"):
    """Convolutions over in-memory tensors: loading a batch is an index, the step is all math."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(128, 3, image_size, image_size, generator=g),
                         torch.randint(0, 10, (128,), generator=g))
    return model, data, nn.CrossEntropyLoss()


# --- one small study, shared by the report, browser and security tests (conftest.py's report_study) -------------

TINY_SPACE = """\
name: tiny
device: cpu
parameters:
  batch_size: {type: int, choices: [8, 16]}
  channels_last: {type: bool}
baseline: {batch_size: 8}
"""


@dataclass(frozen=True)
class StudyFiles:
    storage: str
    db: Path
    study_name: str
    n_trials: int
    report: Path  # made with the profiler run
    run_stderr: str
    report_stderr: str


def ensure_study(root: Path) -> StudyFiles:
    """Make (once per ``root``) a tiny study through the real CLI `run`, then `autotune report` on it."""
    from tests.helpers import TINY, run_cli

    done = root / "done.json"
    if done.exists():
        d = json.loads(done.read_text())
        return StudyFiles(**{**d, "db": Path(d["db"]), "report": Path(d["report"])})
    root.mkdir(parents=True, exist_ok=True)
    space = root / "space.yaml"
    space.write_text(TINY_SPACE)
    db = root / "study.db"
    storage = f"sqlite:///{db}"
    run = run_cli("run", "--model", TINY, "--image-size", "16", "--device", "cpu", "--storage", storage,
                  "--space", str(space), "--trials", "2", "--windows", "2", "--window-seconds", "0.2",
                  "--finalists", "1", "--rounds", "1", "--seed", "0", "--no-progress",
                  "--parity-steps", "0", timeout=400)  # no numerics check: no report test reads it
    assert run.returncode == 0, run.stderr[-3000:]
    import optuna

    name = optuna.get_all_study_names(storage)[0]
    report = root / "out" / "report.html"
    # the profiler run imports the study's workload callable: autotune runs it only when it is named here too
    rep = run_cli("report", "--storage", storage, "--study-name", name, "--model", TINY, "-o", str(report),
                  timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    n = len(optuna.load_study(study_name=name, storage=storage).trials)
    files = StudyFiles(storage=storage, db=db, study_name=name, n_trials=n, report=report,
                       run_stderr=run.stderr, report_stderr=rep.stderr)
    done.write_text(json.dumps({**files.__dict__, "db": str(db), "report": str(report)}))
    return files
