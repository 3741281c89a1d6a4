"""Where trials run: a ``SearchBackend`` (``base.py``) per place. ``local`` runs them one at a time on this
machine; ``ray`` spreads them over a Ray cluster through Ray Tune. A backend module is imported only when
asked for, and one whose dependency is missing says so, with the install command, when it connects. Every backend
records its trials through one protocol (``protocol``: begin, claim, answer from the study, record).

May import: ``search.record``, ``search.space``, ``search.plan`` (a backend reads a frozen context and budget, never
the tuner); below them ``trial``, ``workloads``, ``machine`` and the records at the top. Not ``search.choose``
directly, nor the tuner.
"""

from __future__ import annotations

import importlib

from autotune.errors import AutotuneError
from autotune.search.backends.base import SearchBackend

__all__ = ["SearchBackend", "load_backend", "BACKENDS"]

# name -> (module, class)
BACKENDS = {
    "local": ("autotune.search.backends.local", "LocalBackend"),
    "ray": ("autotune.search.backends.ray", "RayBackend"),
}


def load_backend(name: str, *, address: str | None = None) -> SearchBackend:
    """A new backend of kind ``name``; ``address`` is the cluster to join, for backends that have one."""
    if name not in BACKENDS:
        raise AutotuneError(f"unknown backend {name!r}: use {' or '.join(BACKENDS)}")
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(address=address)
