"""A self-contained HTML report of a study: plots, the top configs, what limited each trial, the profile.

One file, openable offline: plotly.js is embedded once, inline, and every chart is a plotly figure (Optuna's
``optuna.visualization`` where it has the plot, ``plotly.graph_objects`` otherwise). Sections:

* optimisation history, with the baseline's throughput as a line;
* throughput vs peak memory, the axis fitted to the trials, with the memory cap drawn (named at the right
  edge when it is far beyond them);
* parameter importances (Optuna's fANOVA), only from enough measured trials (``effects.importances_trusted``),
  and beside them what one knob did: measured pairs of trials that differ in that knob only (``effects``);
* step-time breakdown (waiting for data vs computing) of the baseline and the recommendation;
* the top configs with their bottleneck (``autotune.search.record.diagnose``), and one line per trial;
* the top operators of the recommendation's profiler run (``autotune.trial.profile``), when there is one.

>>> html = build_report(study, storage_url="sqlite:///trials/autotune.db")   # doctest: +SKIP
>>> write_report("trials/report.html", html)                                 # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import html as _html
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune._redact import redact
from autotune.config import finite_or_none
from autotune.view.ceilings_plot import ceilings_summary, with_ceilings
from autotune.search.record import trials as keys
from autotune.search.record.diagnose import diagnose, explain_study, levers_allowed, measured_values
from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["build_report", "write_report", "recommended", "PLOTS", "TOP_CONFIGS"]

TOP_CONFIGS = 10
# div id -> title: the plots every report has (a plot without data says so inside its frame)
PLOTS = {
    "plot-history": "Optimisation history",
    "plot-memory": "Throughput vs peak memory",
    "plot-importances": "Parameter importances",
    "plot-breakdown": "Step time: data wait vs compute",
}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.5em} h3{font-size:1em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0} td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top} th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
code,pre{background:#f6f6f6;padding:.1em .3em} .muted{color:#777} .label{font-weight:600}
dl.summary{display:grid;grid-template-columns:max-content auto;gap:.2em 1em} dl.summary dt{color:#555}
"""


def _e(x: Any) -> str:
    return _html.escape("" if x is None else str(x))


def recommended(study: Study):
    """The study's recommendation (stored by the finalists), else the best feasible trial (provisional),
    else None."""
    from autotune.search.choose.finalists import provisional
    from autotune.recommendation import stored_recommendation

    rec = stored_recommendation(study)
    if rec is not None:
        return rec
    try:
        return provisional(study)
    except AutotuneError:
        return None


# --- figures ------------------------------------------------------------------------------------------

def _titled(fig, title: str):
    fig.update_layout(title={"text": title}, margin={"l": 60, "r": 30, "t": 60, "b": 50}, height=420,
                      template="plotly_white")
    return fig


def _empty(title: str, why: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _titled(fig, title)


def _history(study: Study, baseline: float | None):
    import optuna

    title = PLOTS["plot-history"]
    if not any(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False)):
        return _empty(title, "no finished trial yet")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = optuna.visualization.plot_optimization_history(study, target_name="samples/s")
    if baseline:
        fig.add_hline(y=baseline, line_dash="dash", line_color="#888",
                      annotation_text=f"baseline (PyTorch defaults) {baseline:.1f}/s",
                      annotation_position="bottom right")
    fig.update_yaxes(title_text="median samples/s")
    return _titled(fig, title)


