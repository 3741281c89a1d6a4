"""Fork servers: a trial forked from a server that imported torch once is as isolated as a cold one.

Each test that forks starts its own server (one torch import, a few seconds) and closes it; the figures it
prints (timings) are for a reader, never asserted: the machine is shared.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial.forkserver import ENV_SWITCH, ForkServerError, ForkServers, default_servers, forkable
from autotune.trial.runner import run_trial

SPEC = MeasureSpec(windows=2, window_s=0.2, warmup_min_steps=2, warmup_min_s=0.0, warmup_max_s=5, timeout_s=120)


def wl(name: str) -> Workload:
    return Workload(model=f"tests.workloads_fixtures:{name}", image_size=32, num_classes=10)


def _group_alive(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.info["pid"]) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.info["pid"])
        except (OSError, psutil.Error):
            pass
    return out


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


class _Seen:
    """Per trial: the child's pid, its parent and process group while it ran."""

    def __init__(self) -> None:
        self.trials: list[dict] = []

    def __call__(self, ev: dict) -> None:
        if ev["event"] == "started":
            pid = ev["pid"]
            self.trials.append({"pid": pid, "ppid": psutil.Process(pid).ppid(), "pgid": os.getpgid(pid)})


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29)
def test_a_crash_an_oom_and_a_hang_leave_the_next_trial_untouched():
    seen = _Seen()
    with ForkServers() as servers:
        before = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers, on_event=seen)
        assert before.ok, (before.reason, before.traceback)
        [server] = servers.pids()
        threads = _threads(server)
        server_rss = psutil.Process(server).memory_info().rss
        crashed = run_trial(wl("abort"), TrialConfig(batch_size=4), SPEC, servers=servers, on_event=seen)
        oom = run_trial(wl("alloc_oom"), TrialConfig(batch_size=4), SPEC, servers=servers, on_event=seen)
        hung = run_trial(wl("hang"), TrialConfig(batch_size=4), SPEC.replace(timeout_s=3), servers=servers,
                         on_event=seen)
        after = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers, on_event=seen)
        assert servers.pids() == [server]  # one server served them all: every trial was forked
        assert _threads(server) == threads  # it started no thread pool for its children
        server_rss_after = psutil.Process(server).memory_info().rss
    assert crashed.status == "crashed" and crashed.signal == "SIGABRT", (crashed.status, crashed.reason)
    assert oom.status == "oom" and "DefaultCPUAllocator" in oom.reason, (oom.status, oom.reason)
    assert oom.traceback and "_alloc" in oom.traceback
    assert hung.status == "timeout" and "3 s" in hung.reason, (hung.status, hung.reason)
    assert after.ok, (after.reason, after.traceback)
    for t in seen.trials:  # each trial was a child of the server, leading its own process group
        assert t["ppid"] == server and t["pgid"] == t["pid"], t
        assert _group_alive(t["pgid"]) == []  # and nothing of it is left to take memory or cores
    assert len({t["pid"] for t in seen.trials}) == 5
    # memory: the server did not grow, the next trial's peak is the first's (timings: printed, not asserted)
    assert abs(server_rss_after - server_rss) < 16 * 2**20, (server_rss, server_rss_after)
    assert abs(after.peak_host_mb - before.peak_host_mb) < 0.05 * before.peak_host_mb, (before.peak_host_mb,
                                                                                        after.peak_host_mb)
    print(f"before: {before.median_samples_per_s:.0f}/s {before.peak_host_mb:.0f} MiB; "
          f"after: {after.median_samples_per_s:.0f}/s {after.peak_host_mb:.0f} MiB")



