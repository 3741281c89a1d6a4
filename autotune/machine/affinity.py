"""The thread-affinity knob: whether the OpenMP runtime pins its threads to cores, as PyTorch's CPU launcher
(``torch.backends.xeon.run_cpu``) and Intel's tuning guides do.

An unpinned intra-op thread may be moved between cores by the scheduler and find its caches cold; pinned, it
stays, but it can no longer dodge another busy process either (a DataLoader worker forked from a pinned main
thread inherits its core). Which wins depends on the machine and the workload, so it is measured like any knob.

``close`` packs the threads on neighbouring cores (``OMP_PROC_BIND=close``, one place per core), ``spread``
spreads them over the allowed cores. GNU OpenMP (libgomp, what PyTorch's Linux wheels use) reads only these;
Intel's OpenMP (libiomp5, in some builds and conda environments) reads its own ``KMP_AFFINITY`` (``compact`` /
``scatter``) and ``KMP_BLOCKTIME`` (1 ms of spinning before a thread sleeps, the launcher's setting), so those
are set only where torch ships libiomp5 (``intel_openmp``). The runtimes read them when they load: only a new
process can get them, so the exported recommendation lists them under ``environment``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autotune.config import AFFINITY_MODES

__all__ = ["AFFINITY_MODES", "env_for", "intel_openmp"]


_GNU = {"close": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
        "spread": {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"}}
_INTEL = {"close": {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"},
          "spread": {"KMP_AFFINITY": "granularity=fine,scatter", "KMP_BLOCKTIME": "1"}}


def intel_openmp() -> bool:
    """torch's own libraries include Intel's OpenMP runtime (libiomp5), found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return False
    return any((Path(spec.origin).parent / "lib").glob("libiomp5*"))


def env_for(mode: str, *, intel: bool | None = None) -> dict[str, str]:
    """Environment variables that give a new process this affinity (empty for ``default``); ``intel``: whether
    Intel's OpenMP runtime is in use (default: ``intel_openmp()``).

    >>> env_for("close", intel=False)
    {'OMP_PROC_BIND': 'close', 'OMP_PLACES': 'cores'}
    """
    if mode not in AFFINITY_MODES:
        raise ValueError(f"affinity {mode!r}: expected one of {', '.join(AFFINITY_MODES)}")
    if mode == "default":
        return {}
    env = dict(_GNU[mode])
    if intel_openmp() if intel is None else intel:
        env.update(_INTEL[mode])
    return env
