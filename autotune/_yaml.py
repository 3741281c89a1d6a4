"""Reading a YAML file a person gave: every way it can be wrong is one line that names the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: Path, error: type[Exception], *, label: str, not_text: str) -> Any:
    """The document in ``path``; an unreadable file, a binary one or bad YAML raises ``error`` with one line:
    ``label`` names what could not be read ("cannot read {label}: ..."), ``not_text`` says what to give instead,
    and a YAML error carries its line number."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {label}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file; {not_text}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise error(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
