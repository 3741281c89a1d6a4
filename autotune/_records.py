"""What every frozen record shares: validation helpers and ``to_dict``/``from_dict``/``replace``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from autotune.errors import ConfigError

__all__ = ["Record", "check", "is_int", "is_num", "finite_or_none"]


def check(cond: bool, field_name: str, value: Any, allowed: str, fix: str = "") -> None:
    """Raise a ConfigError naming the field, the value, what is allowed and the fix, unless ``cond``."""
    if not cond:
        msg = f"{field_name}={value!r} is not allowed: {allowed}"
        raise ConfigError(msg + (f"; {fix}" if fix else ""))


def is_int(v: Any) -> bool:
    """A whole number, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """A real, finite number (not a bool, not a string that looks like one): safe to compare."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Record:
    """to_dict/from_dict shared by the records; from_dict refuses unknown keys so typos do not pass silently."""

    _kind: ClassVar[str] = "record"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"{cls._kind} must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"unknown {cls._kind} key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(names))}"
            )
        return cls(**data)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def finite_or_none(x: Any) -> float | None:
    """``x`` as a finite float, or None (missing, NaN, infinite, not a number)."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
