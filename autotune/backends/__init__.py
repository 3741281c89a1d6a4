"""Where trials run. ``local`` is the Tuner's own loop (one trial at a time on this machine); other backends
are imported only when asked for, and a missing dependency fails with the exact install command."""

from __future__ import annotations

import importlib

from ..errors import AutotuneError

_BACKENDS = {"ray": ("autotune.backends.ray", "ray", 'pip install "ray[tune]"')}


def load_backend(name: str):
    """The backend module for ``name`` (it has ``run_study(tuner, *, trials, timeout_s, address)``)."""
    if name not in _BACKENDS:
        raise AutotuneError(f"unknown backend {name!r}: use local or {', '.join(_BACKENDS)}")
    module, needs, install = _BACKENDS[name]
    try:
        importlib.import_module(needs)
    except ImportError:
        raise AutotuneError(f"--backend {name} needs {needs}: {install}") from None
    return importlib.import_module(module)
