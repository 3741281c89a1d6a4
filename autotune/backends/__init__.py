"""Where trials run: a ``SearchBackend`` (``base.py``) per place. ``local`` runs them one at a time on this
machine; ``ray`` spreads them over a Ray cluster through Ray Tune. A backend is imported only when asked
for, and a missing dependency fails with the exact install command."""

from __future__ import annotations

import importlib

from ..errors import AutotuneError
from .base import SearchBackend

__all__ = ["SearchBackend", "load_backend", "BACKENDS"]

# name -> (module, class, the package it needs, how to install it)
BACKENDS = {
    "local": ("autotune.backends.local", "LocalBackend", None, None),
    "ray": ("autotune.backends.ray", "RayBackend", "ray", 'pip install "ray[tune]"'),
}


def load_backend(name: str, *, address: str | None = None) -> SearchBackend:
    """A new backend of kind ``name``; ``address`` is the cluster to join, for backends that have one."""
    if name not in BACKENDS:
        raise AutotuneError(f"unknown backend {name!r}: use {' or '.join(BACKENDS)}")
    module, cls, needs, install = BACKENDS[name]
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError:
            raise AutotuneError(f"--backend {name} needs {needs}: {install}") from None
    return getattr(importlib.import_module(module), cls)(address=address)
