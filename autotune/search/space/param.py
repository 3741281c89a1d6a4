"""One parameter of a search space (``space.search_space``): its name, type, choices and condition. Apart from the
space so that what reshapes a space without loading one (``search.space.rank_space``) can make parameters."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Param"]


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    choices: tuple = ()
    when: tuple | None = None  # (param, op, value)
