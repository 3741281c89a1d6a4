"""Smoke test of benchmarks/spread.py at tiny settings (two fresh child processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, TINY


def test_spread_script_runs_and_writes_json(tmp_path):
    out = tmp_path / "spread.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "spread.py"), "--model", TINY, "--image-size", "32",
         "--batch-size", "8", "--runs", "2", "--windows", "2", "--window-seconds", "0.2", "--timeout", "120",
         "--out", str(out)],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("machine: ") and "fingerprint" in lines[0]
    assert sum(1 for ln in lines if ln.startswith("run ") and "median" in ln) == 2
    assert any("spread" in ln and "(max-min)/median" in ln for ln in lines)
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 2
    assert all(r["status"] == "ok" and len(r["samples_per_s"]) == 2 for r in data["runs"])
    assert len(data["medians"]) == 2 and all(m > 0 for m in data["medians"])
    assert data["spread"]["runs_ok"] == 2 and data["spread"]["range_rel"] >= 0
    assert data["workload"]["model"] == TINY and data["config"]["batch_size"] == 8
    assert data["machine"]["fingerprint"]


def test_spread_script_refuses_a_bad_model(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "spread.py"), "--model", "resnet81", "--runs", "1",
         "--out", str(tmp_path / "x.json")],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "resnet81" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_quality_script_runs_on_a_tiny_space(tmp_path):
    out = tmp_path / "quality.json"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "quality.py"), "--quick", "--model", TINY, "--image-size",
         "16", "--rounds", "1", "--out", str(out)],
        cwd=str(REPO_ROOT), env=dict(os.environ), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "recommendation / grid best" in proc.stdout and "share of the grid's time used" in proc.stdout
    data = json.loads(out.read_text())
    assert len(data["grid"]) == 8 and all(g["status"] == "ok" for g in data["grid"])
    assert data["medians"]["recommendation"] > 0 and data["flops_per_sample"] > 0
    assert out.with_suffix(".md").read_text().startswith("Machine:")