@pytest.mark.slow  # a fork server's torch import and three threads' trials (~9 s)
def test_trials_from_threads_that_come_and_go_share_one_server():
    """Ray runs each trial in a thread of its own, and so may any caller: trials from sequential threads, each of
    which ends after its trial, are all forked by one server, which outlives the threads. When the pool started a
    server from the calling thread, its parent-death signal took it down with that thread: every trial paid a
    server's start (torch's import), and a thread that got a recycled id could find the dying server "alive"."""
    seen, log = _Seen(), []
    with ForkServers() as servers:
        def trial() -> None:
            r = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers, on_event=seen)
            log.append({"thread": threading.get_ident(), "servers": servers.pids(), "status": r.status,
                        "reason": r.reason, "startup_s": r.startup_s})

        for _ in range(3):
            t = threading.Thread(target=trial)
            t.start()
            t.join()
        time.sleep(0.5)  # a server signalled at its thread's end would be gone by now
        for entry, child in zip(log, seen.trials):
            print({**entry, "trial_parent": child["ppid"]})
        [server] = servers.pids()
        trial()  # and this thread's trial too
    assert [e["status"] for e in log] == ["ok"] * 4, log
    assert [t["ppid"] for t in seen.trials] == [server] * 4, (server, seen.trials)
    assert all(e["servers"] == [server] for e in log), log



@pytest.mark.slow  # two fork servers' torch imports (~30 s on 2 cores); the default suite shares one server apart
def test_concurrent_trials_in_one_environment_are_each_forked_by_a_server_of_their_own():
    """Two threads launch at once with the same environment: the first's server is taken from the moment it is
    chosen (before its child exists), so the second gets a server of its own, never a second child of a busy one."""
    seen, statuses = _Seen(), []
    go = threading.Barrier(2)
    with ForkServers() as servers:
        def trial() -> None:
            go.wait()
            statuses.append(run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers,
                                      on_event=seen).status)

        threads = [threading.Thread(target=trial) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pids = sorted(servers.pids())
    assert statuses == ["ok", "ok"]
    assert len(pids) == 2 and sorted(t["ppid"] for t in seen.trials) == pids, (pids, seen.trials)


@pytest.mark.slow
def test_a_trial_killed_over_the_cap_leaves_the_next_trial_untouched():
    with ForkServers() as servers:
        before = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers)
        [server] = servers.pids()
        hog = run_trial(wl("memory_hog"), TrialConfig(batch_size=4), SPEC.replace(memory_cap_mb=1536.0),
                        servers=servers)
        after = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers)
        assert servers.pids() == [server]
    assert hog.status == "over_memory" and hog.peak_host_mb > 1536, (hog.status, hog.reason)
    assert before.ok and after.ok
    assert abs(after.peak_host_mb - before.peak_host_mb) < 0.05 * before.peak_host_mb


@pytest.mark.slow
def test_a_forked_trial_is_charged_the_memory_it_would_hold_cold():
    """A forked child shares torch's imported heap with the server and maps only the library pages it touches:
    without the server's part (memwatch.MemoryWatch._lent) its peak read ~0.6x the cold one's on the tiny model."""
    with ForkServers() as servers:
        forked = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers)
    cold = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=ForkServers(enabled=False))
    assert forked.ok and cold.ok
    print(f"peak forked {forked.peak_host_mb:.0f} MiB, cold {cold.peak_host_mb:.0f} MiB; start-up forked "
          f"{forked.startup_s:.2f} s, cold {cold.startup_s:.2f} s")
    assert 0.85 * cold.peak_host_mb < forked.peak_host_mb < 1.3 * cold.peak_host_mb


