"""Plotly charts: τ per cycle with the block size over it (fallback changes annotated), the
session's replies over time, the τ histogram and per-position acceptance.

Pure functions of a ``ReplyTrace`` or of ``SessionStore.session_stats`` output that return plain
Plotly figure dicts (``{"data": [...], "layout": {...}}``), drawn by plotly.js in the page.
Plain dicts, not ``plotly.graph_objects``: building validated figure objects costs 30-120 ms
each, too slow to redraw while a reply streams on a busy CPU. ``plot`` wraps one for ``gr.Plot``.
"""

from __future__ import annotations

import json

from gradio.components.plot import PlotData

from .trace import ReplyTrace

ACCEPT = "#2e9e5b"
BONUS = "#2f6fd6"
REJECT = "#d04a4a"
BLOCK = "#8a63d2"
GRID = "#e8e8ee"
HEIGHT = 240


def plot(figure: dict) -> PlotData:
    """What ``gr.Plot`` sends to the page for a figure dict."""
    return PlotData(type="plotly", plot=json.dumps(figure, ensure_ascii=False))


def figure_layout(title: str, xaxis: dict, yaxis: dict, height: int = HEIGHT, **extra) -> dict:
    """The one chart style of the app (these charts, the Teach tab's analytics and comparison)."""
    axis = {"gridcolor": GRID, "zerolinecolor": GRID, "automargin": True}
    return {
        "title": {"text": title, "font": {"size": 13}, "x": 0.02}, "height": height,
        "margin": {"l": 44, "r": 44, "t": 36, "b": 44}, "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "#ffffff",
        "font": {"size": 11}, "legend": {"orientation": "h", "y": -0.42, "font": {"size": 10}},
        "uirevision": "keep", "xaxis": {**axis, **xaxis}, "yaxis": {**axis, **yaxis}, **extra,
    }


def acceptance_chart(trace: ReplyTrace | None) -> dict:
    """τ per cycle (bars) with the block size drawn over it (line); fallback changes annotated."""
    trace = trace or ReplyTrace()
    cycles = list(range(1, trace.cycles + 1))
    data = [
        {"type": "bar", "x": cycles, "y": list(trace.taus), "name": "τ (tokens this cycle)",
         "marker": {"color": ACCEPT}, "hovertemplate": "cycle %{x}: τ %{y}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "x": cycles, "y": list(trace.block_sizes), "name": "block size",
         "line": {"color": BLOCK, "shape": "hv"}, "hovertemplate": "cycle %{x}: block %{y}<extra></extra>"},
    ]
    shapes, annotations = [], []
    labelled = labelled_marks([m.after_cycle + 0.5 for m in trace.marks], trace.cycles)
    for mark in trace.marks:
        x = mark.after_cycle + 0.5
        shapes.append({"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "yref": "paper",
                       "line": {"color": REJECT, "dash": "dot", "width": 1}})
        if x in labelled:
            annotations.append({"x": x, "y": 1, "yref": "paper", "text": f"{mark.state} → {mark.next_block_size}",
                                "hovertext": mark.reason, "showarrow": False, "yanchor": "bottom",
                                "font": {"size": 9, "color": REJECT}})
    upper = max([trace.max_block_size, *trace.taus, 1])
    if trace.marks:  # every change on hover, labelled or not
        data.append({"type": "scatter", "mode": "markers", "x": [m.after_cycle + 0.5 for m in trace.marks],
                     "y": [upper + 0.25] * len(trace.marks), "name": "fallback change", "showlegend": False,
                     "marker": {"color": REJECT, "size": 6, "symbol": "triangle-down"},
                     "text": [f"{m.state} → block {m.next_block_size}: {m.reason}" for m in trace.marks],
                     "hovertemplate": "after cycle %{x:.0f}: %{text}<extra></extra>"})
    return {"data": data, "layout": figure_layout(
        "Acceptance per cycle (this reply)", {"title": {"text": "cycle"}}, {"title": {"text": "tokens"}, "range": [0, upper + 0.5]},
        bargap=0.15, shapes=shapes, annotations=annotations)}


LABEL_SHARE = 0.16  # a fallback label ("reduced → 4") is about this share of the chart's width


def labelled_marks(xs: list[float], cycles: int) -> set[float]:
    """The fallback changes that get a label: each at least a label's width after the last one
    labelled (the others show on hover), so that labels never pile on top of each other."""
    gap = max(1.0, LABEL_SHARE * max(cycles, 1))
    chosen, last = set(), None
    for x in sorted(xs):
        if last is None or x - last >= gap:
            chosen.add(x)
            last = x
    return chosen


def session_chart(stats: dict | None) -> dict:
    """Mean τ and tokens/s per reply over the session."""
    replies = (stats or {}).get("replies") or []
    xs = list(range(1, len(replies) + 1))
    data = [
        {"type": "scatter", "mode": "lines+markers", "x": xs, "y": [r.get("mean_tau") for r in replies],
         "name": "mean τ", "line": {"color": ACCEPT}},
        {"type": "scatter", "mode": "lines+markers", "x": xs, "y": [r.get("tokens_per_s") for r in replies],
         "name": "tokens/s", "line": {"color": BONUS, "dash": "dash"}, "yaxis": "y2"},
    ]
    return {"data": data, "layout": figure_layout(
        "This session, reply by reply", {"title": {"text": "reply"}, "dtick": 1},
        {"title": {"text": "mean τ"}, "rangemode": "tozero"},
        yaxis2={"title": {"text": "tok/s"}, "overlaying": "y", "side": "right", "rangemode": "tozero", "showgrid": False})}


def tau_histogram(hist: dict) -> dict:
    items = sorted((int(k), int(v)) for k, v in (hist or {}).items())
    data = [{"type": "bar", "x": [k for k, _ in items], "y": [v for _, v in items], "name": "cycles",
             "marker": {"color": ACCEPT}, "hovertemplate": "τ %{x}: %{y} cycles<extra></extra>"}]
    return {"data": data, "layout": figure_layout("τ histogram", {"title": {"text": "τ"}, "dtick": 1},
                                            {"title": {"text": "cycles"}})}


def position_chart(rates: list) -> dict:
    rates = list(rates or [])
    data = [{"type": "bar", "x": list(range(1, len(rates) + 1)), "y": rates, "name": "acceptance",
             "marker": {"color": BONUS}, "hovertemplate": "slot %{x}: %{y:.0%}<extra></extra>"}]
    return {"data": data, "layout": figure_layout("Acceptance by slot in the block", {"title": {"text": "slot"}, "dtick": 1},
                                            {"title": {"text": "P(accepted)"}, "range": [0, 1.05], "tickformat": ".0%"})}
