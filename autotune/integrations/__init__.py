"""Where users already train: Lightning (``lightning.py``), Hugging Face's Trainer (``hf.py``) and MLflow
(``mlflow.py``). Each needs its library, installed as an extra (``pip install "autotune[lightning]"``,
``autotune[hf]``, ``autotune[mlflow]``); used without it, it raises ``MissingExtraError`` naming that command.

``Recommendation.lightning()`` and ``Recommendation.training_arguments()`` import these lazily, so the core
install stays lean and ``import autotune`` never imports a training framework.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from autotune.errors import MissingExtraError

__all__ = ["require"]


def require(module: str, extra: str, *, what: str | None = None) -> ModuleType:
    """Import ``module`` or raise ``MissingExtraError``: one line with the install command of ``extra``.

    >>> require("yaml", "core").__name__
    'yaml'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f"{what or module} is not installed: pip install \"autotune[{extra}]\"") from None
