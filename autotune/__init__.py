"""autotune: measure, don't guess, the fastest PyTorch training/inference settings for this machine.

The public surface is what ``__all__`` lists; everything else is internal. Imports are lazy so that
``import autotune`` (and every trial's child process) stays light.

>>> from autotune import recommend                                  # doctest: +SKIP
>>> rec = recommend("resnet18", budget="20m", memory_cap="12GiB")   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "recommend", "tune", "Recommendation", "Tuner", "run_trial", "detect_hardware", "load_space", "SearchSpace",
    "TrialConfig", "TrialResult", "Workload", "MeasureSpec", "AutotuneError", "ConfigError", "WorkloadError",
    "SpaceError", "StorageError", "is_oom", "__version__",
]

_LAZY = {
    "recommend": ("api", "recommend"),
    "tune": ("api", "tune"),
    "Recommendation": ("recommendation", "Recommendation"),
    "Tuner": ("search.tuner", "Tuner"),
    "run_trial": ("trial.runner", "run_trial"),
    "detect_hardware": ("machine.hardware", "detect"),
    "load_space": ("search.space.search_space", "load_space"),
    "SearchSpace": ("search.space.search_space", "SearchSpace"),
    "TrialConfig": ("config", "TrialConfig"),
    "TrialResult": ("result", "TrialResult"),
    "Workload": ("config", "Workload"),
    "MeasureSpec": ("config", "MeasureSpec"),
    "AutotuneError": ("errors", "AutotuneError"),
    "ConfigError": ("errors", "ConfigError"),
    "WorkloadError": ("errors", "WorkloadError"),
    "SpaceError": ("errors", "SpaceError"),
    "StorageError": ("errors", "StorageError"),
    "is_oom": ("machine.oom", "is_oom"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
