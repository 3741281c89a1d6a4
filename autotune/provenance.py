"""Where a recommendation comes from, as it records it: the command that measures its config again, the
versions it was measured with, and the tokens per sample of a text workload's trials."""

from __future__ import annotations

import shlex
from typing import Any

from autotune.config import TrialConfig, Workload, knob_args
from autotune.machine.versions import package_version, torch_build
from autotune.search.record import trials as keys

__all__ = ["reproduce_command", "versions_of", "tokens_per_sample"]


def reproduce_command(workload: Workload, config: TrialConfig, cap_mb: float | None) -> str:
    """The `autotune trial` command that measures this config again: the workload's flags, then the knobs'
    (``config.knob_args``), then the memory cap."""
    from autotune.workloads.text import is_text

    size_flag = "--seq-len" if is_text(workload.model) else "--image-size"  # the same flag, spelled for text
    args = ["autotune", "trial", "--model", workload.model, "--task", workload.task,
            size_flag, str(workload.image_size), "--device", workload.device]
    if workload.data_dir:
        args += ["--data", workload.data_dir]
    if workload.global_batch:
        args += ["--global-batch", str(workload.global_batch)]
    if workload.nproc_per_node > 1:
        args += ["--nproc-per-node", str(workload.nproc_per_node)]
    args += knob_args(config)
    if cap_mb:
        args += ["--memory-cap", f"{int(cap_mb)}MiB"]
    return shlex.join(args)


def versions_of(hw) -> dict[str, Any]:
    import platform

    from autotune import __version__

    out: dict[str, Any] = {"autotune": __version__, "python": platform.python_version()}
    build = torch_build()  # read from torch's version.py: this process need not import torch for it
    if build is None:
        try:
            import torch

            build = (torch.__version__, torch.version.cuda)
        except ImportError:
            pass
    if build is not None:  # torch.__version__ is a str subclass that yaml.safe_dump refuses: plain strings
        out.update(torch=str(build[0]), torchvision=package_version("torchvision"),
                   cuda=None if build[1] is None else str(build[1]))
    gpus = hw.gpus if hw is not None else ()
    out["driver"] = gpus[0]["driver"] if gpus else None
    return out


def tokens_per_sample(*user_attrs: dict) -> float | None:
    """Tokens per sample from trials' stored windows (``tokens_per_s`` over ``samples_per_s``, pooled over the
    trials given), or None when their workload counted no tokens. Pooled, because one short trial's few windows
    may hold mostly short or long sequences (with length bucketing, whole batches of them)."""
    tokens = samples = 0.0
    for ua in user_attrs:
        t, s = ua.get(keys.TOKENS) or [], ua.get(keys.SAMPLES) or []
        if t and len(t) == len(s):
            tokens, samples = tokens + sum(t), samples + sum(s)
    return round(tokens / samples, 3) if samples else None
