"""The kill benchmark at a small count (slow: ~10 min on 2 cores): `autotune run` SIGKILLed ten times, at least
once in each phase a run's record names (``run_phase.PHASES``: a phase added later is killed here too) as far as
a run meets it, each time resumed with the same command; every check of ``benchmarks/kill_anywhere.py`` holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune.search.record.run_phase import PHASES
from tests.helpers import REPO_ROOT


@pytest.mark.slow
def test_ten_sigkills_at_every_phase_lose_nothing_and_leave_nothing_running(tmp_path):
    out = tmp_path / "kills.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "kill_anywhere.py"), "--kills", "10",
                           "--seed", "1", "--workdir", str(tmp_path / "runs"), "--out", str(out)],
                          cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["complete"] and len(data["kills"]) == 10
    assert data["phases"] == list(PHASES)
    tried = {k["target"] for k in data["kills"]} | {p for p, n in data["not_reached"].items() if n}
    assert set(PHASES) <= tried, tried  # each phase was killed in, or the run left it before the moment drawn
    killed = {k["row"] for k in data["kills"]}
    assert len(killed & set(PHASES)) >= 6, killed  # most were: the run meets them all in order
    for k in data["kills"]:
        assert not k["alive_after_1s"] and k["lost"] == 0 and not k["changed"] and k["locks_free"], k
        assert k["integrity"] == "ok" and k["resume"]["ok"], k
    assert all(c["rc"] == 0 and c["yaml_equal"] for c in data["cycles"])
