"""Session analytics: τ per reply over time, the τ histogram and per-position acceptance, split
by kind of reply (code vs prose, detected from its text), a table of replies with their figures,
and exports (CSV for the figures, PNG for the charts).

Computed in Python from ``SessionStore.get_messages`` and ``session_cycle_series`` (block size,
accepted and τ per cycle), so that the numbers can be checked against SQL in the tests. Each chart
is defined once, as a Plotly figure dict like every chart of the app (``ui.chat.charts``): plotly.js
draws it in the page, and the export writes the same figure to PNG the way Plotly does, with
kaleido driving a local Chrome or Chromium (offline; about 9 s for the four charts on a busy
2-core CPU, one browser start for all of them).
"""

from __future__ import annotations

import csv
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from engine.acceptance import AcceptanceCounts
from storage.records import number_replies

from ..chat import charts
from ..chat.render import bare_code, code_share, fenced_blocks, looks_like_code_line
from .steps import first_text
from .token_classes import CLASSES, LABELS, ClassCounts, reply_token_classes

KINDS = ("code", "prose")
KIND_COLORS = {"code": "#2e9e5b", "prose": "#d08a2e", "all": "#2f6fd6"}
TOKEN_CLASS_COLORS = {"whitespace": "#9aa5b1", "keyword": "#7a3fc0", "name": "#2f6fd6", "operator": "#555555",
                      "string": "#2e9e5b", "number": "#c7651c", "comment": "#8a8a2e", "prose": "#d08a2e"}
CODE_SHARE = 0.5  # a reply is code when at least half of its text is code


# ---------------------------------------------------------------------------- kind of reply


def code_mask(text: str, mode: str = "chat", loose: bool = False) -> list[bool]:
    """Per character: inside a fenced code block (the fence lines included)? All of a
    Complete-mode reply is code. With ``loose``, lines outside fences that look like code count
    too (a small model often answers with bare code), and so do blank lines between them."""
    if mode == "complete":
        return [True] * len(text)
    mask = [False] * len(text)
    for block in fenced_blocks(text):
        mask[block.start:block.end] = [True] * (block.end - block.start)
    if loose:
        _mark_loose_code_lines(text, mask)
    return mask


def _mark_loose_code_lines(text: str, mask: list[bool]) -> None:
    lines, pos = [], 0
    for line in text.splitlines(keepends=True):
        lines.append((pos, line))
        pos += len(line)
    verdicts = []  # per line: True (code), False (prose) or None (blank: decided by its neighbours)
    for start, line in lines:
        if line and mask[start]:  # fenced already
            verdicts.append(True)
        elif not line.strip():
            verdicts.append(None)
        else:
            verdicts.append(looks_like_code_line(line))
    for n, ((start, line), verdict) in enumerate(zip(lines, verdicts)):
        if verdict is None:
            before = next((v for v in reversed(verdicts[:n]) if v is not None), False)
            after = next((v for v in verdicts[n + 1:] if v is not None), False)
            verdict = before and after
        if verdict:
            mask[start:start + len(line)] = [True] * len(line)


def cycle_regions(content: str, cycles: list[dict], mode: str = "chat") -> list[str]:
    """Where each cycle's tokens landed: "code" (mostly in code: fenced, or lines that read as
    code, or anywhere in a reply that is bare code) or "prose"."""
    mask = code_mask(content, "complete" if mode == "complete" or bare_code(content) else mode, loose=True)
    pos = len(first_text(content, cycles))
    regions, last = [], "prose"
    for cycle in cycles:
        pieces = cycle.get("emitted_pieces") or ()
        parts = cycle.get("emitted_parts") or ["answer"] * len(pieces)
        length = len("".join(p for p, part in zip(pieces, parts) if part == "answer"))  # the content is the answer
        span = mask[pos:pos + length]
        if span:
            last = "code" if 2 * sum(span) >= len(span) else "prose"
        regions.append(last)  # an empty piece (half a character) stays where the text was
        pos += length
    return regions


