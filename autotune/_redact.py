"""Storage URLs as people see them: with the password replaced (``postgresql://user:***@host/db``).

The real URL is used only to connect; whatever is printed, raised, logged or stored (the recommendation, and so
its YAML, the HTML report and MLflow) goes through ``redact``, which masks the password of every URL in a text,
in the user-info part and in a ``password=`` query parameter.

>>> redact("cannot open storage 'postgresql://tuner:s3cret@db.lan:5432/runs?sslmode=require'")
"cannot open storage 'postgresql://tuner:***@db.lan:5432/runs?sslmode=require'"
>>> redact("mysql://u@h/db?password=s3cret&charset=utf8")
'mysql://u@h/db?password=***&charset=utf8'
"""

from __future__ import annotations

import re

__all__ = ["redact"]

# scheme://user:password@ as SQLAlchemy reads it (a password holds no '@'); the user may be empty
# the password runs to the LAST @ before the host (a password may hold @; the path's / ends the netloc)
_USERINFO = re.compile(r"(\b[A-Za-z][\w+.-]*://[^:/@\s'\"]*):[^\s'\"/]*@")
_QUERY = re.compile(r"(?i)([?&](?:password|passwd|pwd)=)[^&\s'\"#]*")


def redact(text: str) -> str:
    """``text`` with the password of each URL in it replaced by ``***``."""
    if "://" not in text:
        return text
    return _QUERY.sub(r"\1***", _USERINFO.sub(r"\1:***@", text))
