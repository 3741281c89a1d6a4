"""The check child of a ``module:callable`` workload. Run as ``python -m autotune.workloads.check_child WORKLOAD_JSON``
by ``workloads.check``.

It imports the user's module, resolves the callable and checks that it can be called as a workload, in a process
of its own: the parent then never runs the user's import, and can end one that hangs. It prints one JSON line on
its stdout, ``{"ok": true}`` or ``{"error": "<one line>"}``; whatever the module prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    answer = os.fdopen(os.dup(1), "w")  # not inherited: a process the import starts cannot hold the answer open
    os.dup2(2, 1)  # the module's prints must not be taken for the answer
    from autotune.config import Workload
    from autotune.errors import WorkloadError
    from autotune.workloads.build import check_signature, resolve

    workload = Workload.from_dict(json.loads(argv[1]))
    try:
        check_signature(resolve(workload.model), workload)
        msg: dict = {"ok": True}
    except WorkloadError as exc:
        msg = {"error": str(exc)}
    answer.write(json.dumps(msg) + "\n")
    answer.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads the import started (a thread pool, a watcher) must not hold the exit
    return 0  # unreachable; keeps type checkers calm


if __name__ == "__main__":
    sys.exit(main(sys.argv))
