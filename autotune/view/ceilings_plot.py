"""The report's picture of the two ceilings (``search.record.ceilings``): the data path's rate alone at each worker
count measured (a line), the model's rate alone (a horizontal line, with the headroom the loader is sized to), and
every measured trial end to end at its worker count (points; the recommendation a star). A trial well under both
lines shares the cores between the two, or ran other knobs than the ceilings' configs.

Shown where the study measured its ceilings; the summary line says which binds."""

from __future__ import annotations

from typing import Any

__all__ = ["TITLE", "DIV", "ceilings_figure", "with_ceilings", "ceilings_summary"]

DIV = "plot-ceilings"
TITLE = "The two ceilings: the data path and the model, each alone, and the trials end to end"


def ceilings_figure(ceilings: Any, rows: list[dict], workers: dict[int, int], rec_n: int | None):
    """The plotly figure, or None without measured ceilings. ``workers``: each trial's num_workers."""
    import plotly.graph_objects as go

    from autotune.search.record.ceilings import HEADROOM

    if ceilings is None or (ceilings.model is None and not ceilings.data):
        return None
    fig = go.Figure()
    pts = ceilings.measured()
    if pts:
        fig.add_trace(go.Scatter(x=[p.workers for p in pts], y=[p.samples_per_s for p in pts], mode="lines+markers",
                                 name="data path alone", line={"color": "#ff7f0e"},
                                 text=[p.line() for p in pts], hoverinfo="text+x+y"))
    if ceilings.model_rate:
        fig.add_hline(y=ceilings.model_rate, line_color="#1f77b4",
                      annotation_text=f"model alone {ceilings.model_rate:.0f}/s", annotation_position="top left")
        fig.add_hline(y=ceilings.model_rate * HEADROOM, line_dash="dot", line_color="#1f77b4",
                      annotation_text=f"x{HEADROOM} headroom", annotation_position="bottom right")
    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"] and r["trial"] in workers]
    if ok:
        fig.add_trace(go.Scatter(x=[workers[r["trial"]] for r in ok], y=[r["samples_per_s"] for r in ok],
                                 mode="markers", name="trials end to end", marker={"color": "#2ca02c", "size": 8},
                                 text=[f"#{r['trial']} {r['config']}" for r in ok], hoverinfo="text+x+y"))
    rec = next((r for r in ok if r["trial"] == rec_n), None)
    if rec is not None:
        fig.add_trace(go.Scatter(x=[workers[rec["trial"]]], y=[rec["samples_per_s"]], mode="markers",
                                 name="recommended", text=[f"#{rec['trial']} {rec['config']}"],
                                 marker={"symbol": "star", "size": 16, "color": "rgba(0,0,0,0)",
                                         "line": {"width": 1, "color": "#000"}}))
    ranks = getattr(ceilings, "world_size", 1)
    fig.update_xaxes(title_text="DataLoader workers" + (f" per rank ({ranks} DDP ranks)" if ranks > 1 else ""),
                     rangemode="tozero")
    fig.update_yaxes(title_text="samples/s" + (", all ranks'" if ranks > 1 else ""), rangemode="tozero")
    fig.update_layout(title={"text": TITLE}, margin={"l": 60, "r": 30, "t": 60, "b": 50}, height=420,
                      template="plotly_white")
    return fig


def with_ceilings(figures: dict, titles: dict, rows: list[dict], study: Any, rec_n: int | None) -> dict:
    """Add the picture to the report's ``figures`` where the study measured its ceilings; returns ``titles``."""
    from autotune.search.record import ceilings
    from autotune.search.record.trials import config_of

    measured = ceilings.load(study)
    workers = {}
    for t in study.get_trials(deepcopy=False):
        c = config_of(t)
        if c is not None:
            workers[t.number] = c.num_workers
    fig = ceilings_figure(measured, rows, workers, rec_n)
    if fig is not None:
        figures[DIV], titles[DIV] = fig, TITLE
    return titles


def ceilings_summary(rec: Any) -> list[tuple[str, str]]:
    """The report summary's lines of a recommendation's ceilings: which binds, then the levers beyond the knobs."""
    c = getattr(rec, "ceilings", None) or {}
    if not c.get("verdict"):
        return []
    return [("ceilings", c["verdict"])] + [("lever", lever) for lever in c.get("levers") or ()]
