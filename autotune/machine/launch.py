"""How autotune starts a Python child (a trial, a fork server, the numerics check, ``collect_env``): as
``python -m MODULE`` would, but without the working folder on the child's ``sys.path``.

``python -m`` and ``python -c`` put the current folder first on the path, so a ``json.py`` or ``random.py``
there (a shared folder, or a project that has a ``queue.py``) would be imported by every trial in place of the
standard library's: code run by whoever wrote the file, or a broken tuner. Python 3.11's ``-P`` leaves the folder
out, but 3.10 (the oldest autotune supports) has no such flag, and a trial's interpreter need not be this one;
so the child starts with ``-c`` and a bootstrap that drops the entry ``-c`` added before anything is imported,
then runs the module as ``-m`` would (``sys.argv[0]`` its file, ``__name__`` ``"__main__"``). ``SAFE_PATH_ENV``
in the child's environment does the same for whatever the child starts (``PYTHONSAFEPATH``, 3.11 and later).

The bootstrap's next lines make the child die with the process that starts it, before it imports anything (torch
takes seconds): Linux's parent-death signal (SIGKILL), then a check that its parent is still the one that started
it (one killed meanwhile left it orphaned, and the signal would never come). Elsewhere only the check runs
(``autotune.machine.proctree`` says why and what else keeps a tree together).

The user's workload module is still found in the working folder: ``workloads`` appends that folder to the end
of ``sys.path`` (after the standard library and site-packages) and imports the module the user named from it.

>>> import sys
>>> python_command(sys.executable, "autotune.trial.worker", "5")[3:]
['autotune.trial.worker', '5']
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["python_command", "with_package_path", "die_with_parent_prelude", "SAFE_PATH_PRELUDE", "SAFE_PATH_ENV"]

# first lines of any `python -c` program autotune runs: the path entry `-c` added is the working folder
SAFE_PATH_PRELUDE = "import sys\nif sys.path and sys.path[0] == '':\n    del sys.path[0]\n"
_RUN_MODULE = "import runpy\nrunpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n"
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}
# PR_SET_PDEATHSIG (1) with SIGKILL (9), through libc; then the parent check. Fires when the starting *thread* ends.
_DIE_WITH_PARENT = """import os
if sys.platform.startswith('linux'):
    try:
        import ctypes
        ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, 9, 0, 0, 0)
    except (OSError, AttributeError):
        pass
if os.getppid() != {parent}:
    os.kill(os.getpid(), 9)
"""


def die_with_parent_prelude(parent: int | None = None) -> str:
    """Lines of a ``python -c`` program (after ``SAFE_PATH_PRELUDE``) that make it die with ``parent`` (default:
    this process, the one about to start it)."""
    return _DIE_WITH_PARENT.format(parent=os.getpid() if parent is None else int(parent))


def with_package_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the folder that holds the ``autotune`` package first on ``PYTHONPATH``, so a child imports
    this autotune even when the parent runs from a source checkout that is not installed. The folder above the
    package, never the package itself: that would make ``config``, ``search``, ``trial``... top-level names that
    shadow the user's modules of those names."""
    root = str(Path(__file__).resolve().parents[2])  # autotune/machine/launch.py -> the folder holding autotune/
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def python_command(python: str, module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args...`` with nothing from the working folder importable, as a child
    that dies with this process (the thread that starts it must outlive it)."""
    return [python, "-c", SAFE_PATH_PRELUDE + die_with_parent_prelude() + _RUN_MODULE, module, *args]
