"""Installed packages' versions without importing them.

``import torchvision`` imports torch and, through ``torchvision.ops``, ``torch._dynamo``: seconds of CPU on these
machines, in every process that only wants to write the version into a YAML (``autotune export``, ``show``, a
run's parent). A package's own ``version.py`` holds the version string it reports as ``__version__``, local
label included (``0.29.1+cu130``), which the installed metadata leaves out (``0.29.1``); the recommendation
compares versions as strings, so it must be the same string ``torchvision.__version__`` gives. The file is read
and parsed, never executed (torchvision's imports the package).

>>> package_version("torchvision")  # doctest: +SKIP
'0.29.1+cu130'
"""

from __future__ import annotations

import ast
import importlib.util

__all__ = ["package_version", "torch_build"]


def package_version(name: str) -> str | None:
    """``name.__version__`` as the package would report it, or None when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        found = _assigned_version(f"{folder}/version.py")
        if found:
            return found
    try:  # no version.py of that shape: the installed metadata, then the import itself
        from importlib.metadata import PackageNotFoundError, version

        return version(name)
    except PackageNotFoundError:
        pass
    try:
        return str(__import__(name).__version__)
    except (ImportError, AttributeError):
        return None


def torch_build() -> tuple[str, str | None] | None:
    """``(torch.__version__, torch.version.cuda)`` of the torch that ``import torch`` would load, read from its
    ``version.py`` (``cuda`` None for a CPU-only build); None when torch is not installed or that file is not of
    this shape (then import it)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or ()) if spec else ():
        found = _assigned(f"{folder}/version.py")
        if isinstance(found.get("__version__"), str) and "cuda" in found:
            cuda = found["cuda"]
            return found["__version__"], cuda if isinstance(cuda, str) else None
    return None


def _assigned_version(path: str) -> str | None:
    """The string literal assigned to ``__version__`` at the top level of ``path``, else None."""
    found = _assigned(path).get("__version__")
    return found if isinstance(found, str) else None


def _assigned(path: str) -> dict[str, object]:
    """The constants assigned to plain names at the top level of ``path`` (``x = 'a'``, ``x: T = None``)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return {}
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            out[target.id] = value.value
    return out
