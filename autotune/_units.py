"""Parse the human units a user types: memory sizes, durations and shares."""

from __future__ import annotations

import math
import re

from autotune.errors import ConfigError

_MEM_UNITS = {
    "": 1, "b": 1,
    # a bare letter is binary, as docker and `free -g` read it; "GB" is decimal, "GiB" binary
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_DUR_UNITS = {"": 1, "ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}  # ms: latency bounds


def parse_memory_mb(text: str | int | float, *, what: str = "memory size") -> float:
    """Parse ``"12GiB"``, ``"800MB"``, ``"1.5g"`` or a bare number of MiB into MiB.

    >>> parse_memory_mb("2GiB")
    2048.0
    >>> parse_memory_mb(512)
    512.0
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value_mb = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _MEM_UNITS:
            raise ConfigError(
                f"{what} {text!r} does not parse: write a number with a unit, e.g. 12GiB, 800MiB or 2GB"
            )
        scale = _MEM_UNITS[unit]
        value_mb = float(m.group(1)) * scale / 1024**2 if unit else float(m.group(1))
    if not math.isfinite(value_mb) or value_mb <= 0:
        raise ConfigError(f"{what} must be positive (and finite), got {text!r}")
    return value_mb


def parse_duration_s(text: str | int | float, *, what: str = "duration", require_unit: bool = False) -> float:
    """Parse ``"8h"``, ``"20m"``, ``"90s"``, ``"1h30m"`` or a bare number of seconds (refused with
    ``require_unit``: on a command line ``--timeout 5`` is as likely meant as hours as seconds).

    >>> parse_duration_s("1h30m")
    5400.0
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        s = str(text).strip().lower()
        number = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
        if re.fullmatch(number, s):  # a bare number is seconds
            if require_unit:
                raise ConfigError(f"{what} {text!r} has no unit: write {s}s, {s}m or {s}h")
            parts = [(s, "")]
        elif re.fullmatch(rf"(?:{number}\s*[a-z]+\s*)+", s):  # every number has a unit: 1h30m
            parts = re.findall(rf"({number})\s*([a-z]+)", s)
        else:
            raise ConfigError(f"{what} {text!r} does not parse: write e.g. 90s, 20m, 8h or 1h30m")
        seconds = 0.0
        for number, unit in parts:
            if unit not in _DUR_UNITS:
                raise ConfigError(f"{what} {text!r} has unknown unit {unit!r}: use ms, s, m, h or d")
            seconds += float(number) * _DUR_UNITS[unit]
    if seconds <= 0:
        raise ConfigError(f"{what} must be positive, got {text!r}")
    return seconds


def parse_share(text: str | int | float, *, what: str = "share", upto: float = 1.0) -> float:
    """Parse ``"10%"`` or ``0.1`` as a share from 0 up to (not including) ``upto``.

    >>> parse_share("15%")
    0.15
    """
    s = str(text).strip()
    try:
        value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise ConfigError(f"{what} {text!r} does not parse: write e.g. 10% or 0.1") from None
    if not (math.isfinite(value) and 0 <= value < upto):
        raise ConfigError(f"{what} {text!r} must be from 0% to under {100 * upto:g}%")
    return value


def format_mb(mb: float | None) -> str:
    if mb is None:
        return "-"
    return f"{mb / 1024:.2f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"
