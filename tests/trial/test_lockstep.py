"""A round by turns (``trial.lockstep``): real trial children, all alive, one window at a time, the others stopped."""

from __future__ import annotations

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
from autotune.errors import ConfigError
from autotune.trial.lockstep import run_round
from autotune.trial.runner import run_trial
from tests.helpers import TINY

# settle_windows 0: each window is sent as it ends, so the order the parent reads them in is the order they ran
SPEC = MeasureSpec(windows=3, window_s=0.3, settle_windows=0, timeout_s=120)
WL = Workload(model=TINY, image_size=32, num_classes=10)


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


@pytest.fixture(scope="module")
def round_by_turns():
    """Two configs (one with a DataLoader worker) by turns; each event as the parent read it, with the state of the
    other child's whole tree at that moment."""
    configs = [TrialConfig(batch_size=8, num_workers=1), TrialConfig(batch_size=16)]
    seen: list[tuple[int, str, dict]] = []
    pids: dict[int, int] = {}
    lock = threading.Lock()

    def run(i, gate):
        config = configs[i]

        def on_event(ev: dict) -> None:
            with lock:
                if ev["event"] == "started":
                    pids[i] = ev["pid"]
                other = pids.get(1 - i)
                tree = {}
                if ev["event"] == "window" and other is not None:
                    try:
                        procs = [psutil.Process(other), *psutil.Process(other).children(recursive=True)]
                    except psutil.NoSuchProcess:
                        procs = []
                    tree = {p.pid: _status(p.pid) for p in procs}
                seen.append((i, ev["event"], tree))

        return run_trial(WL, config, SPEC, gate=gate, on_event=on_event)

    t0 = time.monotonic()
    results = run_round(configs, run, turn_s=0.1)  # windows of 0.3 s: several turns each
    return configs, results, seen, time.monotonic() - t0


def test_each_config_of_a_round_by_turns_measures_all_its_windows_in_a_child_of_its_own(round_by_turns):
    configs, results, seen, _ = round_by_turns
    assert [r.status for r in results] == ["ok", "ok"]
    assert [len(r.samples_per_s) for r in results] == [3, 3]
    assert all(x > 0 for r in results for x in r.samples_per_s)
    assert results[0].batch_size == 8 and results[1].batch_size == 16
    for i in (0, 1):  # each was at its gate before it measured anything, and its windows took several turns
        mine = [e for j, e, _ in seen if j == i and e in ("turn", "window")]
        assert mine[0] == "turn" and mine.count("window") == 3 and mine.count("turn") > 3, mine


def test_the_children_of_a_round_take_turns(round_by_turns):
    _, _, seen, _ = round_by_turns
    # the second child started only once the first was at its gate
    first_turn = next(k for k, (i, e, _) in enumerate(seen) if i == 0 and e == "turn")
    second_start = next(k for k, (i, e, _) in enumerate(seen) if i == 1 and e == "started")
    assert first_turn < second_start
    # then, while both are alive, each turn ends with the other's: never two of one child's in a row
    done = {i: next(k for k, (j, e, _) in enumerate(seen) if j == i and e == "done") for i in (0, 1)}
    turns = [i for k, (i, e, _) in enumerate(seen) if e == "turn" and k > second_start and k < min(done.values())]
    assert len(turns) >= 4 and all(a != b for a, b in zip(turns, turns[1:])), turns


def test_while_one_child_measures_the_other_and_its_dataloader_workers_are_stopped(round_by_turns):
    _, _, seen, _ = round_by_turns
    # the second child's windows: the first child (one DataLoader worker) is stopped, workers and all
    trees = [tree for i, e, tree in seen if i == 1 and e == "window"]
    assert trees and all(tree for tree in trees[:2])
    for tree in trees[:2]:  # its last window may come after the first child ended
        assert set(tree.values()) == {psutil.STATUS_STOPPED}, tree
        assert len(tree) >= 2  # the child and its worker


def test_a_round_by_turns_keeps_each_childs_time_its_own(round_by_turns):
    """A child's wall is its own time, not the time it stood stopped while the other measured: the two walls
    together are the round's time at most (each would be about all of it, counted with its stops)."""
    _, results, _, took = round_by_turns
    assert all(r.wall_s is not None and r.wall_s > 0 for r in results)
    assert sum(r.wall_s for r in results) <= took * 1.05 + 0.5, ([r.wall_s for r in results], took)


def test_a_config_no_child_can_run_fails_the_round_after_the_others_are_measured():
    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=8, amp="fp16")]  # fp16 on the CPU: refused
    with pytest.raises(ConfigError, match="fp16"):
        run_round(configs, lambda i, g: run_trial(WL, configs[i], SPEC, gate=g))


def test_a_child_that_fails_at_its_turn_ends_the_round_for_itself_only():
    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=10_000)]  # larger than the tiny dataset
    results = run_round(configs, lambda i, g: run_trial(WL, configs[i], SPEC, gate=g))
    assert results[0].status == "ok" and len(results[0].samples_per_s) == 3
    assert results[1].status != "ok"


