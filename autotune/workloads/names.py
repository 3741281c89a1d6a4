"""torchvision's classification model names, read from its source instead of imported.

``torchvision.models.list_models(module=torchvision.models)`` needs ``import torchvision``: torch and, through
``torchvision.ops``, ``torch._dynamo``, 5-9 s of CPU on these 2-core machines, only to tell a user that
``--model resnet81`` is a typo or to print ``autotune models``. The names are the functions that the files
directly in ``torchvision/models/`` register with ``@register_model()`` (or ``@register_model(name=...)``), which
is what ``list_models(module=torchvision.models)`` filters on (the defining module's parent is
``torchvision.models``; detection, segmentation, video... live in sub-folders). The files are parsed, never
executed. Where that finds nothing (a torchvision that registers models some other way), the import answers.
``tests/workloads/test_workloads.py`` checks the parsed list against the imported one.

>>> "resnet18" in classification_models()  # doctest: +SKIP
True
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

__all__ = ["classification_models"]


@functools.lru_cache(maxsize=1)
def classification_models() -> tuple[str, ...]:
    """The sorted names ``torchvision.models.get_model`` builds as classifiers; () when torchvision is absent."""
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return ()
    names: set[str] = set()
    for folder in spec.submodule_search_locations or ():
        for path in sorted(Path(folder, "models").glob("*.py")):
            names.update(_registered(path))
    if names:
        return tuple(sorted(names))
    import torchvision  # registered some other way: ask it

    return tuple(sorted(torchvision.models.list_models(module=torchvision.models)))


def _registered(path: Path) -> list[str]:
    """Top-level functions of ``path`` decorated ``@register_model()``: the decorator's ``name`` or the function's."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and _name(dec.func) == "register_model"):
                continue
            given = [a.value for a in dec.args if isinstance(a, ast.Constant)]
            given += [k.value.value for k in dec.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)]
            out.append(given[0] if given and isinstance(given[0], str) else node.name)
    return out


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None
