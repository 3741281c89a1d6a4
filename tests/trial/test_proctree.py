"""No process a trial starts outlives it: a descendant that calls ``setsid`` (leaving the process group that the
runner kills) and loses its parent (a double fork) is still found and killed, on the fork-server path and the
cold one, when the trial ends by itself and when it dies abruptly. Real children, a real ``os.setsid``."""

from __future__ import annotations

import os

import psutil
import pytest

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial.forkserver import ForkServers
from autotune.trial.runner import run_trial

SPEC = MeasureSpec(windows=1, window_s=0.1, settle_windows=0, timeout_s=120)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


_SLOW = pytest.mark.slow  # 5-7 s each on a loaded 2-core machine: the forked, self-ending case runs by default


@pytest.mark.parametrize("path,name,status", [
    ("forked", "setsid_grandchild", "ok"),
    pytest.param("cold", "setsid_grandchild", "ok", marks=_SLOW),
    pytest.param("forked", "setsid_grandchild_then_abort", "crashed", marks=_SLOW),
    pytest.param("cold", "setsid_grandchild_then_abort", "crashed", marks=_SLOW),
])
def test_a_setsid_grandchild_does_not_outlive_its_trial(path, name, status, tmp_path, monkeypatch):
    pidfile = tmp_path / "daemon.pid"
    monkeypatch.setenv("AUTOTUNE_TEST_PIDFILE", str(pidfile))
    try:
        with ForkServers(enabled=path == "forked") as servers:
            result = run_trial(Workload(model=f"tests.workloads_fixtures:{name}", image_size=16),
                               TrialConfig(batch_size=8), SPEC, servers=servers)
        assert result.status == status, result.reason
        pid = int(pidfile.read_text())
        try:
            assert os.getsid(pid) == pid, "the fixture's grandchild did not leave the trial's session"
        except ProcessLookupError:
            pass  # already gone: killed with the trial
        assert _wait_gone(pid), f"pid {pid} (setsid, orphaned) outlived its trial: {psutil.Process(pid).cmdline()}"
    finally:
        if pidfile.exists() and not _gone(int(pidfile.read_text())):  # a failure leaves no sleeper behind
            os.kill(int(pidfile.read_text()), 9)


def test_a_loader_worker_whose_trial_is_already_gone_goes_at_once():
    """``proctree.loader_workers_die_with_me``: a worker that starts after its trial died (it is then neither the
    trial's child nor its grandchild) SIGKILLs itself before the workload's own ``worker_init_fn``; one under its
    trial goes on to it. Real processes: the init function is made in one and called in its child."""
    import signal
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from autotune.machine.proctree import loader_workers_die_with_me\n"
            "init = loader_workers_die_with_me(lambda i: print('then', i, flush=True))\n"
            "if sys.argv[1] == 'gone':  # as if made by a process that is not an ancestor (pid 1)\n"
            "    import functools; init = functools.partial(init.func, 1, *init.args[1:])\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    init(3)\n"
            "    os._exit(0)\n"
            "print('rc', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)\n")
    out = {case: subprocess.run([sys.executable, "-c", code, case], capture_output=True, text=True, timeout=60)
           for case in ("gone", "here")}
    assert out["here"].stdout.split("\n")[:2] == ["then 3", "rc 0"], out["here"]
    assert out["gone"].stdout.strip() == f"rc {-signal.SIGKILL}", out["gone"]
