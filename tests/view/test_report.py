"""`autotune report` and `show --explain` on a tiny study made through the real CLI: a self-contained page with
every plot, the top configs with their bottleneck, and the profiler's trace and top operators."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli.report import is_loopback
from autotune.view.report import PLOTS

from tests.helpers import run_cli


def _self_contained(html: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I), "a script is loaded from somewhere"
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?https?:", html, re.I), "a stylesheet is loaded from the web"
    assert not re.search(r"<script[^>]*src=[\"']?https?://", html, re.I)
    assert html.count("window.PlotlyConfig") == 1 and len(html) > 3_000_000  # plotly.js inline, once


def test_report_is_self_contained_with_every_plot_and_the_profile(report_study):
    html = report_study.report.read_text()
    _self_contained(html)
    for div, title in PLOTS.items():
        assert f'id="{div}"' in html, div
        assert f"<h2>{title}</h2>" in html and html.count(title) >= 2, title  # heading + the figure's own title
    assert "baseline (PyTorch defaults)" in html and "memory cap" in html  # the baseline line, the cap line
    assert "id='top-configs'" in html and 'id="bottlenecks"' in html
    assert re.search(r"(input|compute|memory)-bound|compile-dominated", html)
    assert report_study.study_name in html
    # the profiler run of the recommended config: top operators in the page, a Chrome trace beside the DB
    assert "id='top-ops'" in html and "aten::" in html
    prof = report_study.db.parent / report_study.study_name / "profile"
    trace = json.loads((prof / "trace.pt.trace.json").read_text())
    assert trace["traceEvents"] and any(e.get("name", "").startswith("autotune.step") for e in trace["traceEvents"])
    ops = json.loads((prof / "top_ops.json").read_text())
    assert ops["steps"] == 5 and ops["ops"] and ops["ops"][0]["self_cpu_ms"] >= ops["ops"][-1]["self_cpu_ms"]
    assert "Chrome trace" in report_study.report_stderr and str(report_study.report) in report_study.report_stderr


def test_report_without_profile_to_the_default_path(report_study, tmp_path):
    # a copy of the database, so the default output (beside the DB) lands in this test's folder
    db = tmp_path / "copy.db"
    db.write_bytes(report_study.db.read_bytes())
    out = run_cli("report", "--storage", f"sqlite:///{db}", "--study-name", report_study.study_name, "--no-profile")
    assert out.returncode == 0, out.stderr[-2000:]
    page = tmp_path / report_study.study_name / "report.html"
    assert out.stdout.strip() == str(page) and page.exists()
    html = page.read_text()
    _self_contained(html)
    assert "id='top-ops'" not in html and "Not profiled (--no-profile)" in html
    assert all(f'id="{div}"' in html for div in PLOTS)
    assert not (tmp_path / report_study.study_name / "profile").exists()
    assert page.stat().st_mode & 0o044  # readable by others, as any file the user writes (not 0600)


def test_show_explain_one_line_per_trial(report_study):
    out = run_cli("show", "--storage", report_study.storage, "--explain")
    assert out.returncode == 0, out.stderr
    text = out.stdout.split("what limited each trial", 1)[1]
    lines = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert len(lines) == report_study.n_trials
    assert all(re.match(r"#\d+\s+(input-bound|compute-bound|memory-bound|compile-dominated|failed|unmeasured): ",
                        ln) for ln in lines), lines


@pytest.mark.parametrize("args, needle", [
    (["report", "--storage", "sqlite:///{tmp}/none.db"], "no study database"),
    (["report", "--storage", "{storage}", "--study-name", "nope"], "no study 'nope'"),
    (["report", "--storage", "{storage}", "-o", "/proc/nope/r.html", "--no-profile"], "cannot write the report"),
    (["dashboard", "--storage", "sqlite:///{tmp}/none.db"], "no study database"),
    (["dashboard", "--storage", "{storage}", "--port", "70000"], "not a port number"),
])
def test_user_mistakes_are_one_line_exit_2(report_study, tmp_path, args, needle):
    args = [a.format(tmp=tmp_path, storage=report_study.storage) for a in args]
    out = run_cli(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-1500:]
    assert lines[-1].startswith(f"autotune {args[0]}: error: ") and needle in lines[-1], lines


def test_loopback_detection():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.5", "example.org"))


# --- issue 17: a named objective, importances only from enough trials, one-knob effects, the memory axis ------

def _speed(config) -> float:
    """The fake runner's throughput: channels_last is worth exactly 1.6x, a worker 1.3x, the batch a little."""
    return 100.0 * (1.6 if config.channels_last else 1.0) * (1.3 if config.num_workers else 1.0) * (
        1 + config.batch_size / 64)


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    """A 9-trial study (12 configs: batch 8/16/32 x channels_last x 0/1 workers) run by the real Tuner with a
    fake runner, as a new user's short run leaves it."""
    from autotune.config import TrialResult

    from tests.helpers import make_tuner, tiny_space

    def fake(workload, config, measure, **kw):
        v = _speed(config)
        return TrialResult(status="ok", samples_per_s=(v, v, v), wall_s=1.0, batch_size=config.batch_size,
                           peak_host_mb=300.0 + 10 * config.batch_size + 80 * config.num_workers)

    space = tiny_space(parameters={"batch_size": {"type": "int", "choices": [8, 16, 32]},
                                   "channels_last": {"type": "bool"},
                                   "num_workers": {"type": "int", "choices": [0, 1]}},
                       baseline={"batch_size": 8, "channels_last": False, "num_workers": 0})
    logs: list[str] = []
    tmp = tmp_path_factory.mktemp("nine")
    tuner = make_tuner(tmp, space=space, runner=fake, finalists=1, parity_steps=0, log=logs.append)
    tuner.run(trials=9)
    return tuner, logs


