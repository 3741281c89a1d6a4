"""The check child of a ``module:callable`` workload (and of a built-in one where the parent has no torch). Run as
``python -m autotune.workloads.check_child WORKLOAD_JSON [--env-stamp]`` by ``workloads.check``.

It imports the user's module, resolves the callable, checks that it can be called as a workload, calls it and reads
its first batch (``workloads.probe``), in a process of its own: the parent then never runs the user's code, and can
end one that hangs. It prints one JSON line on its stdout, ``{"ok": true, "data": {...}}`` (what the first batch
holds, ``torch``: ``hardware.torch_facts()``, ``env``: ``get_env_info()``, collected in a thread meanwhile) or
``{"error": "<one line>"}``; whatever the module prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def main(argv: list[str]) -> int:
    from autotune.machine.proctree import supervised

    supervised()  # what the import or the stamp starts (pip, a compiler) goes with this child if the tuner dies
    answer = os.fdopen(os.dup(1), "w")  # not inherited: a process the import starts cannot hold the answer open
    os.dup2(2, 1)  # the module's prints must not be taken for the answer
    from autotune.config import Workload
    from autotune.errors import WorkloadError
    from autotune.machine.envstamp import TIMEOUT_S

    from autotune.workloads.build import import_timeout_s

    deadline = time.monotonic() + import_timeout_s() - 5.0  # the parent's limit, less the time to answer
    workload = Workload.from_dict(json.loads(argv[1]))
    stamp: dict = {}
    # the environment stamp alongside the check (its pip, gcc... run while the module imports), bounded on its own;
    # only when the parent has none yet
    side = threading.Thread(target=_stamp, args=(stamp,), daemon=True)
    if "--env-stamp" in argv[2:]:
        side.start()
    try:
        msg: dict = {"ok": True, "data": _probe(workload)}
    except WorkloadError as exc:
        msg = {"error": str(exc)}
    else:
        from autotune.machine.hardware import torch_facts

        msg["torch"] = torch_facts()  # the parent's hardware snapshot reads them: it need not import torch
        if side.is_alive() or stamp:
            side.join(max(0.0, min(TIMEOUT_S, deadline - time.monotonic())))
            msg["env"] = stamp.get("raw") or {"error": stamp.get("error")
                                              or f"collect_env took over {TIMEOUT_S:.0f} s"}
    answer.write(json.dumps(msg) + "\n")
    answer.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads the import started (a thread pool, a watcher) must not hold the exit
    return 0  # unreachable; keeps type checkers calm


def _probe(workload) -> dict:
    from autotune.workloads.build import build, check_signature, offered_to, probe_builtin, resolve
    from autotune.workloads.probe import probe

    if not workload.is_callable:
        return probe_builtin(workload)
    fn = resolve(workload.model)
    check_signature(fn, workload)
    return probe(build(workload), takes=offered_to(fn, workload))


def _stamp(box: dict) -> None:
    try:
        from autotune.machine.envstamp import raw_env_info

        box["raw"] = raw_env_info()
    except Exception as exc:  # torch too old to have collect_env, a tool that fails: said in the stamp
        box["error"] = f"collect_env failed: {type(exc).__name__}: {str(exc)[:200]}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
