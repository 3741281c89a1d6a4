"""The check child of a ``module:callable`` workload. Run as ``python -m autotune.workloads.check_child WORKLOAD_JSON``
by ``workloads.check``.

It imports the user's module, resolves the callable, checks that it can be called as a workload, calls it and reads
its first batch (``workloads.probe``), in a process of its own: the parent then never runs the user's code, and can
end one that hangs. It prints one JSON line on its stdout, ``{"ok": true, "data": {...}}`` (what the first batch
holds, and ``torch``: ``hardware.torch_facts()``) or ``{"error": "<one line>"}``; whatever the module prints
goes to stderr.
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
    from autotune.machine.hardware import torch_facts
    from autotune.workloads.build import build, check_signature, offered_to, resolve
    from autotune.workloads.probe import probe

    workload = Workload.from_dict(json.loads(argv[1]))
    try:
        fn = resolve(workload.model)
        check_signature(fn, workload)
        msg: dict = {"ok": True, "data": probe(build(workload), takes=offered_to(fn, workload)),
                     "torch": torch_facts()}  # the parent's hardware snapshot reads them: it need not import torch
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
