"""The environment a process must start with to run a config as it was measured: the thread runtimes read
their counts and placement once, when they load, the dynamic loader its preloads at start, and glibc its
malloc settings at the first allocation. A trial's child gets exactly this (``trial.runner.child_env``); a
recommendation lists it for the user's launch."""

from __future__ import annotations

from autotune.config import TrialConfig
from autotune.machine.affinity import env_for as affinity_env
from autotune.machine.malloc import env_for

__all__ = ["THREAD_ENV_VARS", "launch_env"]

# Thread-count variables the OpenMP, MKL and OpenBLAS runtimes read once, when they load.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def launch_env(config: TrialConfig) -> dict[str, str]:
    """The environment variables a process must start with to run ``config`` as it was measured: the thread
    runtimes read their counts and affinity at load, the loader its preloads at start and glibc its malloc
    settings at the first allocation. The trial's child gets exactly these (``runner.child_env``); a
    recommendation lists them for the user's launch."""
    env = {v: str(config.intra_op_threads) for v in THREAD_ENV_VARS} if config.intra_op_threads else {}
    env.update(env_for(config.malloc))
    env.update(affinity_env(config.affinity))
    return env
