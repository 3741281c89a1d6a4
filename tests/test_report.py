"""`autotune report` and `show --explain` on a tiny study made through the real CLI: a self-contained page with
every plot, the top configs with their bottleneck, and the profiler's trace and top operators."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli_report import is_loopback
from autotune.report import PLOTS

from . import report_fixtures
from .conftest import run_cli


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return report_fixtures.ensure_study(tmp_path_factory.getbasetemp() / "report-study")


def _self_contained(html: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I), "a script is loaded from somewhere"
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?https?:", html, re.I), "a stylesheet is loaded from the web"
    assert not re.search(r"<script[^>]*src=[\"']?https?://", html, re.I)
    assert html.count("window.PlotlyConfig") == 1 and len(html) > 3_000_000  # plotly.js inline, once


def test_report_is_self_contained_with_every_plot_and_the_profile(study):
    html = study.report.read_text()
    _self_contained(html)
    for div, title in PLOTS.items():
        assert f'id="{div}"' in html, div
        assert f"<h2>{title}</h2>" in html and html.count(title) >= 2, title  # heading + the figure's own title
    assert "baseline (PyTorch defaults)" in html and "memory cap" in html  # the baseline line, the cap line
    assert "id='top-configs'" in html and 'id="bottlenecks"' in html
    assert re.search(r"(input|compute|memory)-bound|compile-dominated", html)
    assert study.study_name in html
    # the profiler run of the recommended config: top operators in the page, a Chrome trace beside the DB
    assert "id='top-ops'" in html and "aten::" in html
    prof = study.db.parent / study.study_name / "profile"
    trace = json.loads((prof / "trace.pt.trace.json").read_text())
    assert trace["traceEvents"] and any(e.get("name", "").startswith("autotune.step") for e in trace["traceEvents"])
    ops = json.loads((prof / "top_ops.json").read_text())
    assert ops["steps"] == 5 and ops["ops"] and ops["ops"][0]["self_cpu_ms"] >= ops["ops"][-1]["self_cpu_ms"]
    assert "Chrome trace" in study.report_stderr and str(study.report) in study.report_stderr


def test_report_without_profile_to_the_default_path(study, tmp_path):
    # a copy of the database, so the default output (beside the DB) lands in this test's folder
    db = tmp_path / "copy.db"
    db.write_bytes(study.db.read_bytes())
    out = run_cli("report", "--storage", f"sqlite:///{db}", "--study-name", study.study_name, "--no-profile")
    assert out.returncode == 0, out.stderr[-2000:]
    page = tmp_path / study.study_name / "report.html"
    assert out.stdout.strip() == str(page) and page.exists()
    html = page.read_text()
    _self_contained(html)
    assert "id='top-ops'" not in html and "Not profiled (--no-profile)" in html
    assert all(f'id="{div}"' in html for div in PLOTS)
    assert not (tmp_path / study.study_name / "profile").exists()
    assert page.stat().st_mode & 0o044  # readable by others, as any file the user writes (not 0600)


def test_show_explain_one_line_per_trial(study):
    out = run_cli("show", "--storage", study.storage, "--explain")
    assert out.returncode == 0, out.stderr
    text = out.stdout.split("what limited each trial", 1)[1]
    lines = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert len(lines) == study.n_trials
    assert all(re.match(r"#\d+\s+(input-bound|compute-bound|memory-bound|compile-dominated|failed|unmeasured): ",
                        ln) for ln in lines), lines


@pytest.mark.parametrize("args, needle", [
    (["report", "--storage", "sqlite:///{tmp}/none.db"], "no study database"),
    (["report", "--storage", "{storage}", "--study-name", "nope"], "no study 'nope'"),
    (["report", "--storage", "{storage}", "-o", "/proc/nope/r.html", "--no-profile"], "cannot write the report"),
    (["dashboard", "--storage", "sqlite:///{tmp}/none.db"], "no study database"),
    (["dashboard", "--storage", "{storage}", "--port", "70000"], "not a port number"),
])
def test_user_mistakes_are_one_line_exit_2(study, tmp_path, args, needle):
    args = [a.format(tmp=tmp_path, storage=study.storage) for a in args]
    out = run_cli(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-1500:]
    assert lines[-1].startswith(f"autotune {args[0]}: error: ") and needle in lines[-1], lines


def test_loopback_detection():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org"))