def _measured(study):
    return [t for t in study.trials if t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs
            and t.state.name == "COMPLETE"]


def _plot_json(html: str, div: str) -> str:
    """The plotly call that draws ``div``, up to the next section."""
    start = html.index(f'id="{div}"')
    return html[start:html.index("<h2>", start)]


def _traces(html: str, div: str) -> list[dict]:
    """The data (traces) of the plotly figure drawn in ``div``."""
    start = re.search(r'Plotly\.newPlot\(\s*"' + div + r'",\s*', html).end()
    return json.JSONDecoder().raw_decode(html, start)[0]


def test_the_objective_is_named_on_new_and_resumed_studies(nine, tmp_path):
    import optuna

    from autotune.search.tuner import Tuner

    tuner, _ = nine
    stored = optuna.load_study(study_name=tuner.study_name, storage=tuner.storage_url)
    assert stored.metric_names == ["samples/s"]
    assert "value_samples/s" in stored.trials_dataframe().columns  # what `optuna` and pandas exports say
    # a study made before the objective was named gets its name when a run resumes it
    url = f"sqlite:///{tmp_path}/old.db"
    optuna.create_study(storage=url, study_name="old", direction="maximize")
    assert optuna.load_study(study_name="old", storage=url).metric_names is None
    Tuner(tuner.workload, space=tuner.space, measure=tuner.measure, storage=url, study_name="old",
          hardware=tuner.hardware, progress=False, runner=tuner.runner).study()
    assert optuna.load_study(study_name="old", storage=url).metric_names == ["samples/s"]


def test_few_trials_show_no_importances_but_the_one_knob_effects(nine):
    from autotune.view.report import build_report

    tuner, _ = nine
    study = tuner.study()
    measured = _measured(study)
    assert len(measured) == 9 and len(study.trials) >= 9
    html = build_report(study, storage_url=tuner.storage_url)
    note = html[html.index("id='importances-note'"):]
    assert note.startswith("id='importances-note'><strong>Too few trials for parameter importances:</strong> "
                           "9 measured trials, and importances need at least 30 here")
    assert "not shown: 9 measured trials" in _plot_json(html, "plot-importances")
    assert _traces(html, "plot-importances") == []
    # every measured pair that differs in channels_last only, in the channels_last row, at exactly 1.6x
    by_n = {t.number: t.params for t in measured}
    pairs = [(a, b) for a in by_n for b in by_n if not by_n[a]["channels_last"] and by_n[b]["channels_last"]
             and {k: v for k, v in by_n[a].items() if k != "channels_last"}
             == {k: v for k, v in by_n[b].items() if k != "channels_last"}]
    assert pairs, by_n  # trial 0 (the baseline) and trial 1 (the likely winner) at least
    table = html[html.index("<table id='one-knob'>"):]
    table = table[:table.index("</table>")]
    row = next(r for r in table.split("<tr>") if r.startswith("<td><code>channels_last</code>"))
    assert "<td>False</td><td>True</td><td class=num>1.60x</td>" in row, row
    assert f"<td class=num>{len(pairs)}</td>" in row
    shown = (f"trials {pairs[0][0]} and {pairs[0][1]}" if len(pairs) == 1
             else "trials " + ", ".join(f"{a} \u2192 {b}" for a, b in sorted(pairs, key=min)))
    assert f"<td>{shown}</td>" in row, (row, pairs)
    assert "<td><code>num_workers</code></td><td>0</td><td>1</td><td class=num>1.30x</td>" in table or \
        not any(p["num_workers"] for p in by_n.values())


