"""A reasoning model's reasoning on the page: its own collapsible block above the answer (in the
chat and in the token view), never part of the code block or the code colouring, and τ and
draft acceptance split between reasoning and answer.

The token view's block holds the reasoning tokens coloured by origin like every other token
(``ui.chat.render`` draws them with no syntax classes); the chat's block is the plain text, which
comes here escaped (``ui.chat.render.esc``).
"""

from __future__ import annotations

from engine.acceptance import AcceptanceCounts

from .trace import ReplyTrace

PARTS = ("reasoning", "answer")


def chat_reasoning_block(escaped: str, streaming: bool = False) -> str:
    """The chat bubble's block above the answer, holding the ``escaped`` reasoning (open while
    the reasoning streams)."""
    state = " open" if streaming else ""
    return (f'<details class="chat-reasoning" data-part="reasoning"{state}><summary>Reasoning</summary>'
            f'<div class="chat-reasoning-body">{escaped}</div></details>\n\n')


def token_view_reasoning(inner_html: str, tokens: int) -> str:
    """The token view's block that holds the reasoning tokens' spans."""
    return (f'<details class="tv-reasoning" data-part="reasoning" open><summary>Reasoning · {tokens} tokens '
            f'(not part of the answer: no code colours)</summary><div class="tv-reasoning-body">{inner_html}</div>'
            f'</details>')


def split_figures(counts: AcceptanceCounts) -> tuple[float | None, float | None]:
    """(mean τ, draft acceptance rate) of some cycles; None where there were none."""
    if not counts.cycles:
        return None, None
    tau = sum(k * v for k, v in counts.tau_histogram.items()) / counts.cycles
    drafted = sum(counts.position_drafted)
    return tau, (sum(counts.position_accepted) / drafted if drafted else None)


def split_line(trace: ReplyTrace) -> str:
    """"τ reasoning 2.10 · answer 3.40; drafts accepted: reasoning 31% · answer 52%", or "" for a
    reply without reasoning. A cycle counts for the part its first token belongs to."""
    if not trace.reasoning_tokens:
        return ""
    figures = {part: split_figures(trace.acceptance_counts_of(part)) for part in PARTS}
    fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    taus = " · ".join(f"{part} {fmt(figures[part][0], '.2f')}" for part in PARTS)
    rates = " · ".join(f"{part} {fmt(figures[part][1], '.0%')}" for part in PARTS)
    return f"τ {taus}; drafts accepted: {rates} ({trace.reasoning_tokens} reasoning tokens)"



def analytics_parts_html(by_part: dict) -> str:
    """Session analytics' line for a reasoning model: mean τ and draft acceptance of the cycles
    in the reasoning and in the answer ("" when the session has no reasoning)."""
    if not by_part.get("reasoning") or not by_part["reasoning"].cycles:
        return ""
    cells = []
    for part in PARTS:
        f = by_part[part]
        if f.cycles:
            cells.append(f'<span data-part="{part}">in the {part}: <b>{f.mean_tau:.2f}</b> mean τ over {f.cycles} '
                         f'cycle{"s" * (f.cycles != 1)} ({f.acceptance_rate or 0:.0%} of drafts accepted)</span>')
    return (f'<p id="analytics-parts" style="font-size:13px">Reasoning and answer apart (a cycle counts where its '
            f'first token is): {" · ".join(cells)}</p>')
