"""Plotly figures: τ per cycle with the block size over it (fallback changes annotated), the
session's replies over time, the τ histogram and per-position acceptance. Pure functions of a
``ReplyTrace`` or of ``SessionStore.session_stats`` output."""

from __future__ import annotations

import plotly.graph_objects as go

from .trace import ReplyTrace

ACCEPT = "#2e9e5b"
BONUS = "#2f6fd6"
REJECT = "#d04a4a"
BLOCK = "#8a63d2"
HEIGHT = 240


def _layout(fig: go.Figure, title: str, **kwargs) -> go.Figure:
    fig.update_layout(
        title={"text": title, "font": {"size": 13}}, height=HEIGHT, margin={"l": 40, "r": 40, "t": 36, "b": 32},
        template="plotly_white", legend={"orientation": "h", "y": -0.25, "font": {"size": 10}},
        uirevision="keep", **kwargs,
    )
    return fig


def acceptance_chart(trace: ReplyTrace | None) -> go.Figure:
    """τ per cycle (bars) with the block size drawn over it (line); fallback changes annotated."""
    trace = trace or ReplyTrace()
    cycles = list(range(1, trace.cycles + 1))
    fig = go.Figure()
    fig.add_bar(x=cycles, y=trace.taus, name="τ (tokens this cycle)", marker_color=ACCEPT,
                hovertemplate="cycle %{x}: τ %{y}<extra></extra>")
    fig.add_scatter(x=cycles, y=trace.block_sizes, name="block size", mode="lines", line={"color": BLOCK, "shape": "hv"},
                    hovertemplate="cycle %{x}: block %{y}<extra></extra>")
    for mark in trace.marks:
        fig.add_vline(x=mark.after_cycle + 0.5, line={"color": REJECT, "dash": "dot", "width": 1})
        fig.add_annotation(x=mark.after_cycle + 0.5, y=1.0, yref="paper", text=f"{mark.state} → {mark.next_block_size}",
                           hovertext=mark.reason, showarrow=False, font={"size": 9, "color": REJECT}, yanchor="bottom")
    upper = max([trace.max_block_size, *trace.taus, 1])
    return _layout(fig, "Acceptance per cycle (this reply)", xaxis_title="cycle",
                   yaxis={"range": [0, upper + 0.5], "title": "tokens"}, bargap=0.15)


def session_chart(stats: dict | None) -> go.Figure:
    """Mean τ and tokens/s per reply over the session."""
    replies = (stats or {}).get("replies") or []
    xs = list(range(1, len(replies) + 1))
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[r.get("mean_tau") for r in replies], name="mean τ", mode="lines+markers",
                    line={"color": ACCEPT})
    fig.add_scatter(x=xs, y=[r.get("tokens_per_s") for r in replies], name="tokens/s", mode="lines+markers",
                    line={"color": BONUS, "dash": "dash"}, yaxis="y2")
    return _layout(fig, "This session, reply by reply", xaxis={"title": "reply", "dtick": 1},
                   yaxis={"title": "mean τ", "rangemode": "tozero"},
                   yaxis2={"title": "tok/s", "overlaying": "y", "side": "right", "rangemode": "tozero"})


def tau_histogram(hist: dict) -> go.Figure:
    items = sorted((int(k), int(v)) for k, v in (hist or {}).items())
    fig = go.Figure()
    fig.add_bar(x=[k for k, _ in items], y=[v for _, v in items], marker_color=ACCEPT, name="cycles",
                hovertemplate="τ %{x}: %{y} cycles<extra></extra>")
    return _layout(fig, "τ histogram", xaxis={"title": "τ", "dtick": 1}, yaxis_title="cycles")


def position_chart(rates: list) -> go.Figure:
    fig = go.Figure()
    fig.add_bar(x=list(range(1, len(rates or []) + 1)), y=list(rates or []), marker_color=BONUS, name="acceptance",
                hovertemplate="slot %{x}: %{y:.0%}<extra></extra>")
    return _layout(fig, "Acceptance by slot in the block", xaxis={"title": "slot", "dtick": 1},
                   yaxis={"title": "P(accepted)", "range": [0, 1.05], "tickformat": ".0%"})
