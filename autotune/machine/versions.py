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

__all__ = ["package_version"]


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


def _assigned_version(path: str) -> str | None:
    """The string literal assigned to ``__version__`` at the top level of ``path``, else None."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__version__" and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            return node.value.value
    return None