def _memory(rows: list[dict], cap: float | None, base_n: int | None, rec_n: int | None):
    import plotly.graph_objects as go

    title = PLOTS["plot-memory"]
    pts = [r for r in rows if r["peak_host_mb"] is not None]
    if not pts:
        return _empty(title, "no trial with a measured peak memory yet")
    fig = go.Figure()
    groups = (("feasible", "#1f77b4", "circle", lambda r: r["status"] == "ok" and r["feasible"] is not False),
              ("out of memory / over the cap", "#d62728", "x", lambda r: r["status"] in ("oom", "over_memory")),
              ("pruned / other", "#aaaaaa", "circle-open", lambda r: True))
    left = list(pts)
    for name, color, symbol, pred in groups:
        sel = [r for r in left if pred(r)]
        left = [r for r in left if not pred(r)]
        if not sel:
            continue
        fig.add_trace(go.Scatter(
            x=[r["peak_host_mb"] for r in sel], y=[r["samples_per_s"] or 0 for r in sel], mode="markers", name=name,
            marker={"color": color, "symbol": symbol, "size": 9},
            text=[f"#{r['trial']} {r['config']}<br>{r['status']}" for r in sel], hoverinfo="text+x+y"))
    for n, name, symbol in ((base_n, "baseline", "diamond"), (rec_n, "recommended", "star")):
        r = next((r for r in pts if r["trial"] == n), None)
        if r is not None:
            fig.add_trace(go.Scatter(x=[r["peak_host_mb"]], y=[r["samples_per_s"] or 0], mode="markers", name=name,
                                     marker={"symbol": symbol, "size": 16, "line": {"width": 1, "color": "#000"},
                                             "color": "rgba(0,0,0,0)"}, text=[f"#{r['trial']} {r['config']}"]))
    # the x axis spans the data, padded; a cap up to a quarter beyond the highest peak is drawn as a line (how
    # close the trials came to it), a farther one (the default cap is a share of the machine's memory) would
    # squeeze every trial into a corner: it is named at the right edge, with an arrow pointing off the chart
    lo, hi = min(r["peak_host_mb"] for r in pts), max(r["peak_host_mb"] for r in pts)
    near = bool(cap) and cap <= 1.25 * hi  # type: ignore[operator]
    if near:
        lo, hi = min(lo, cap), max(hi, cap)  # type: ignore[type-var]
    pad = max(0.08 * (hi - lo), 0.03 * hi, 1.0)
    fig.update_xaxes(range=[max(0.0, lo - pad), hi + pad])
    if cap and near:
        fig.add_vline(x=cap, line_dash="dash", line_color="#d62728",
                      annotation_text=f"memory cap {cap:.0f} MiB", annotation_position="top left")
    elif cap:
        fig.add_annotation(text=f"memory cap {cap:.0f} MiB \u2192", x=1, y=1, xref="paper", yref="paper",
                           xanchor="right", yanchor="bottom", showarrow=False, font={"color": "#d62728"},
                           name="memory-cap-off-chart")
    fig.update_xaxes(title_text="peak host memory, MiB (trial + DataLoader workers, PSS)")
    fig.update_yaxes(title_text="median samples/s")
    return _titled(fig, title)


def _importances(study: Study, trusted: tuple[bool, int, int]):
    import optuna

    title = PLOTS["plot-importances"]
    enough, n, needed = trusted
    if not enough:  # said beside the frame too (_importances_note); a short frame, the table below matters more
        fig = _empty(title, f"not shown: {n} measured trials, importances need at least {needed}")
        fig.update_layout(height=160)
        return fig
    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(done) < 2 or len({tuple(sorted(t.params.items())) for t in done}) < 2:
        return _empty(title, "needs at least two finished trials with different parameters")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig = optuna.visualization.plot_param_importances(study, target_name="samples/s")
    except (ValueError, RuntimeError) as exc:  # e.g. every trial has the same value: nothing to attribute
        return _empty(title, f"not computable yet: {str(exc).splitlines()[0][:120]}")
    return _titled(fig, title)


def _breakdown(bars: list[tuple[str, dict]]):
    import plotly.graph_objects as go

    title = PLOTS["plot-breakdown"]
    bars = [(name, ua) for name, ua in bars
            if finite_or_none(ua.get(keys.DATA_WAIT_S)) is not None
            and finite_or_none(ua.get(keys.COMPUTE_S)) is not None]
    if not bars:
        return _empty(title, "no measured step times for the baseline or the recommendation")
    names = [name for name, _ in bars]
    wait = [1000 * finite_or_none(ua[keys.DATA_WAIT_S]) for _, ua in bars]  # type: ignore[operator]
    comp = [1000 * finite_or_none(ua[keys.COMPUTE_S]) for _, ua in bars]  # type: ignore[operator]
    fig = go.Figure([
        go.Bar(y=names, x=wait, name="waiting for data", orientation="h", marker_color="#ff7f0e",
               text=[f"{w:.1f} ms ({100 * w / (w + c):.0f}%)" if w + c else "" for w, c in zip(wait, comp)]),
        go.Bar(y=names, x=comp, name="computing", orientation="h", marker_color="#1f77b4",
               text=[f"{c:.1f} ms" for c in comp]),
    ])
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="ms per step (median over the measured windows)")
    return _titled(fig, title)


