"""The environment stamp: the facts ``python -m torch.utils.collect_env`` reports (its ``get_env_info()``), kept
with a recommendation and printed by ``autotune env``, and which of them changed since.

``get_env_info()`` runs pip, conda, gcc, nvidia-smi... one after another (about 0.7 s here, seconds with a GPU or
many packages), and initialises CUDA when a GPU is visible. So it runs in a child process with a time limit
(``TIMEOUT_S``; a tuner's parent must not hold a CUDA context, and a hung ``nvidia-smi`` must not hang us), once
per process (cached); or in the workload's check child, which imports torch anyway, alongside the check
(``remember_env_stamp``: a run then starts no second child importing torch for it). Left out: ``cpu_info``
(lscpu's whole output: the recommendation's hardware section has the CPU model and the flags that matter) and
``pip_version``. The package lists are kept as lists of lines.

>>> stamp = collect_env_stamp()                       # doctest: +SKIP
>>> stamp["gcc_version"], stamp["pip_packages"][:1]   # doctest: +SKIP
('(Debian 12.2.0-14+deb12u1) 12.2.0', ['numpy==2.4.6'])
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

from autotune.machine.launch import SAFE_PATH_PRELUDE, die_with_parent_prelude, with_package_path

__all__ = ["collect_env_stamp", "have_stamp", "remember_env_stamp", "raw_env_info", "stamp_from_raw", "stamp_changes",
           "describe_stamp", "TIMEOUT_S"]

TIMEOUT_S = 60.0
_LEFT_OUT = ("cpu_info", "pip_version")
_PACKAGE_LISTS = ("pip_packages", "conda_packages")
# facts the recommendation's ``versions`` already compares (check_versions names them once)
_IN_VERSIONS = ("torch_version", "cuda_compiled_version", "nvidia_driver_version")
_IN_VERSIONS_PACKAGES = ("torch", "torchvision")
# the child answers torch's facts too (hardware.torch_facts): `autotune env` then imports torch once, there
_CHILD = ("import json\nfrom autotune.machine.envstamp import raw_env_info\n"
          "from autotune.machine.hardware import torch_facts\n"
          "print(json.dumps({'raw': raw_env_info(), 'torch': torch_facts()}))")


# what a child of this process that had torch imported anyway answered (the workload's check child: ``remember``)
_REMEMBERED: dict[str, Any] = {}


def remember_env_stamp(raw: dict[str, Any] | None) -> None:
    """Keep the ``get_env_info()._asdict()`` a child of this process (same interpreter and environment) answered:
    ``collect_env_stamp()`` then returns it instead of starting a child that imports torch again."""
    if raw and not _REMEMBERED:
        _REMEMBERED.update(stamp_from_raw(raw) if "error" not in raw else raw)


def have_stamp() -> bool:
    """Whether this process has its stamp already (collected or remembered): a check child need not collect it."""
    return bool(_REMEMBERED) or _collected.cache_info().currsize > 0


def collect_env_stamp(timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """``torch.utils.collect_env.get_env_info()`` as a plain dict (YAML-safe), from a child process (or what the
    workload's check child answered: ``remember_env_stamp``).

    When it cannot be had (torch too old to have it, the child failed or took over ``timeout_s``), the dict
    is ``{"error": why}``, and ``stamp_changes`` compares nothing against it."""
    return dict(_REMEMBERED) if _REMEMBERED else _collected(timeout_s)


@functools.lru_cache(maxsize=1)
def _collected(timeout_s: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, "-c", SAFE_PATH_PRELUDE + die_with_parent_prelude() + _CHILD],
                              capture_output=True, text=True, timeout=timeout_s,
                              env=with_package_path(dict(os.environ)))
    except subprocess.TimeoutExpired:
        return {"error": f"collect_env took over {timeout_s:.0f} s"}
    except OSError as exc:
        return {"error": f"collect_env could not start: {exc.strerror or exc}"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"collect_env failed: {tail[:200]}"}
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        raw = answer["raw"]
    except (ValueError, IndexError, KeyError, TypeError):
        return {"error": "collect_env printed no result"}
    from autotune.machine.hardware import remember_torch_facts

    remember_torch_facts(answer.get("torch"))  # this process's detect() then need not import torch
    return stamp_from_raw(raw)


def raw_env_info() -> dict[str, Any]:
    """``get_env_info()._asdict()``, JSON-safe, in this process (which imports torch and may initialise CUDA: a
    child's job, ``workloads.check_child``)."""
    from torch.utils.collect_env import get_env_info

    return json.loads(json.dumps(get_env_info()._asdict(), default=str))


def stamp_from_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """The stamp kept from ``get_env_info()._asdict()``: ``_LEFT_OUT`` dropped, package lists as lists of lines."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k in _LEFT_OUT:
            continue
        if k in _PACKAGE_LISTS:
            v = [line.strip() for line in (v or "").splitlines() if line.strip()] or None
        elif v is not None and not isinstance(v, (bool, int, float)):
            v = str(v)
        out[k] = v
    return out


def _packages(lines: list[str] | None) -> dict[str, str]:
    """``numpy==2.4.6`` (pip) or ``numpy  2.4.6  py311  conda-forge`` (conda) -> {name: version}."""
    out = {}
    for line in lines or ():
        if "==" in line:
            name, _, version = line.partition("==")
        else:
            name, _, rest = line.partition(" ")
            version = rest.split()[0] if rest.split() else ""
        out[name.strip().lower()] = version.strip()
    return out


def stamp_changes(old: dict[str, Any] | None, new: dict[str, Any] | None, *, most: int = 12) -> list[str]:
    """The facts that differ between two stamps, one short phrase each (``gcc_version 12.2.0 -> 13.1.0``,
    ``pip numpy 2.4.6 -> 2.5.0``). Only facts both stamps have are compared (an older torch reports fewer),
    nothing when either could not be taken, and not what ``Recommendation.versions`` compares already."""
    if not old or not new or "error" in old or "error" in new:
        return []
    out = []
    for k in old:
        if k not in new or k in _IN_VERSIONS:
            continue
        if k in _PACKAGE_LISTS:
            a, b = _packages(old[k]), _packages(new[k])
            for name in sorted(set(a) | set(b)):
                if name not in _IN_VERSIONS_PACKAGES and a.get(name) != b.get(name):
                    out.append(f"{k.split('_')[0]} {name} {a.get(name) or 'absent'} -> {b.get(name) or 'absent'}")
        elif old[k] != new[k]:
            out.append(f"{k} {old[k]} -> {new[k]}")
    if len(out) > most:
        out = out[:most] + [f"and {len(out) - most} more"]
    return out


def describe_stamp(stamp: dict[str, Any]) -> str:
    """The stamp as ``autotune env`` prints it: one fact a line, the package lists indented below their name."""
    lines = ["collect_env (as python -m torch.utils.collect_env reports it):"]
    for k, v in stamp.items():
        if isinstance(v, list):
            lines.append(f"  {k}:")
            lines += [f"    {x}" for x in v]
        else:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines)
