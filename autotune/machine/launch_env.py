"""The environment a process must start with to run a config as it was measured: the thread runtimes read
their counts and placement once, when they load, the dynamic loader its preloads at start, and glibc its
malloc settings at the first allocation. A trial's child gets exactly this (``trial.runner.child_env``); a
recommendation lists it for the user's launch.

**A clean room for every trial.** What the shell exports that changes how a trial runs (thread counts and
placement, the allocator's settings, preloaded libraries: ``inherited_env``) is cleared from every trial's
environment, the baseline's and each candidate's alike, locally, on Ray and in each DDP rank (they start from the
trial's child): the baseline is PyTorch's own defaults and each candidate exactly its config. Keeping them for all
instead would make "PyTorch's defaults" whatever the shell happened to export (``OMP_NUM_THREADS=1`` from torchrun or
a cluster: a one-thread baseline against a winner with ``threads=N``, a claim that grows and names the wrong cause),
and the same recommendation would differ by which shell ran it. What the shell set is said when ``run`` starts
(``inherited_line``) and kept in the recommendation's provenance, because the user's own training process inherits it
unless the launch sets the recommendation's ``environment``.
"""

from __future__ import annotations

import os
from typing import Mapping

from autotune.config import TrialConfig
from autotune.machine.affinity import env_for as affinity_env
from autotune.machine.malloc import env_for

__all__ = ["THREAD_ENV_VARS", "INHERITED_VARS", "INHERITED_PREFIXES", "launch_env", "inherited_env", "clean_env",
           "inherited_line"]

# Thread-count variables the OpenMP, MKL and OpenBLAS runtimes read once, when they load.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# What a shell may export that changes a trial's speed, cleared from every trial (the module docstring): thread
# counts and placement (OpenMP, GNU and Intel runtimes, MKL, OpenBLAS, numexpr, Accelerate), preloaded libraries
# (tcmalloc, jemalloc, Intel's OpenMP), the allocators' settings (glibc's tunables, PyTorch's caching allocator and
# its huge-page switch); and every ``MALLOC_*`` (glibc, jemalloc's MALLOC_CONF) and ``TCMALLOC_*`` variable.
INHERITED_VARS = THREAD_ENV_VARS + (
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
    "OMP_WAIT_POLICY", "OMP_DYNAMIC", "OMP_MAX_ACTIVE_LEVELS", "OMP_THREAD_LIMIT", "GOMP_CPU_AFFINITY",
    "GOMP_SPINCOUNT", "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_HW_SUBSET", "KMP_SETTINGS", "MKL_DYNAMIC",
    "MKL_THREADING_LAYER", "LD_PRELOAD", "GLIBC_TUNABLES", "THP_MEM_ALLOC_ENABLE", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
INHERITED_PREFIXES = ("MALLOC_", "TCMALLOC_")


def launch_env(config: TrialConfig) -> dict[str, str]:
    """The environment variables a process must start with to run ``config`` as it was measured: the thread
    runtimes read their counts and affinity at load, the loader its preloads at start and glibc its malloc
    settings at the first allocation. The trial's child gets exactly these (``runner.child_env``); a
    recommendation lists them for the user's launch."""
    env = {v: str(config.intra_op_threads) for v in THREAD_ENV_VARS} if config.intra_op_threads else {}
    env.update(env_for(config.malloc))
    env.update(affinity_env(config.affinity))
    return env


def _inherited(name: str) -> bool:
    return name in INHERITED_VARS or name.startswith(INHERITED_PREFIXES)


def inherited_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What ``environ`` (default this process's, i.e. the shell's) sets that the trials clear (``INHERITED_VARS``),
    sorted by name.

    >>> inherited_env({"OMP_NUM_THREADS": "1", "HOME": "/root", "MALLOC_ARENA_MAX": "2"})
    {'MALLOC_ARENA_MAX': '2', 'OMP_NUM_THREADS': '1'}
    """
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env) if _inherited(k)}


def clean_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default this process's) without what the trials clear (``inherited_env``): the clean room a
    trial's child starts from, before its config's own ``launch_env``."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if not _inherited(k)}


def inherited_line(environ: Mapping[str, str] | None = None) -> str | None:
    """One line saying what the shell set and that the trials run without it; None when it set nothing.

    >>> inherited_line({"OMP_NUM_THREADS": "1"})
    "the shell sets OMP_NUM_THREADS=1: every trial runs without it (the baseline is PyTorch's own defaults, each \
candidate its config's environment); your training inherits it unless its launch sets the recommendation's environment"
    """
    got = inherited_env(environ)
    if not got:
        return None
    shown = " ".join(f"{k}={v}" for k, v in got.items())
    return (f"the shell sets {shown}: every trial runs without it (the baseline is PyTorch's own defaults, each "
            "candidate its config's environment); your training inherits it unless its launch sets the "
            "recommendation's environment")
