"""The results as a person sees them: `autotune dashboard` and report.html loaded in a real headless Chromium.

The dashboard is served by the real command on a study made by a tiny run; the page is a JavaScript app, so
Chromium runs it (``--virtual-time-budget``) before the DOM is dumped. Skipped only when Chromium is missing
(.ci/run installs Debian's package).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from autotune.view.report import PLOTS

from tests.helpers import REPO_ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it: "
                                    "apt-get install -y --no-install-recommends chromium)")


class Dashboard:
    """`autotune dashboard --port 0` in a subprocess; its stderr is collected by a thread."""

    def __init__(self, storage: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", "dashboard", "--storage", storage, "--port", "0"],
            cwd=str(REPO_ROOT), env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_for_url()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line.rstrip("\n"))

    def _wait_for_url(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                m = re.search(r"at (http://127\.0\.0\.1:\d+)/dashboard", line)
                if m:
                    return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"the dashboard did not print its URL: {self.lines}")

    def get_json(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode


@pytest.fixture
def dashboard(report_study):
    d = Dashboard(report_study.storage)
    try:
        yield d
    finally:
        d.stop()


def _chromium(url: str, tmp_path: Path, *extra: str) -> str:
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"  # a fresh one each time
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", "--window-size=1400,1000",
           *extra, "--dump-dom", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    return out.stdout


def _text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def test_dashboard_serves_the_study_on_loopback_and_stops_on_ctrl_c(report_study, dashboard):
    assert dashboard.url.startswith("http://127.0.0.1:")
    summaries = dashboard.get_json("/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == [report_study.study_name]
    detail = dashboard.get_json(f"/api/studies/{summaries[0]['study_id']}?after=0")
    assert len(detail["trials"]) == report_study.n_trials
    attrs = {a["key"] for a in detail["trials"][0]["user_attrs"]}
    assert {"median_samples_per_s", "iqr_samples_per_s", "peak_host_mb", "data_wait_share", "status",
            "reason"} <= attrs  # the figures show in the dashboard as user attributes
    assert dashboard.stop(signal.SIGINT) == 0
    assert dashboard.lines[-1] == "autotune dashboard: stopped" and not any("Traceback" in ln for ln in dashboard.lines)


@pytest.mark.slow  # over 7 s of a 2-core VM (--durations, 2026-11-29)
@needs_chromium
def test_dashboard_page_in_chromium_shows_the_study_and_its_trials(report_study, dashboard, tmp_path):
    study_id = dashboard.get_json("/api/studies")["study_summaries"][0]["study_id"]
    home = _text(_chromium(dashboard.url + "/dashboard", tmp_path, "--virtual-time-budget=10000"))
    assert report_study.study_name in home, home[:2000]
    text = ""
    for _ in range(3):  # the app fetches the trials after it renders: give a slow machine another go
        text = _text(_chromium(f"{dashboard.url}/dashboard/studies/{study_id}/trials", tmp_path,
                               "--virtual-time-budget=10000"))
        if f"{report_study.n_trials} Trials" in text:
            break
    assert report_study.study_name in text and f"{report_study.n_trials} Trials" in text, text[:3000]
    assert "data_wait_share" in text and "peak_host_mb" in text


@needs_chromium
def test_report_renders_every_plot_in_chromium(report_study, tmp_path):
    dom = _chromium(report_study.report.resolve().as_uri(), tmp_path, "--virtual-time-budget=5000")
    for div in PLOTS:
        start = dom.index(f'id="{div}"')
        nxt = dom.find('id="plot-', start + 1)
        chunk = dom[start: nxt if nxt != -1 else len(dom)]
        assert 'class="main-svg"' in chunk and "<svg" in chunk, f"{div} did not render"
    assert "top-ops" in dom