def reply_kind(text: str, mode: str = "chat") -> str:
    """"code" or "prose". A Complete-mode reply continues code, so it is code."""
    if mode == "complete":
        return "code"
    return "code" if bare_code(text or "") or code_share(text or "") >= CODE_SHARE else "prose"


# ---------------------------------------------------------------------------- figures


@dataclass
class Figures(AcceptanceCounts):
    """Aggregates over a set of cycles (block size, accepted, τ): the per-slot and τ counts of
    ``engine.acceptance`` plus the totals behind mean τ and the acceptance rate."""

    tokens: int = 0  # Σ τ
    accepted: int = 0  # Σ accepted
    drafted: int = 0  # Σ (block size - 1)

    def add(self, block_size: int, accepted: int, tau: int) -> None:
        super().add(block_size, accepted, tau)
        self.tokens += tau
        self.accepted += accepted
        self.drafted += block_size - 1

    @property
    def mean_tau(self) -> float | None:
        return self.tokens / self.cycles if self.cycles else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def max_block_size(self) -> int | None:
        return len(self.position_drafted) + 1 if self.cycles else None



@dataclass
class ReplyFigures:
    message_id: int
    seq: int
    created_at: str
    mode: str  # the message kind: chat | complete
    kind: str  # code | prose
    status: str
    model: str
    new_tokens: int | None
    tokens_per_s: float | None
    code_share: float
    preview: str
    figures: Figures
    number: int = 0  # 1, 2, 3 … among the session's replies (what the table and charts show)


@dataclass
class SessionAnalytics:
    session_id: int
    title: str
    replies: list[ReplyFigures]
    by_kind: dict[str, Figures]  # "code", "prose", "all": by kind of reply
    by_region: dict[str, Figures] = field(default_factory=dict)  # "code", "prose": by where each cycle landed
    by_token_class: ClassCounts = field(default_factory=ClassCounts)  # which kinds of token the draft wrote
    # "reasoning", "answer": a reasoning model's cycles by the part their first token is in
    by_part: dict[str, Figures] = field(default_factory=lambda: {"reasoning": Figures(), "answer": Figures()})


def session_analytics(store, session_id: int) -> SessionAnalytics:
    session = store.get_session(session_id)
    by_kind = {"code": Figures(), "prose": Figures(), "all": Figures()}
    by_region = {"code": Figures(), "prose": Figures()}
    token_classes = ClassCounts()
    by_part = {"reasoning": Figures(), "answer": Figures()}
    replies = []
    messages = store.get_messages(session_id)
    numbers = number_replies(messages)  # as the share page, `sessions show` and Teach's menu number them
    for message in messages:
        if message["id"] not in numbers:
            continue
        text = message["content"] or ""
        share = 1.0 if message["kind"] == "complete" else code_share(text)
        kind = reply_kind(text, message["kind"])
        figures = Figures()
        cycles = store.get_cycles(message["id"])
        for row, region in zip(cycles, cycle_regions(text, cycles, message["kind"])):
            part = (row.get("emitted_parts") or ["answer"])[0]
            for target in (figures, by_kind[kind], by_kind["all"], by_region[region], by_part[part]):
                target.add(int(row["block_size"]), int(row["accepted"]), int(row["tau"]))
        token_classes.merge(reply_token_classes(text, cycles, code_mask(text, message["kind"], loose=True),
                                                message["kind"]))
        replies.append(ReplyFigures(
            message_id=message["id"], seq=message["seq"], created_at=message["created_at"], mode=message["kind"],
            kind=kind, status=message["status"], model=message["model"], new_tokens=message["new_tokens"],
            tokens_per_s=message["tokens_per_s"], code_share=share,
            preview=" ".join(text.split())[:60], figures=figures, number=numbers[message["id"]],
        ))
    return SessionAnalytics(session_id, session["title"], replies, by_kind, by_region, token_classes, by_part)


# ---------------------------------------------------------------------------- table and CSV