# --- tables -------------------------------------------------------------------------------------------

def _importances_note(trusted: tuple[bool, int, int]) -> str:
    from autotune.search.record.effects import MIN_TRIALS, TRIALS_PER_KNOB

    enough, n, needed = trusted
    if enough:
        return ""
    return (f"<p id='importances-note'><strong>Too few trials for parameter importances:</strong> {n} measured "
            f"trials, and importances need at least {needed} here ({TRIALS_PER_KNOB} per knob varied, "
            f"{MIN_TRIALS} at least). Below that they rank noise, so they are not shown; optuna-dashboard "
            "draws them anyway. What one knob did, from trials that differ in it only, is in the table below.</p>")


def _effects_table(study: Study) -> str:
    from autotune.search.record.effects import by_change, one_knob_effects

    changes = by_change(one_knob_effects(study.get_trials(deepcopy=False)))
    intro = ("<h3>One knob changed, same everything else</h3><p class='muted'>Measured trials whose configs "
             "differ in one knob only; the ratio is the median samples/s with the <em>to</em> value over that "
             "with the <em>from</em> value, everything else the same (several pairs of one change: their "
             "median; trials from \u2192 to).</p>")
    if not changes:
        return intro + "<p class='muted' id='one-knob'>No two measured trials differ in one knob only yet.</p>"
    head = "<tr><th>knob</th><th>from</th><th>to</th><th>ratio</th><th>pairs</th><th>trials</th></tr>"
    body = "".join(
        f"<tr><td><code>{_e(c.knob)}</code></td><td>{_e(c.from_value)}</td><td>{_e(c.to_value)}</td>"
        f"<td class=num>{c.median:.2f}x</td><td class=num>{len(c.effects)}</td><td>{_e(c.trials)}</td></tr>"
        for c in changes)
    return f"{intro}<table id='one-knob'>{head}{body}</table>"


def _rows(study: Study) -> list[dict]:
    from autotune.search.record.trials import trial_rows

    return trial_rows(study)


def _top_table(study: Study, rows: list[dict], base: float | None, cap: float | None) -> str:
    by_n = {t.number: t for t in study.get_trials(deepcopy=False)}
    top = [r for r in rows if r["status"] == "ok" and r["feasible"] is not False and r["samples_per_s"]
           and by_n[r["trial"]].user_attrs.get(keys.DUPLICATE_OF) is None]
    top.sort(key=lambda r: -r["samples_per_s"])
    if not top:
        return "<p class='muted'>No measured feasible trial yet.</p>"
    head = ("<tr><th>#</th><th>trial</th><th>config</th><th>samples/s</th><th>IQR</th><th>speedup</th>"
            "<th>peak MiB</th><th>data wait</th><th>bottleneck</th></tr>")
    body = []
    measured = measured_values(study)
    for i, r in enumerate(top[:TOP_CONFIGS], 1):
        t = by_n[r["trial"]]
        d = diagnose(t.user_attrs, memory_cap_mb=cap, trials=list(by_n.values()),
                     allowed=levers_allowed(study, t.user_attrs.get(keys.CONFIG) or {}, t.value, measured))
        iqr, wait, peak = (finite_or_none(r["rel_iqr"]), finite_or_none(r["data_wait_share"]),
                           finite_or_none(r["peak_host_mb"]))
        cells = [str(i), f"{r['trial']}" + (" (baseline)" if r["baseline"] else ""),
                 f"<code>{_e(r['config'])}</code>", f"{r['samples_per_s']:.1f}",
                 "" if iqr is None else f"{100 * iqr:.1f}%",
                 f"x{r['samples_per_s'] / base:.2f}" if base else "",
                 "" if peak is None else f"{peak:.0f}",
                 "" if wait is None else f"{100 * wait:.0f}%",
                 f"<span class=label>{_e(d.label)}</span>: {_e(d.explanation)}"]
        body.append("<tr>" + "".join(f"<td class=num>{c}</td>" if k not in (2, 8) else f"<td>{c}</td>"
                                     for k, c in enumerate(cells)) + "</tr>")
    return f"<table id='top-configs'>{head}{''.join(body)}</table>"