def test_a_child_killed_while_it_waits_for_its_turn_ends_alone_and_the_round_goes_on():
    """The OOM killer (or a kill over the cap) may take a child while it stands stopped: the round gives the other
    its turns and ends, nothing waits for the dead one."""
    configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=16)]
    pids: dict[int, int] = {}
    killed = threading.Event()

    def run(i, gate):
        def on_event(ev: dict) -> None:
            if ev["event"] == "started":
                pids[i] = ev["pid"]
            if i == 0 and ev["event"] == "window" and 1 in pids and not killed.is_set():
                killed.set()
                os.killpg(pids[1], signal.SIGKILL)  # child 1 is stopped at its gate now
        return run_trial(WL, configs[i], SPEC, gate=gate, on_event=on_event)

    out: list = []
    t = threading.Thread(target=lambda: out.append(run_round(configs, run, turn_s=0.1)), daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "the round waited for a child that was gone"
    first, second = out[0]
    assert killed.is_set() and first.status == "ok" and len(first.samples_per_s) == 3
    assert second.status == "crashed" and "SIGKILL" in second.reason, second


@pytest.mark.slow
def test_ctrl_c_while_a_round_starts_its_children_leaves_none_behind(tmp_path):
    """An interrupt in the round's own thread (the tuner's, at Ctrl-C) while its children start one by one: the
    KeyboardInterrupt comes through as itself and no child of the round is left, stopped or running."""
    script = tmp_path / "round.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, threading
        from autotune.config import MeasureSpec, TrialConfig, Workload
        from autotune.trial.lockstep import run_round
        from autotune.trial.runner import run_trial
        wl = Workload(model={TINY!r}, image_size=32, num_classes=10)
        spec = MeasureSpec(windows=3, window_s=2.0, timeout_s=120)
        configs = [TrialConfig(batch_size=8), TrialConfig(batch_size=16), TrialConfig(batch_size=32)]
        def run(i, gate):
            def on_event(ev):
                if ev["event"] == "started":
                    print("pid", ev["pid"], flush=True)
                    if i == 1:  # the second child is starting, the first stands at its gate
                        os.kill(os.getpid(), signal.SIGINT)
            return run_trial(wl, configs[i], spec, gate=gate, on_event=on_event)
        try:
            run_round(configs, run)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                          cwd=os.getcwd())
    pids = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("pid ")]
    assert proc.returncode == 3 and "interrupted" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert len(pids) >= 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_status(p) not in ("gone", psutil.STATUS_ZOMBIE) for p in pids):
        time.sleep(0.2)
    assert all(_status(p) in ("gone", psutil.STATUS_ZOMBIE) for p in pids), {p: _status(p) for p in pids}


class _FakeTurns:
    """``trial.windows.Turns`` without a parent: a turn is over after ``steps`` timed steps; a wait sleeps."""

    def __init__(self, steps: int, wait_s: float) -> None:
        self.steps, self.wait_s = steps, wait_s
        self.fresh, self.waited_s, self.turns, self.count = False, 0.0, 0, 0

    def over(self) -> bool:
        return self.count >= self.steps

    def wait(self) -> None:
        time.sleep(self.wait_s)
        self.waited_s += self.wait_s
        self.turns += 1
        self.fresh = True

    def begin(self) -> None:
        self.fresh, self.count = False, 0


def test_a_window_by_turns_counts_neither_the_waits_nor_the_first_step_of_each_turn():
    """Each step takes 10 ms, the first of a turn 40 ms (the caches held the others' data), and each wait 50 ms: the
    window's rate is the 10-ms steps' (charged the waits it would be a third of it, the slow first steps four fifths),
    every turn's first step is run but not counted, the first turn's too, and the wait is no data wait."""
    from autotune.machine.device import CPUDevice, HostStepTimer
    from autotune.trial.worker import _Stepper
    from autotune.workloads.contract import StepOut

    turns = _FakeTurns(steps=4, wait_s=0.05)

    def step(batch):
        time.sleep(0.04 if turns.fresh else 0.01)
        turns.count += 0 if turns.fresh else 1
        return StepOut(loss=None, output=None, samples=8)

    stepper = _Stepper([0] * 10_000, step, 1, HostStepTimer(CPUDevice()), "off")
    turns.wait()  # the first turn, as ``measure_windows`` waits for it before the first window
    w = stepper.window(MeasureSpec(windows=1, window_s=0.3, min_window_steps=1), turns)
    assert w["untimed_steps"] == turns.turns >= 7
    assert 8 / 0.012 < w["samples_per_s"] < 8 / 0.0095, w  # 10 ms steps (sleep overshoots a little)
    assert w["elapsed"] < 0.36 and w["data_wait_s"] < 0.002, w
    assert len(w["spans"]) == turns.turns and all(b > a for a, b in w["spans"])
