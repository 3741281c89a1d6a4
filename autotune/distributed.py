"""A recommendation of N DDP ranks as something to launch: the YAML's ``distributed`` section and the ``torchrun``
line with the per-rank environment (issue 27 item 5). One process has neither: its YAML reads as before.

Everything here is derived from the recommendation's workload (``nproc_per_node``, device, global batch) and config
(per-rank batch size, threads, workers, DDP's arguments), so it is written, not read back: an old YAML still reads,
and a section that disagrees with its workload (edited by hand) is refused (``check_section``).

>>> print(launch_command(rec, "train.py", "--epochs", "3"))                     # doctest: +SKIP
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 torchrun --standalone --nnodes 1 --nproc-per-node 2 \
train.py --epochs 3
"""

from __future__ import annotations

import shlex
from typing import Any

from autotune.errors import ConfigError
from autotune.machine.launch_env import launch_env

__all__ = ["backend_for", "distributed_section", "launch_command", "check_section"]


def backend_for(device: str) -> str:
    """The process group's backend the ranks were measured with: NCCL on GPUs (one per rank), gloo on the CPU."""
    return "gloo" if device == "cpu" else "nccl"


def launch_command(rec: Any, script: str = "train.py", *script_args: str) -> str:
    """The shell line that starts the recommended ranks on this machine: the per-rank environment the trials'
    ranks started with (thread counts and the allocator: ``launch_env``; torchrun passes it to every rank),
    then ``torchrun --standalone --nnodes 1 --nproc-per-node N`` and the user's script. For one process, the
    environment and ``python script``."""
    env = [f"{k}={shlex.quote(v)}" for k, v in launch_env(rec.config).items()]
    if rec.world_size <= 1:
        return " ".join([*env, "python", shlex.join([script, *script_args])])
    launcher = ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", str(rec.world_size)]
    return " ".join([*env, shlex.join([*launcher, script, *script_args])])


def distributed_section(rec: Any) -> dict[str, Any] | None:
    """The YAML's ``distributed`` section, or None for one process: world size and backend, the batch per rank
    and across ranks, DDP's arguments, each rank's threads and workers, and the launch line."""
    n = rec.world_size
    if n <= 1:
        return None
    c = rec.config
    return {
        "world_size": n, "nnodes": 1, "nproc_per_node": n, "backend": backend_for(rec.workload.device),
        "per_rank_batch": c.batch_size, "accumulation_steps": rec.accumulation_steps,
        # samples per optimizer step over all ranks: the workload's global batch, or what the ranks make
        "global_batch": rec.global_batch or c.batch_size * rec.accumulation_steps * n,
        "ddp": c.ddp_kwargs(),
        "per_rank": {"intra_op_threads": c.intra_op_threads, "inter_op_threads": c.inter_op_threads,
                     "num_workers": c.num_workers},
        "environment": launch_env(c),
        "launch": launch_command(rec),
    }


def check_section(section: Any, rec: Any, source: str) -> None:
    """Refuse (one line) a stored ``distributed`` section that says other than the workload and config it
    travels with: the section is derived, so a difference means one of them was edited by hand."""
    if section is None:
        return
    expected = distributed_section(rec)
    if not isinstance(section, dict) or expected is None:
        raise ConfigError(f"{source}: a 'distributed' section with a one-process workload (nproc_per_node 1); "
                          "export it again with `autotune export`")
    for key in ("world_size", "per_rank_batch", "ddp"):
        if key in section and section[key] != expected[key]:
            raise ConfigError(f"{source}: distributed.{key} is {section[key]!r} but the workload and config say "
                              f"{expected[key]!r}; export it again with `autotune export`")