TABLE_HEADERS = ["reply", "kind", "mode", "status", "tokens", "cycles", "mean τ", "acceptance", "tok/s",
                 "max block", "created", "text"]
REPLY_COLUMNS = ["message_id", "reply", "created_at", "kind", "mode", "status", "model", "new_tokens", "tokens_per_s",
                 "code_share"]
FIGURE_COLUMNS = ["cycles", "cycle_tokens", "mean_tau", "acceptance_rate", "max_block_size"]
SUMMARY_COLUMNS = ["kind", "replies"]


def _round(value: float | None, digits: int = 3):
    return None if value is None else round(value, digits)


def table_rows(analytics: SessionAnalytics) -> list[list]:
    rows = []
    for r in analytics.replies:
        f = r.figures
        rows.append([
            r.number, r.kind, r.mode, r.status, r.new_tokens, f.cycles, _round(f.mean_tau, 2),
            None if f.acceptance_rate is None else f"{f.acceptance_rate:.0%}", _round(r.tokens_per_s, 1),
            f.max_block_size, (r.created_at or "")[:19].replace("T", " "), r.preview,
        ])
    return rows


def _number(value, spec: str = ".4f") -> str:
    return "" if value is None else format(value, spec)


def _figure_cells(f: Figures, slots: int, taus: int) -> list:
    rates = f.per_position_acceptance
    return ([f.cycles, f.tokens, _number(f.mean_tau), _number(f.acceptance_rate), f.max_block_size or ""]
            + [_number(rates[j]) if j < len(rates) else "" for j in range(slots)]
            + [f.tau_histogram.get(t, 0) for t in range(1, taus + 1)])


def _shape(analytics: SessionAnalytics) -> tuple[int, int]:
    everything = analytics.by_kind["all"]
    return len(everything.position_drafted), max(everything.tau_histogram, default=0)


def _figure_headers(slots: int, taus: int) -> list[str]:
    return (FIGURE_COLUMNS + [f"accepted_at_slot_{j}" for j in range(1, slots + 1)]
            + [f"cycles_with_tau_{t}" for t in range(1, taus + 1)])


