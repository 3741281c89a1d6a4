"""A trial's log has a size cap: its head and its tail are kept, with one line saying how much was left out.
Real children write through the real pipe; one real trial prints 8 MiB."""

from __future__ import annotations

import subprocess
import sys

from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.trial.runner import run_trial
from autotune.trial.triallog import LOG_HEAD_BYTES, LOG_TAIL_BYTES, CappedLog

PRINT = "import sys\nfor i in range({n}): sys.stdout.write(f'line {{i:05d}} ' + 'y' * 20 + '\\n')\n"


def _child_prints(log: CappedLog, n: int) -> None:
    subprocess.run([sys.executable, "-c", PRINT.format(n=n)], stdout=log, stderr=subprocess.STDOUT, check=True)


def test_a_log_keeps_its_head_and_tail_and_says_what_it_left_out(tmp_path):
    path = tmp_path / "t.log"
    path.write_bytes(b"an earlier run's output\n")  # kept whole: the cap counts from the end of what was there
    with CappedLog(path, head=1000, tail=2000) as log:
        _child_prints(log, 5000)  # 5000 lines of 32 bytes: 160,000 bytes
    log.join()
    text = path.read_text()
    assert text.startswith("an earlier run's output\nline 00000 ")
    assert text.endswith("line 04999 " + "y" * 20 + "\n")
    head, rest = text.split("\n[autotune: ")
    note, tail = rest.split("\n", 1)
    assert len(head) == len("an earlier run's output\n") + 1000
    assert note.startswith(f"{log.dropped} bytes of this trial's output left out here")
    lines = tail.splitlines()
    assert all(len(ln) == 31 for ln in lines) and len(tail) <= 4000  # whole lines, at most twice the tail
    assert 1000 + log.dropped + len(tail) == 160_000  # every byte is kept or counted as left out
    assert len(text.encode()) < 1000 + 2 * 2000 + 200 + 24


def test_a_log_under_the_cap_is_left_as_it_was_written(tmp_path):
    path = tmp_path / "t.log"
    with CappedLog(path, head=1000, tail=2000) as log:
        _child_prints(log, 50)
    log.join()
    assert path.read_text() == "".join(f"line {i:05d} " + "y" * 20 + "\n" for i in range(50))
    assert log.dropped == 0


def test_a_trial_that_prints_8_mib_leaves_a_log_within_the_cap(tmp_path):
    log = tmp_path / "trial.log"
    r = run_trial(Workload(model="tests.workloads_fixtures:chatty", image_size=16), TrialConfig(batch_size=8),
                  MeasureSpec(windows=1, window_s=0.1, settle_windows=0, timeout_s=120), log_path=log)
    assert r.ok, r.reason
    data = log.read_bytes()
    assert len(data) <= LOG_HEAD_BYTES + 2 * LOG_TAIL_BYTES + 300  # of 8.0 MiB printed
    assert b"chatty line 000000 " in data[:200] and b"chatty line 099999 " in data  # the head and the last line
    assert b" bytes of this trial's output left out here" in data