def _ops_table(profile) -> str:
    if not profile.top_ops:
        return ""
    device = "self_device_ms" in profile.top_ops[0]
    head = ("<tr><th>operator</th><th>calls</th><th>self CPU ms</th><th>self CPU share</th><th>CPU total ms</th>"
            + ("<th>self device ms</th>" if device else "") + "</tr>")
    body = "".join(
        f"<tr><td><code>{_e(o['name'])}</code></td><td class=num>{o['calls']}</td>"
        f"<td class=num>{o['self_cpu_ms']:.2f}</td><td class=num>{100 * o.get('self_cpu_share', 0):.1f}%</td>"
        f"<td class=num>{o['cpu_total_ms']:.2f}</td>"
        + (f"<td class=num>{o['self_device_ms']:.2f}</td>" if device else "") + "</tr>"
        for o in profile.top_ops[:15])
    return f"<table id='top-ops'>{head}{body}</table>"


def _profile_section(profile, profile_note: str, report_dir: Path | None) -> str:
    if profile is None:
        return f"<p class='muted'>{_e(profile_note or 'Not profiled.')}</p>"
    if not profile.ok:
        return f"<p>The profiler run of <code>{_e(profile.config.short())}</code> failed: {_e(profile.reason)}</p>"
    trace = profile.trace_path
    shown = os.path.relpath(trace, report_dir) if report_dir is not None else str(trace)
    return (f"<p>{profile.steps} steady-state steps of <code>{_e(profile.config.short())}</code> under "
            f"<code>torch.profiler</code>, after warm-up. Chrome trace: <a href='{_e(shown)}'><code>{_e(trace)}</code>"
            "</a>: open it in Perfetto (ui.perfetto.dev, <em>Open trace file</em>) or chrome://tracing, or run "
            f"<code>tensorboard --logdir {_e(trace.parent)}</code> with the torch-tb-profiler plugin.</p>"
            f"<p>Top operators by {'self device' if profile.sort_by == 'self_device_ms' else 'self CPU'} time "
            f"(summed over the {profile.steps} steps):</p>" + _ops_table(profile))


# --- the page -----------------------------------------------------------------------------------------

def _rate(rec: Any) -> str:
    """The recommendation's samples/s as the claim states them; none where its confirmation measured none."""
    if rec.median_samples_per_s is None:
        return "no samples/s stated"
    return f"{rec.median_samples_per_s:.1f} samples/s median"


def _field_summary(study: Study) -> list[tuple[str, str]]:
    """The user's runs measured under the recommendation (``autotune.field``), one line each."""
    from autotune.field.judge import stored_line
    from autotune.search.record.field_runs import stored

    return [("your run", stored_line(r)) for r in stored(study)]


