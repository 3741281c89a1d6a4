"""One error root for autotune.

``AutotuneError`` is what the library raises for anything a user can fix: the CLI prints its message on one line
and exits with code 2. Anything else escaping the library is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["AutotuneError", "ConfigError", "WorkloadError", "StorageError", "SpaceError", "MissingExtraError"]


class AutotuneError(Exception):
    """Root of every error autotune raises on purpose. The message is one line and says how to fix the call."""


class ConfigError(AutotuneError, ValueError):
    """A configuration value is out of range or contradicts another one."""


class WorkloadError(AutotuneError):
    """The model, data or user callable that defines the workload cannot be built."""


class SpaceError(AutotuneError, ValueError):
    """A search-space YAML file is malformed or contradicts itself."""


class StorageError(AutotuneError):
    """The study storage (SQLite file, database URL) cannot be used."""



class MissingExtraError(AutotuneError, ImportError):
    """An integration was used without the optional package it needs; the message names the install command."""