def _csv(rows: list[list]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def replies_csv(analytics: SessionAnalytics) -> str:
    """One row per reply: its fields, figures, acceptance per slot and τ histogram (one column each)."""
    slots, taus = _shape(analytics)
    rows = [REPLY_COLUMNS + _figure_headers(slots, taus)]
    for r in analytics.replies:
        rows.append([r.message_id, r.number, r.created_at, r.kind, r.mode, r.status, r.model,
                     "" if r.new_tokens is None else r.new_tokens, _number(r.tokens_per_s, ".3f"),
                     f"{r.code_share:.3f}"] + _figure_cells(r.figures, slots, taus))
    return _csv(rows)


def summary_csv(analytics: SessionAnalytics) -> str:
    """One row per kind of reply (code, prose, all), then the cycles by where they landed (inside
    code fences or not, whatever the reply's kind), with the same figures."""
    slots, taus = _shape(analytics)
    rows = [SUMMARY_COLUMNS + _figure_headers(slots, taus)]
    for kind in ("code", "prose", "all"):
        count = sum(1 for r in analytics.replies if kind == "all" or r.kind == kind)
        rows.append([kind, count] + _figure_cells(analytics.by_kind[kind], slots, taus))
    for region, figures in analytics.by_region.items():
        rows.append([f"cycles in {region}", ""] + _figure_cells(figures, slots, taus))
    if analytics.by_part["reasoning"].cycles:  # a reasoning model's: its reasoning and its answer apart
        for part, figures in analytics.by_part.items():
            rows.append([f"cycles in {part}", ""] + _figure_cells(figures, slots, taus))
    return _csv(rows)


def token_classes_csv(analytics: SessionAnalytics) -> str:
    """Per kind of token: how many the replies hold, how many came from accepted drafts, the share."""
    counts = analytics.by_token_class
    rows = [["token_class", "label", "tokens", "from_draft", "draft_share"]]
    for cls in CLASSES:
        rows.append([cls, LABELS[cls], counts.total[cls], counts.drafted[cls], _number(counts.share(cls))])
    return _csv(rows)


# ---------------------------------------------------------------------------- charts (plotly)

HEIGHT = 260


def _layout(title: str, xaxis: dict | None = None, yaxis: dict | None = None, **extra) -> dict:
    return charts.figure_layout(title, xaxis or {}, yaxis or {}, height=HEIGHT, **extra)


def _kinds_present(analytics: SessionAnalytics) -> list[str]:
    return [k for k in KINDS if analytics.by_kind[k].cycles]


def tau_over_time_chart(analytics: SessionAnalytics) -> dict:
    data = []
    for kind in KINDS:
        replies = [r for r in analytics.replies if r.kind == kind and r.figures.cycles]
        if not replies:
            continue
        data.append({"type": "scatter", "x": [r.number for r in replies], "y": [r.figures.mean_tau for r in replies],
                     "mode": "markers", "name": f"{kind} replies", "marker": {"color": KIND_COLORS[kind], "size": 9},
                     "text": [f"reply #{r.number} ({(r.created_at or '')[:16].replace('T', ' ')}): "
                              f"{r.figures.cycles} cycles" for r in replies],
                     "hovertemplate": "%{text}<br>mean τ %{y:.2f}<extra></extra>"})
    measured = [r for r in analytics.replies if r.figures.cycles]
    if len(measured) > 1:
        data.append({"type": "scatter", "x": [r.number for r in measured], "y": [r.figures.mean_tau for r in measured],
                     "mode": "lines", "name": "all replies", "line": {"color": "#999", "width": 1}, "hoverinfo": "skip"})
    # Replies in order (1, 2, 3 …), not timestamps: replies seconds apart made the time labels overlap.
    return {"data": data, "layout": _layout("Mean τ per reply over time",
                                            {"title": {"text": "reply (in order)"}, "tickformat": "d",
                                             "dtick": max(1, len(measured) // 10)},
                                            {"title": {"text": "mean τ"}, "rangemode": "tozero"})}


def tau_histogram_chart(analytics: SessionAnalytics) -> dict:
    taus = sorted(analytics.by_kind["all"].tau_histogram)
    data = []
    for kind in _kinds_present(analytics) or ["all"]:
        hist = analytics.by_kind[kind].tau_histogram
        data.append({"type": "bar", "x": taus, "y": [hist.get(t, 0) for t in taus], "name": kind,
                     "marker": {"color": KIND_COLORS[kind]},
                     "hovertemplate": f"{kind}: τ %{{x}} in %{{y}} cycles<extra></extra>"})
    return {"data": data, "layout": _layout("τ histogram (cycles)", {"title": {"text": "τ"}, "dtick": 1},
                                            {"title": {"text": "cycles"}}, barmode="group")}


def position_chart(analytics: SessionAnalytics) -> dict:
    data = []
    for kind in [*_kinds_present(analytics), "all"]:
        rates = analytics.by_kind[kind].per_position_acceptance
        if not rates:
            continue
        data.append({"type": "scatter", "x": list(range(1, len(rates) + 1)), "y": rates, "mode": "lines+markers",
                     "name": kind, "line": {"color": KIND_COLORS[kind], "dash": "dot" if kind == "all" else "solid"},
                     "hovertemplate": f"{kind}: slot %{{x}} accepted %{{y:.0%}}<extra></extra>"})
    return {"data": data, "layout": _layout("Acceptance by slot in the block", {"title": {"text": "slot"}, "dtick": 1},
                                            {"title": {"text": "P(accepted)"}, "range": [0, 1.05], "tickformat": ".0%"})}


def token_class_chart(analytics: SessionAnalytics) -> dict:
    counts = analytics.by_token_class
    present = counts.present()
    data = [{"type": "bar", "x": [LABELS[c] for c in present], "y": [counts.share(c) for c in present],
             "marker": {"color": [TOKEN_CLASS_COLORS[c] for c in present]},
             "text": [f"{counts.drafted[c]}/{counts.total[c]}" for c in present], "textposition": "outside",
             "hovertemplate": "%{x}: %{y:.0%} of the tokens came from accepted drafts (%{text})<extra></extra>"}]
    return {"data": data, "layout": _layout("Which tokens the draft wrote (share from accepted drafts)",
                                            yaxis={"title": {"text": "from the draft"}, "range": [0, 1.1],
                                                   "tickformat": ".0%"})}


# ---------------------------------------------------------------------------- PNG export (kaleido)

PNG_SIZE = (900, 480)


class ChartExportError(Exception):
    """The PNG charts could not be written (no Chrome or Chromium for kaleido to drive)."""


def chart_figures(analytics: SessionAnalytics) -> dict[str, dict]:
    """The four charts the page shows, by export file name."""
    return {"tau-per-reply.png": tau_over_time_chart(analytics), "tau-histogram.png": tau_histogram_chart(analytics),
            "acceptance-by-slot.png": position_chart(analytics),
            "drafted-by-token-class.png": token_class_chart(analytics)}


def write_png_charts(figures: dict[str, dict], paths: list[Path]) -> None:
    """Each figure as a PNG file, as Plotly exports it: kaleido renders them in one local Chrome or
    Chromium. Called directly rather than through ``plotly.io.write_images``, which drops a figure
    that failed to render without a word; here a figure missing after a second try is an error."""
    try:
        import kaleido
        from kaleido.errors import BrowserFailedError, ChromeNotFoundError
    except ImportError:
        raise ChartExportError("the PNG charts need kaleido (Plotly's exporter), which dflash-studio installs: "
                               "install the project again (pip install -e .) or pip install kaleido") from None

    width, height = PNG_SIZE
    specs = [{"fig": {**figure, "layout": {**figure["layout"], "height": height, "paper_bgcolor": "white"}},
              "path": path, "opts": {"format": "png", "width": width, "height": height}}
             for figure, path in zip(figures.values(), paths)]
    errors: tuple = ()
    for _ in range(2):
        specs = [spec for spec in specs if not spec["path"].exists()]
        if not specs:
            return
        try:
            errors = kaleido.write_fig_from_object_sync(specs) or ()
        except (ChromeNotFoundError, BrowserFailedError) as exc:
            raise ChartExportError(
                "the PNG charts need Chrome or Chromium, which Plotly's exporter (kaleido) drives: install one "
                f"(or run plotly_get_chrome) and export again ({type(exc).__name__})") from None
    unwritten = [spec["path"].name for spec in specs if not spec["path"].exists()]
    if unwritten:
        raise ChartExportError(f"{', '.join(unwritten)} could not be drawn ({'; '.join(map(str, errors))[:300]})")


def export_files(analytics: SessionAnalytics, folder: Path | None = None) -> list[str]:
    """Write the CSVs (replies, summary by kind, token classes) and the PNG charts into a folder;
    return their paths. Raises ChartExportError (naming the folder, where the CSVs are) when the
    charts cannot be drawn."""
    folder = Path(folder or tempfile.mkdtemp(prefix="dflash-analytics-"))
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"session-{analytics.session_id}"
    tables = {"replies.csv": replies_csv(analytics), "summary.csv": summary_csv(analytics),
              "token-classes.csv": token_classes_csv(analytics)}
    paths = []
    for name, text in tables.items():
        paths.append(folder / f"{stem}-{name}")
        paths[-1].write_text(text, encoding="utf-8")
    figures = chart_figures(analytics)
    charts_at = [folder / f"{stem}-{name}" for name in figures]
    try:
        write_png_charts(figures, charts_at)
    except ChartExportError as exc:
        raise ChartExportError(f"The CSV files are in {folder}; {exc}") from None
    return [str(path) for path in paths + charts_at]
