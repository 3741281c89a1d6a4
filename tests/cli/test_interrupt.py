"""Ctrl-C and SIGTERM for a long command (``autotune.cli.interrupt``), on real processes and real signals: the
first stops it cleanly with one line, a second ends it at once, and SIGINT works when it was started ignored."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

CHILD = """
    import signal, sys, time
    from autotune.cli.interrupt import EXIT_INTERRUPTED, interruptible
    if "--ignored" in sys.argv:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as nohup or a shell's & start it
    with interruptible(lambda: "stopped; run the same command again to resume") as stop:
        try:
            print("working", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print("cleaning up", flush=True)
            time.sleep(60 if "--slow-clean-up" in sys.argv else 0)
            stop.say()
            sys.exit(EXIT_INTERRUPTED)
"""


def _child(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "working"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_stops_cleanly_with_one_line(sig):
    proc = _child()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "cleaning up" in out
    assert err.strip().splitlines() == ["stopped; run the same command again to resume"]


def test_a_second_signal_during_the_clean_up_ends_at_once_after_the_line():
    proc = _child("--slow-clean-up")
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline().strip() == "cleaning up"  # in the (minute-long) clean-up now
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10, "the second signal did not end it at once"
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["stopped; run the same command again to resume"], err


def test_sigint_stops_a_command_started_with_it_ignored():
    proc = _child("--ignored")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "cleaning up" in out and "resume" in err
