"""The `autotune` command: thin adapters over library calls (``main``), with the argument groups the commands
share (``args``) and the study and result commands (``study``, ``report``). A library error becomes one line and
exit code 2. May import everything; nothing in the package imports it.
"""

from autotune.cli.main import main

__all__ = ["main"]