def build_report(study: Study, *, storage_url: str = "", profile=None, profile_note: str = "",
                 report_path: str | Path | None = None) -> str:
    """The report of an Optuna study made by autotune, as one HTML string (no network needed to open it).

    ``profile`` is an ``autotune.trial.profile.Profile`` of the recommended config (or None, with ``profile_note``
    saying why there is none). ``report_path`` only makes the trace link relative to where the page is written.
    """
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from autotune.search.record.effects import importances_trusted
    from autotune.search.record.trials import baseline_trial, baseline_value

    ua = study.user_attrs
    cap = finite_or_none(ua.get(keys.STUDY_MEMORY_CAP))
    rows = _rows(study)
    base_t = baseline_trial(study)
    base = baseline_value(study)
    rec = recommended(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    rec_t = trials.get(rec.trial_number) if rec is not None and rec.trial_number is not None else None

    bars = []
    if base_t is not None:
        bars.append((f"baseline #{base_t.number}", base_t.user_attrs))
    if rec_t is not None:
        bars.append((f"recommended #{rec_t.number}", rec_t.user_attrs))
    trusted = importances_trusted(study)
    figures = {
        "plot-history": _history(study, base),
        "plot-memory": _memory(rows, cap, base_t.number if base_t else None, rec_t.number if rec_t else None),
        "plot-importances": _importances(study, trusted),
        "plot-breakdown": _breakdown(bars),
    }
    from autotune.view.latency_plot import with_latency

    titles = with_latency(figures, dict(PLOTS), rows, ua, rec_t.number if rec_t else None)  # inference only
    titles = with_ceilings(figures, titles, rows, study, rec_t.number if rec_t else None)  # where measured
    before = {"plot-importances": _importances_note(trusted)}
    after = {"plot-importances": _effects_table(study)}
    plots = "".join(
        f"<h2>{_e(titles[div])}</h2>" + before.get(div, "")
        + pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div,
                      config={"displaylogo": False, "responsive": True}) + after.get(div, "")
        for div, fig in figures.items())

    states: dict[str, int] = {}
    for t in trials.values():
        states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    workload = ua.get(keys.STUDY_WORKLOAD) or {}
    summary = [("study", study.study_name), ("storage", redact(storage_url) or "-"),
               ("workload", " / ".join(str(workload.get(k)) for k in ("model", "task", "image_size", "device")
                                       if workload.get(k) is not None) or "-"),
               ("hardware", ua.get(keys.STUDY_HARDWARE) or "-"),
               ("trials", f"{len(trials)} ({', '.join(f'{v} {k}' for k, v in sorted(states.items()))})"),
               ("memory cap", f"{cap:.0f} MiB per trial" if cap else "-"),
               ("baseline",
                f"{base:.1f} samples/s (trial {base_t.number}, PyTorch defaults)" if base else "not measured")]
    if rec is not None:
        summary.append(("recommended", f"{rec.config.short()}: {_rate(rec)}, vs the baseline {rec.claim()}"
                        + (" (provisional: finalists not re-measured)" if rec.provisional else "")))
    else:
        summary.append(("recommended", "none yet (no measured feasible trial)"))
    summary += ceilings_summary(rec) + _field_summary(study)
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in summary)

    limits = []
    for name, t in (("baseline", base_t), ("recommended", rec_t)):
        if t is not None:
            d = diagnose(t.user_attrs, memory_cap_mb=cap, trials=list(trials.values()),
                         allowed=levers_allowed(study, t.user_attrs.get(keys.CONFIG) or {}, t.value))
            limits.append(f"<li>{name} (trial {t.number}): <span class=label>{_e(d.label)}</span>: "
                          f"{_e(d.explanation)}</li>")
    per_trial = "\n".join(_e(line) for line in explain_study(study))
    report_dir = Path(report_path).resolve().parent if report_path is not None else None
    generated = _dt.datetime.now().astimezone().replace(microsecond=0).isoformat()

    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="generator" content="autotune">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>autotune report: {_e(study.study_name)}</title>
<style>{_CSS}</style>
<script type="text/javascript">window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>autotune report: <code>{_e(study.study_name)}</code></h1>
<dl class="summary">{dl}</dl>
<h2>What limited the trials</h2>
<ul id="bottlenecks">{''.join(limits) or '<li class=muted>no measured baseline or recommendation yet</li>'}</ul>
<p class="muted">Thresholds: see docs/diagnosis.md in the autotune repository.</p>
<details><summary>every trial, one line each</summary><pre id="per-trial">{per_trial}</pre></details>
{plots}
<h2>Top configs</h2>
{_top_table(study, rows, base, cap)}
<h2>Profile of the recommended config</h2>
<div id="profile">{_profile_section(profile, profile_note, report_dir)}</div>
<p class="muted">Generated {_e(generated)} by autotune from the study's stored trials.</p>
</body></html>
"""


def write_report(path: str | Path, html: str) -> Path:
    """Write the page atomically (a reader never sees half of it); returns the path."""
    from autotune._atomic import atomic_write

    p = Path(path)
    try:
        atomic_write(p, html)  # with the user's umask, like any file they write: a report is meant to be shared
    except OSError as exc:
        raise AutotuneError(f"cannot write the report to {p}: {exc.strerror or exc}; pick another -o FILE") from None
    return p
