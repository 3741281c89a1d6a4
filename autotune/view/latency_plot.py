"""The report's throughput-vs-p99-latency plot, for an inference study: each measured trial's median samples/s
against its steps' p99 latency (``autotune.trial.latency``), the latency bound drawn as a line where the run had
one (``--latency-p99``): the configs left of it are the ones the search could recommend."""

from __future__ import annotations

__all__ = ["TITLE", "DIV", "latency_figure", "with_latency"]

DIV = "plot-latency"
TITLE = "Throughput vs p99 latency (inference)"


def latency_figure(rows: list[dict], bound_ms: float | None, rec_n: int | None):
    """The plotly figure, or None when no trial measured a latency (a training study)."""
    import plotly.graph_objects as go

    pts = [r for r in rows if r.get("latency_p99_ms") is not None and r["status"] == "ok"]
    if not pts:
        return None
    fig = go.Figure()
    for name, color, pred in (("meets the bound / no bound", "#1f77b4", lambda r: r["feasible"] is not False),
                              ("infeasible (latency or memory)", "#d62728", lambda r: r["feasible"] is False)):
        sel = [r for r in pts if pred(r)]
        if sel:
            fig.add_trace(go.Scatter(
                x=[r["latency_p99_ms"] for r in sel], y=[r["samples_per_s"] or 0 for r in sel], mode="markers",
                name=name, marker={"color": color, "size": 9},
                text=[f"#{r['trial']} {r['config']}" for r in sel], hoverinfo="text+x+y"))
    rec = next((r for r in pts if r["trial"] == rec_n), None)
    if rec is not None:
        fig.add_trace(go.Scatter(x=[rec["latency_p99_ms"]], y=[rec["samples_per_s"] or 0], mode="markers",
                                 name="recommended", text=[f"#{rec['trial']} {rec['config']}"],
                                 marker={"symbol": "star", "size": 16, "color": "rgba(0,0,0,0)",
                                         "line": {"width": 1, "color": "#000"}}))
    if bound_ms:
        fig.add_vline(x=bound_ms, line_dash="dash", line_color="#d62728",
                      annotation_text=f"p99 bound {bound_ms:g} ms", annotation_position="top right")
    fig.update_xaxes(title_text="p99 latency of one step, ms (each step synchronised)", rangemode="tozero")
    fig.update_yaxes(title_text="median samples/s")
    fig.update_layout(title={"text": TITLE}, margin={"l": 60, "r": 30, "t": 60, "b": 50}, height=420,
                      template="plotly_white")
    return fig


def with_latency(figures: dict, titles: dict, rows: list[dict], study_attrs: dict, rec_n: int | None) -> dict:
    """Add the plot to the report's ``figures`` (div id -> figure) for an inference study; returns ``titles``
    (div id -> title) with its title where it was added."""
    fig = latency_figure(rows, (study_attrs.get("measure") or {}).get("latency_p99_ms"), rec_n)
    if fig is not None:
        figures[DIV], titles[DIV] = fig, TITLE
    return titles