@pytest.mark.slow
def test_the_server_and_its_trial_die_with_the_parent(tmp_path):
    """SIGKILL the process that runs a (hanging) forked trial: the server and the trial go by themselves."""
    pids = tmp_path / "pids"
    code = textwrap.dedent(f"""
        import json, sys
        from autotune.config import MeasureSpec, TrialConfig, Workload
        from autotune.trial.forkserver import ForkServers
        from autotune.trial.runner import run_trial
        servers = ForkServers()
        def on_event(ev):
            if ev["event"] == "built":
                open({str(pids)!r}, "w").write(json.dumps([servers.pids()[0], ev.get("pid") or 0]))
        run_trial(Workload(model="tests.workloads_fixtures:hang", image_size=32, num_classes=10),
                  TrialConfig(batch_size=4), MeasureSpec(warmup_min_s=0.0, timeout_s=300), servers=servers,
                  on_event=on_event)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=str(tmp_path))
    deadline = time.monotonic() + 120
    while not pids.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert pids.exists(), "the trial did not start"
    time.sleep(0.2)
    server, _ = json.loads(pids.read_text())
    trial = [c.pid for c in psutil.Process(server).children()]
    assert trial, "no trial child under the server"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in [server, *trial]], timeout=10)
    assert not alive, f"outlived their parent: {alive}"


def test_a_server_that_dies_mid_trial_is_said_to_have_died_not_taken_for_the_oom_killer():
    """The trial's fork server is killed (SIGTERM) while the trial hangs in its step: the trial dies with it
    (its parent-death signal), and the reason says so, with the server's fate; it used to read "killed by
    SIGKILL (possibly the kernel's OOM killer)"."""
    with ForkServers() as servers:
        killed = []

        def on_event(ev: dict) -> None:
            if ev["event"] == "built" and not killed:
                killed.extend(servers.pids())
                os.kill(killed[0], signal.SIGTERM)

        t0 = time.monotonic()
        r = run_trial(wl("hang"), TrialConfig(batch_size=8), SPEC.replace(timeout_s=60), servers=servers,
                      on_event=on_event)
    assert killed and time.monotonic() - t0 < 50  # not the time limit: the death is seen at once
    assert r.status == "crashed", r.reason
    assert r.reason == (f"the fork server (pid {killed[0]}) that started this trial died (killed by SIGTERM), "
                        "and the trial with it"), r.reason
    assert "OOM" not in r.reason


def test_off_by_the_environment_switch(monkeypatch):
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert default_servers().enabled is False
    monkeypatch.setenv(ENV_SWITCH, "1")
    assert default_servers().enabled is True


def test_trials_of_this_interpreter_are_forked_cuda_ones_too():
    assert forkable("cpu", sys.executable)
    assert forkable("cuda", sys.executable) and forkable("cuda:1", sys.executable)
    assert not forkable("cpu", "/tmp/fake-child.py")  # the runner tests' scripted children run cold


def test_the_servers_imports_make_no_cuda_context():
    """What makes forking a CUDA trial safe: after everything the server imports, torch has no CUDA context (so none
    crosses the fork; each child makes its own). Checked in a fresh interpreter, as the server starts."""
    import subprocess

    code = ("from autotune.trial import worker_forkserver as s; s._preload(); import torch; "
            "print(torch.cuda.is_initialized(), s.cuda_initialised())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


class _BrokenStart:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, python, env):
        self.calls += 1
        raise ForkServerError("no server here")


def test_a_server_that_does_not_start_sends_its_environment_down_the_cold_path():
    start = _BrokenStart()
    servers = ForkServers(start=start)
    for _ in range(3):
        assert servers.launch({"A": "1"}, sys.executable, {}, 1, 2) is None
    assert start.calls == 1  # not retried for every trial
    assert ForkServers(enabled=False, start=start).launch({}, sys.executable, {}, 1, 2) is None
    assert start.calls == 1


@pytest.mark.slow  # a server's torch import and two trials
def test_a_forked_child_works_in_the_folder_its_launcher_is_in_now(tmp_path, monkeypatch):
    """As a cold child would: a Ray actor moves to each trial's folder, while its fork server stays where it was
    started (the first trial's)."""
    folders = [tmp_path / "a", tmp_path / "b"]
    seen: list[str] = []

    def on_event(ev: dict) -> None:
        if ev["event"] == "started":
            seen.append(psutil.Process(ev["pid"]).cwd())

    with ForkServers() as servers:
        for folder in folders:
            folder.mkdir()
            monkeypatch.chdir(folder)
            r = run_trial(wl("tiny"), TrialConfig(batch_size=8), SPEC, servers=servers, on_event=on_event)
            assert r.ok, r.reason
        assert len(servers.pids()) == 1  # one server forked both
    assert seen == [str(f) for f in folders]