def test_with_enough_trials_the_importances_are_drawn_without_the_note(nine, tmp_path):
    import optuna
    from optuna.trial import create_trial

    from autotune.view.report import build_report

    tuner, _ = nine
    db = tmp_path / "more.db"
    db.write_bytes((Path(tuner.storage_url[len("sqlite:///"):])).read_bytes())
    study = optuna.load_study(study_name=tuner.study_name, storage=f"sqlite:///{db}")
    first = _measured(study)
    for i in range(30 - len(first)):  # the same configs measured again, 2% apart
        t = first[i % len(first)]
        v = t.value * (1 + 0.02 * ((i % 3) - 1))
        study.add_trial(create_trial(params=t.params, distributions=t.distributions, value=v,
                                     user_attrs={**t.user_attrs, "median_samples_per_s": v, "baseline": False,
                                                 "likely_winner": False}, constraints=t.constraints))
    html = build_report(study)
    assert "id='importances-note'" not in html and "Too few trials" not in html
    assert "not shown" not in _plot_json(html, "plot-importances")
    (bars,) = _traces(html, "plot-importances")
    assert bars["type"] == "bar" and sorted(bars["y"]) == ["batch_size", "channels_last", "num_workers"]
    assert "<table id='one-knob'>" in html  # the like-for-like table stays


def test_the_dashboard_note_says_the_importances_are_noise_and_lists_the_effects(nine, monkeypatch):
    import sys

    import optuna_dashboard

    from autotune.search.record.effects import save_dashboard_note

    tuner, logs = nine
    note = optuna_dashboard.get_note(tuner.study())  # written by the run
    assert "**Parameter importances are noise here**: 9 measured trials, and they need at least 30" in note
    assert "- channels_last False -> True, same everything else: 1.60x (" in note
    assert not any("dashboard note" in m for m in logs)
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # not installed: one line, the run goes on
    said: list[str] = []
    assert save_dashboard_note(tuner.study(), said.append) is False
    assert said == ["dashboard note skipped: optuna-dashboard (with save_note) is not installed"]


def test_the_memory_axis_fits_the_data_and_a_far_cap_is_marked_at_the_edge():
    from autotune.view.report import _memory

    rows = [{"trial": i, "peak_host_mb": 300.0 + 50 * i, "samples_per_s": 100.0 + i, "status": "ok",
             "feasible": True, "config": f"c{i}"} for i in range(5)]  # 300 .. 500 MiB
    far = _memory(rows, 20480.0, 0, 4)
    lo, hi = far.layout.xaxis.range
    assert 250 <= lo < 300 and 500 < hi < 600  # the data, padded; not 0 .. 22000
    assert not far.layout.shapes  # no cap line off in the distance
    (mark,) = [a for a in far.layout.annotations if "memory cap" in a.text]
    assert mark.text == "memory cap 20480 MiB \u2192" and mark.x == 1 and mark.xref == "paper"
    assert mark.xanchor == "right"
    near = _memory(rows, 560.0, 0, 4)  # a cap just beyond the data: drawn where it is
    lo, hi = near.layout.xaxis.range
    assert hi > 560 and lo < 300 and len(near.layout.shapes) == 1 and near.layout.shapes[0].x0 == 560
    assert any(a.text == "memory cap 560 MiB" for a in near.layout.annotations)
