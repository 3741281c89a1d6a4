"""One parameter of a search space (``space.search_space``): its name, type, choices and condition. Apart from the
space so that what reshapes a space without loading one (``search.space.rank_space``) can make parameters."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

__all__ = ["Param"]

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq,
        "!=": operator.ne}


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    choices: tuple = ()
    when: tuple | None = None  # (param, op, value)

    def holds(self, values: dict[str, Any]) -> bool:
        """Whether this parameter applies given the ``values`` set so far: it has no condition, or the knob its
        condition names is among them and meets it (``prefetch_factor`` once ``num_workers > 0``).

        >>> p = Param("prefetch_factor", "int", (2, 4), when=("num_workers", ">", 0))
        >>> p.holds({"num_workers": 2}), p.holds({"num_workers": 0}), p.holds({})
        (True, False, False)
        """
        if self.when is None:
            return True
        ref, op, value = self.when
        return ref in values and bool(_OPS[op](values[ref], value))
